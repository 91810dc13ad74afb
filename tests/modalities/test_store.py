"""The media store: hits skip decoding, failures leave it unchanged, LRU eviction under a byte budget."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from modalities import image
from modalities.errors import CorruptMediaError
from modalities.identity import ContentHash, content_hash
from modalities.store import MediaStore
from tests.modalities import helpers as h


@dataclass
class Blob:
    nbytes: int


def key(name: str) -> ContentHash:
    return ContentHash(name * 8)


def snapshot(store: MediaStore):
    s = store.stats()
    return store.lru_keys(), s.entries, s.bytes, s.evictions


class Counter:
    def __init__(self, value: object) -> None:
        self.calls = 0
        self.value = value

    def __call__(self) -> object:
        self.calls += 1
        return self.value


def test_a_hit_skips_decoding() -> None:
    store = MediaStore(1000)
    decode = Counter(Blob(100))
    first = store.get_or_decode(key("a"), decode)
    second = store.get_or_decode(key("a"), decode)
    assert first is second
    assert decode.calls == 1
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.entries, stats.bytes) == (1, 1, 1, 100)


def test_a_failing_decode_leaves_the_store_unchanged() -> None:
    store = MediaStore(250)
    store.put(key("a"), Blob(100), 100)
    store.put(key("b"), Blob(100), 100)
    before = snapshot(store)

    def fail() -> Blob:
        raise CorruptMediaError("the PNG image is truncated or corrupt.", item=0)

    with pytest.raises(CorruptMediaError):
        store.get_or_decode(key("c"), fail)
    assert snapshot(store) == before
    assert not store.contains(key("c"))
    # a value too large to fit beside a and b, whose size cannot be computed: nothing evicted either
    with pytest.raises(ZeroDivisionError):
        store.get_or_decode(key("d"), lambda: Blob(200), size_of=lambda blob: 1 // 0)
    with pytest.raises(ValueError, match="non-negative integer"):
        store.get_or_decode(key("d"), lambda: Blob(-1))
    assert snapshot(store) == before


def test_eviction_is_least_recently_used_first() -> None:
    store = MediaStore(300)
    for name in "abc":
        store.put(key(name), Blob(100), 100)
    assert store.get(key("a")).nbytes == 100  # a becomes the most recently used
    store.put(key("d"), Blob(100), 100)  # evicts b
    assert [k for k, _ in store.lru_keys()] == [key("c"), key("a"), key("d")]
    store.get_or_decode(key("c"), Counter(Blob(100)))  # hit: c moves to the end
    store.put(key("e"), Blob(150), 150)  # evicts a, then d
    assert [k for k, _ in store.lru_keys()] == [key("c"), key("e")]
    stats = store.stats()
    assert (stats.bytes, stats.evictions) == (250, 3)


def test_peek_reads_a_value_without_using_it_or_counting() -> None:
    store = MediaStore(200)
    a = Blob(100)
    store.put(key("a"), a, 100)
    store.put(key("b"), Blob(100), 100)
    assert store.peek(key("a")) is a and store.peek(key("a"), "encoded:x") is None
    assert store.peek(key("z"), default=0) == 0
    stats = store.stats()
    assert (stats.hits, stats.misses) == (0, 0)
    store.put(key("c"), Blob(100), 100)  # a is still the least recently used: evicted
    assert [k for k, _ in store.lru_keys()] == [key("b"), key("c")]


def test_a_value_larger_than_the_budget_is_returned_but_not_stored() -> None:
    store = MediaStore(100)
    store.put(key("a"), Blob(50), 50)
    value = store.get_or_decode(key("big"), Counter(Blob(101)))
    assert value.nbytes == 101
    assert not store.contains(key("big"))
    assert store.contains(key("a"))  # nothing was evicted for it
    assert store.stats().oversize == 1
    assert store.put(key("big"), Blob(101), 101) is False


def test_stages_are_separate_and_discard_drops_them() -> None:
    store = MediaStore(1000)
    store.put(key("a"), "pixels", 10)
    store.put(key("a"), "vision tower output", 20, stage="encoded:qwen2-vl")
    assert store.get(key("a")) == "pixels"
    assert store.get(key("a"), stage="encoded:qwen2-vl") == "vision tower output"
    assert store.get(key("a"), stage="encoded:other", default="miss") == "miss"
    assert store.discard(key("a"), stage="decoded") == 1
    assert store.discard(key("a")) == 1
    assert len(store) == 0 and store.stats().bytes == 0


def test_replacing_a_value_recounts_its_size() -> None:
    store = MediaStore(100)
    store.put(key("a"), "v1", 60)
    store.put(key("a"), "v2", 30)
    assert store.get(key("a")) == "v2"
    assert store.stats().bytes == 30


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_bad_sizes_and_budgets(bad: object) -> None:
    with pytest.raises(ValueError):
        MediaStore(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        MediaStore(10).put(key("a"), "v", bad)  # type: ignore[arg-type]


def test_an_image_repeated_in_a_later_turn_is_not_decoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    data = h.encode_image(h.picture(), "PNG")
    fp = image.fingerprint("Qwen2VLImageProcessorPil", processor_settings={"max_pixels": 1_003_520})
    store = MediaStore(10_000_000)
    calls = []
    real_decode = image.decode

    def counting_decode(*args, **kwargs):
        calls.append(1)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(image, "decode", counting_decode)
    for _turn in range(3):
        decoded = store.get_or_decode(content_hash(data, fp), lambda: image.decode(data, declared="image/png"))
        assert decoded.image.size == (64, 48)
    assert len(calls) == 1
    assert store.stats().bytes == 64 * 48 * 3  # charged by DecodedImage.nbytes


def test_concurrent_misses_store_one_value() -> None:
    store = MediaStore(1000)
    barrier = threading.Barrier(4)
    results = []

    def decode() -> Blob:
        barrier.wait(timeout=5)  # all four threads miss before any stores
        return Blob(10)

    def worker() -> None:
        results.append(store.get_or_decode(key("a"), decode))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(results) == 4
    assert all(r is results[0] for r in results)
    assert store.stats().entries == 1 and store.stats().bytes == 10
