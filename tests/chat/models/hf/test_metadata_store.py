"""chat.models.hf.metadata_store: a GGUF file's config and tokenizer, as transformers built them from its metadata,
kept by the file's sha256 on disk and recalled by a later process without parsing the metadata again; every recall a
fresh pair; an unreadable entry or one of another transformers parsed again; the family checked on every recall; a
home that cannot be written costs only the parse."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from transformers import modeling_gguf_pytorch_utils as reader

from chat.models import UnsupportedArchitectureError, gguf_files, load_model
from chat.models.hf import gguf_model, metadata_store
from tests.chat.models.gguf_helpers import reference_llama, write_tiny_gguf

MESSAGES = [{"role": "user", "content": "What is the capital of France? Tell me about bees and honey."}]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    torch.set_num_threads(1)
    return write_tiny_gguf(tmp_path_factory.mktemp("store") / "tiny-llama-q8.gguf", reference_llama(), qtype="Q8_0")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Each test: a fresh $TURNCACHE_HOME, and nothing held in memory (as in a new process)."""
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path / "home"))
    metadata_store.forget_in_memory()
    yield tmp_path / "home"
    metadata_store.forget_in_memory()


@pytest.fixture
def parses(monkeypatch):
    """The metadata reads transformers makes (each a parse of the whole metadata)."""
    original, reads = reader.load_gguf_checkpoint, []

    def counted(path, return_tensors=False, **kwargs):
        if not return_tensors:
            reads.append(str(path))
        return original(path, return_tensors, **kwargs)

    monkeypatch.setattr(reader, "load_gguf_checkpoint", counted)
    return reads


def entry(path) -> object:
    return metadata_store.entry_path(gguf_files.identify(path).sha256)


def test_a_later_process_recalls_the_pair_without_parsing_and_serves_the_same_model(path, parses):
    first = load_model(str(path), weights="float32")
    assert len(parses) == 1 and entry(path).is_file()
    metadata_store.forget_in_memory()  # a new process: only the disk's entry
    again = load_model(str(path), weights="float32")
    assert len(parses) == 1  # recalled, not parsed
    assert again.fingerprint == first.fingerprint and again.render(MESSAGES) == first.render(MESSAGES)
    assert again._tokenizer.get_vocab() == first._tokenizer.get_vocab()
    assert again.eos_token_ids == first.eos_token_ids and again.context_window == first.context_window


def test_each_recall_is_a_fresh_pair_that_a_template_given_to_one_load_does_not_change(path):
    own = load_model(str(path), weights="float32")
    given = load_model(str(path), weights="float32", chat_template="{{ messages[0]['content'] }}")
    plain = load_model(str(path), weights="float32")
    assert given.render(MESSAGES) != own.render(MESSAGES)
    assert plain.render(MESSAGES) == own.render(MESSAGES) and plain.fingerprint == own.fingerprint
    one, other = (
        metadata_store.recall(gguf_files.identify(path).sha256),
        metadata_store.recall(gguf_files.identify(path).sha256),
    )
    assert one[0] is not other[0] and one[1] is not other[1]


def test_an_unreadable_entry_is_logged_parsed_again_and_replaced(path, parses, caplog):
    load_model(str(path), weights="float32")
    kept = entry(path)
    kept.write_bytes(kept.read_bytes()[:100])  # truncated
    metadata_store.forget_in_memory()
    with caplog.at_level(logging.WARNING, logger=metadata_store.__name__):
        model = load_model(str(path), weights="float32")
    assert len(parses) == 2 and "cannot be read" in caplog.text and model.render(MESSAGES)
    metadata_store.forget_in_memory()
    assert metadata_store.recall(gguf_files.identify(path).sha256) is not None  # written whole again


def test_an_entry_that_holds_no_pair_is_parsed_again(path, parses, caplog):
    digest = gguf_files.identify(path).sha256
    metadata_store.remember(digest, "not a config", None)
    metadata_store.forget_in_memory()
    with caplog.at_level(logging.WARNING, logger=metadata_store.__name__):
        assert load_model(str(path), weights="float32").render(MESSAGES)
    assert len(parses) == 1 and "does not hold a config" in caplog.text


def test_an_entry_of_another_transformers_is_not_read(path, parses, monkeypatch):
    load_model(str(path), weights="float32")
    before = entry(path)
    monkeypatch.setattr(metadata_store.transformers, "__version__", "0.0.1")
    metadata_store.forget_in_memory()
    load_model(str(path), weights="float32")
    assert len(parses) == 2 and entry(path) != before and entry(path).is_file() and before.is_file()


def test_a_recalled_config_is_checked_against_the_families_served_now(path, monkeypatch):
    load_model(str(path), weights="float32")  # kept while llama is served

    def refused(config, path):
        raise UnsupportedArchitectureError(config.model_type, f"refused by this turncache ({path})", ())

    monkeypatch.setattr(gguf_files, "check_family", refused)
    metadata_store.forget_in_memory()
    with pytest.raises(UnsupportedArchitectureError, match="refused by this turncache"):
        load_model(str(path), weights="float32")


def test_a_home_that_cannot_be_written_costs_only_the_parse(path, parses, monkeypatch, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("TURNCACHE_HOME", str(blocked))
    first = load_model(str(path), weights="float32")
    again = load_model(str(path), weights="float32")  # held in memory
    assert len(parses) == 1 and again.fingerprint == first.fingerprint
    metadata_store.forget_in_memory()
    load_model(str(path), weights="float32")
    assert len(parses) == 2  # nothing on disk: parsed again


def test_the_tokenizer_alone_recalls_the_pair_too(path, parses):
    tokenizer = gguf_model.checked_tokenizer(path)
    metadata_store.forget_in_memory()
    again = gguf_model.checked_tokenizer(path)
    assert len(parses) == 1 and again.get_vocab() == tokenizer.get_vocab()
    assert again.chat_template == tokenizer.chat_template


def test_loads_of_one_file_at_once_take_turns_and_parse_it_once(path, parses, monkeypatch):
    """Two loads at once (threads here; processes alike: the lock is a file's): the first parses and keeps the pair,
    the second waits for it and recalls it."""
    original = gguf_model.load_tokenizer

    def slow(file):  # a long parse (Gemma 3 270M's takes ~15 s): the other load arrives while it runs
        time.sleep(0.5)
        return original(file)

    monkeypatch.setattr(gguf_model, "load_tokenizer", slow)
    with ThreadPoolExecutor(2) as pool:
        models = list(pool.map(lambda _: load_model(str(path), weights="float32"), range(2)))
    assert len(parses) == 1 and models[0].fingerprint == models[1].fingerprint
