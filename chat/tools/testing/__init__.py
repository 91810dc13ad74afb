"""Test scaffolding, kept out of the serving path: tiny seeded models of every cache kind (``tiny``, ``tiny_mm``,
``tiny_tokenizer`` and its committed ``assets``; ``turncache serve --model tiny-<name>`` loads them from here) and
stock transformers baselines for tests and benchmarks (``baselines``: ``generate``, a multimodal prompt as
transformers takes it, a copy-on-write probe)."""
