"""chat/tools/testing/baselines.py: the stock transformers model of a text spec and its greedy ``generate``, what the
engine's tests compare against, checked here against a greedy loop of the model's own forward; the copy-on-write probe.
The multimodal baselines (``hf_inputs``, ``load_stock_media``, ``hf_generate_media``) are the references of
tests/chat/models' multimodal tests (test_multimodal.py, test_qwen3vl.py), which fail when they are wrong."""

from types import SimpleNamespace

import pytest
import torch

from chat.tools.testing.baselines import buffer_copies, hf_generate, load_stock, save_stock


@pytest.fixture(scope="module")
def stock():
    torch.manual_seed(0)
    return load_stock("tiny-llama")


def test_the_stock_model_is_transformers_own_in_eval_mode_with_its_eos_ids(stock):
    assert type(stock.model).__module__.startswith("transformers.") and not stock.model.training
    assert stock.eos_token_ids and stock.device == torch.device("cpu")
    prompt = stock.render([{"role": "user", "content": "Hi"}])
    assert prompt and all(isinstance(t, int) for t in prompt)


def test_generate_is_the_greedy_continuation_of_the_prompt(stock):
    prompt = stock.render([{"role": "user", "content": "Count with me: one, two"}])
    got = hf_generate(stock, prompt, 6)
    ids, expected = list(prompt), []
    with torch.inference_mode():
        for _ in range(6):
            token = int(stock.model(torch.tensor([ids])).logits[0, -1].argmax())
            expected.append(token)
            ids.append(token)
            if token in stock.eos_token_ids:
                break
    assert got == expected and 0 < len(got) <= 6


def test_a_saved_stock_model_loads_back_with_the_same_weights(stock, tmp_path):
    from transformers import AutoModelForCausalLM

    save_stock("tiny-llama", tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True)
    mine, theirs = stock.model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert (tmp_path / "tokenizer_config.json").exists()


def test_buffer_copies_adds_up_the_copies_of_every_attention_layer_and_skips_the_others():
    rows = [SimpleNamespace(copies=2), None, SimpleNamespace(copies=3)]
    assert buffer_copies(None, SimpleNamespace(state=rows)) == 5  # the own decoder: a list of row buffers
    layers = [SimpleNamespace(rows=row) for row in rows] + [SimpleNamespace()]  # a recurrent layer has no rows
    assert buffer_copies(None, SimpleNamespace(state=SimpleNamespace(layers=layers))) == 5
