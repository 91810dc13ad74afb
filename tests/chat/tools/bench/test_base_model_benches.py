"""Benchmarks and base models: ``bench weights`` decodes a base model's reply from a completion prompt (it has no
chat template to render one), and the chat benchmarks that run on the engine alone take ``--chat-template``."""

from __future__ import annotations

import importlib

import pytest
import torch

from chat.cli import main
from chat.models import load_model
from chat.tools.bench.weights_bench import decode_speed

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_bench_weights_decodes_a_base_models_reply():
    torch.set_num_threads(1)
    assert decode_speed(load_model("tiny-base")) > 0


class Loaded(Exception):
    """Raised by a stand-in for a benchmark's run: the runtime it was given."""

    def __init__(self, runtime) -> None:
        super().__init__("loaded")
        self.runtime = runtime


@pytest.mark.parametrize("bench", ["serve", "load", "multiturn", "http"])
def test_the_chat_benchmarks_take_a_chat_template(bench, monkeypatch):
    module = importlib.import_module(f"chat.tools.bench.{bench}_bench")

    def stand_in(runtime, *args, **kwargs):
        raise Loaded(runtime)

    monkeypatch.setattr(module, "run_on", stand_in)
    with pytest.raises(Loaded) as given:
        main(["bench", bench, "--model", "tiny-base", "--chat-template", CHATML])
    assert given.value.runtime.chats and given.value.runtime.render([{"role": "user", "content": "hi"}])
    with pytest.raises(Loaded) as plain:
        main(["bench", bench, "--model", "tiny-base"])
    assert not plain.value.runtime.chats
