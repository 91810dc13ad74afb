"""The small tokenizer of the tiny test models, committed under ``chat/models/tiny/assets/tiny_tokenizer/``.

A byte-level BPE with :data:`VOCAB_SIZE` tokens (every byte, so any text round-trips) trained on :data:`TEXT`, with
ChatML special tokens and chat template. Regenerate the committed files with::

    .venv/bin/python -m chat.models.tiny.tokenizer

Training is deterministic for a given ``tokenizers`` version; the files are committed so that tiny models do not
depend on it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ASSET_DIR = Path(__file__).parent / "assets" / "tiny_tokenizer"
VOCAB_SIZE = 384
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEXT = """\
You are a helpful assistant. The user asks a question and the assistant answers it.
What is the capital of France? The capital of France is Paris. What is the weather like today?
The cat sat on a mat while two dogs ran far away from home and never came back again.
Please answer in detail, with examples, and explain each step carefully so that a curious student
who has never read about it before can follow along easily. Also mention one surprising fact.
Tell me about the history of the printing press, how bridges carry load, why the sky is blue,
how vaccines work, the rules of chess, how a compiler works, what causes tides, how bees make honey,
how batteries store energy, and why cats purr. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.
Unicode: café, naïve, über, ñandú, 東京, Привет, 🙂.
"""


def build(out_dir: Path = ASSET_DIR) -> Path:
    """Train the tokenizer and write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ASSET_DIR))
