"""Test and benchmark scaffolding, kept out of the serving path: stock transformers baselines (``baselines``:
a text model's stock copy and ``generate``, a multimodal prompt as transformers takes it, a copy-on-write probe), and
LoRA adapters made with peft (``peft_adapters``). The tiny seeded models themselves live in :mod:`chat.models.tiny`
(``--model tiny-<name>`` loads them)."""
