"""cache.disk_format: what the disk tier's files hold and how they are checked: digests (namespaces, chains of chunks),
the entry header's JSON (extras values exactly, tokens, layers' limits), tensors split into chunks and back, and
every file that is not what it says refused with DiskFormatError."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from array import array

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cache import Namespace
from cache.disk_format import (
    ENTRY_FORMAT,
    DiskFormatError,
    EntryHeader,
    UnserializableError,
    build_layers,
    checksum,
    chunk_digests,
    chunk_tensors,
    describe_layers,
    entry_metadata,
    entry_tensors,
    layout_digest,
    namespace_digest,
    payload_bytes,
    read_metadata,
    read_tensors,
    write_file,
)
from cache.entry_rules import servable_limits
from cache.layers import tensors_of
from tests.cache.helpers import image, normal, recurrent, rotating, stateless

BASE = Namespace("model", "float32", "salt")
C = 4  # chunk tokens


def layers_of(length: int = 10):
    return (normal(length, fill=0.5), rotating(length, 4, rows=5), recurrent({4, length}), stateless())


def header_of(layers, tokens, extras=(), media=()) -> EntryHeader:
    full = len(tokens) // C
    digests = chunk_digests("ns", array("q", tokens), C)
    assert len(digests) == full
    return EntryHeader(
        array("q", tokens), tuple(media), tuple(extras), describe_layers(layers), digests, C,
        layout_digest(layers), payload_bytes(layers),
    )  # fmt: skip


def test_the_digest_of_a_namespace_without_components_is_unchanged():
    text = b"turncache-namespace\0model\0float32\0salt"
    assert namespace_digest(BASE) == hashlib.blake2b(text, digest_size=16).hexdigest()
    digests = {
        namespace_digest(ns)
        for ns in (
            BASE,
            BASE.with_component("lora", "abc"),
            BASE.with_component("lora", "abd"),
            Namespace("model", "float32", 'salt\0[["lora", "abc"]]'),
        )
    }
    assert len(digests) == 4


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=0, max_size=14),
    st.lists(st.integers(0, 2), min_size=0, max_size=14),
    st.integers(1, 4),
)
def test_chunk_digests_are_equal_exactly_while_the_sequences_agree_up_to_the_chunks_end(a, b, chunk):
    da, db = chunk_digests("ns", array("q", a), chunk), chunk_digests("ns", array("q", b), chunk)
    assert len(da) == len(a) // chunk and len(db) == len(b) // chunk  # a partial last chunk has none
    for j in range(min(len(da), len(db))):
        assert (da[j] == db[j]) == (a[: (j + 1) * chunk] == b[: (j + 1) * chunk])
    if len(a) >= chunk:
        assert chunk_digests("other", array("q", a), chunk)[0] != da[0]  # another namespace, other chunks


def test_tensors_split_into_chunks_and_the_entry_file_come_back_as_the_layers():
    layers = layers_of(10)
    tokens = list(range(10))
    text = header_of(layers, tokens).to_json()
    header = EntryHeader.from_json(text)
    chunks = [chunk_tensors(layers, j, C) for j in range(len(header.chunks))]
    own = entry_tensors(layers, len(header.chunks) * C)
    assert own["L0.k"].shape[-2] == 2  # the normal layer's rows after its two full chunks
    back = build_layers(header, own, chunks)
    assert [type(s) for s in back] == [type(s) for s in layers]
    for got, want in zip(back, layers, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(tensors_of(got), tensors_of(want), strict=True))
    assert header.limits() == servable_limits(layers) and header.to_json() == text
    assert header.nbytes == sum(t.numel() * t.element_size() for s in layers for t in tensors_of(s))


def test_tensors_that_do_not_fit_the_header_are_refused():
    layers = layers_of(10)
    header = EntryHeader.from_json(header_of(layers, list(range(10))).to_json())
    chunks = [chunk_tensors(layers, j, C) for j in range(2)]
    own = entry_tensors(layers, 8)
    with pytest.raises(DiskFormatError, match="rows"):
        build_layers(header, own, chunks[:1])  # a chunk missing: too few rows
    with pytest.raises(DiskFormatError):
        build_layers(header, {k: v for k, v in own.items() if k != "L2.s4.0"}, chunks)  # a snapshot missing
    wrong = dict(own, **{"L0.k": own["L0.k"].double(), "L0.v": own["L0.v"].double()})
    with pytest.raises(DiskFormatError):
        build_layers(header, wrong, chunks)  # rows of another dtype than the chunks'
    with pytest.raises(DiskFormatError, match="layout"):
        build_layers(dataclasses.replace(header, layout="0" * 32), own, chunks)  # the header says another layout


EXTRAS = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | st.integers() | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(EXTRAS, max_size=4))
def test_extras_values_come_back_with_their_exact_types(values):
    extras = tuple((i, v) for i, v in enumerate(values))
    back = EntryHeader.from_json(header_of((normal(5),), [1, 2, 3, 4, 5], extras).to_json()).extras
    assert back == extras and repr(back) == repr(extras)  # 1 stays an int, 1.0 a float, tuples tuples, lists lists


def test_nan_and_huge_ints_survive_and_other_types_are_refused():
    extras = ((0, math.nan), (1, 10**40), (2, -math.inf))
    back = EntryHeader.from_json(header_of((normal(5),), [1, 2, 3, 4, 5], extras).to_json()).extras
    assert math.isnan(back[0][1]) and back[1:] == extras[1:]
    with pytest.raises(UnserializableError):
        header_of((normal(5),), [1, 2, 3, 4, 5], ((0, {"a": 1}),)).to_json()


def test_media_spans_survive_the_header():
    spans = (image(1, 3, "img-a"), image(5, 8, "img-b"))
    assert EntryHeader.from_json(header_of((normal(9),), list(range(9)), media=spans).to_json()).media == spans


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(tokens=[]),
        lambda d: d.update(tokens=[1, -2]),
        lambda d: d.update(tokens=[1, 2**31]),
        lambda d: d.update(chunks=["x"] * 3),  # 12 rows of chunks for 10 tokens
        lambda d: d.update(layers=[{"kind": "cross"}]),
        lambda d: d.update(nbytes=-1),
        lambda d: d.update(extras=[[0, {"x": 1}]]),
        lambda d: d.pop("layout"),
    ],
    ids=["no tokens", "negative token", "huge token", "chunks past the end", "unknown layer", "negative size",
         "bad extras value", "no layout"],
)  # fmt: skip
def test_a_header_that_is_not_well_formed_is_refused(change):
    data = json.loads(header_of(layers_of(10), list(range(10))).to_json())
    change(data)
    with pytest.raises(DiskFormatError):
        EntryHeader.from_json(json.dumps(data))
    with pytest.raises(DiskFormatError):
        EntryHeader.from_json("{not json")


def test_a_file_is_read_back_only_while_its_checksum_kind_and_bytes_hold(tmp_path):
    tensors = {"a": torch.arange(6.0).view(2, 3), "b": torch.zeros(0)}
    path = tmp_path / "e.safetensors"
    size = write_file(path, tensors, entry_metadata("ns", "{}"))
    assert size == path.stat().st_size and list(tmp_path.iterdir()) == [path]  # no temporary file left
    meta, back = read_tensors(path, ENTRY_FORMAT)
    assert meta["namespace"] == "ns" and torch.equal(back["a"], tensors["a"]) and meta["checksum"] == checksum(back)
    with pytest.raises(DiskFormatError, match="foreign"):
        read_tensors(path, "turncache-prefix-chunk")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # a flipped bit in the tensor data
    path.write_bytes(bytes(raw))
    with pytest.raises(DiskFormatError, match="checksum"):
        read_tensors(path, ENTRY_FORMAT)
    path.write_bytes(bytes(raw[:20]))  # truncated
    with pytest.raises(DiskFormatError):
        read_metadata(path)


def test_the_checksum_covers_names_and_bytes_in_any_order():
    a, b = torch.ones(3), torch.zeros(2)
    assert checksum({"x": a, "y": b}) == checksum({"y": b, "x": a})
    assert checksum({"x": a, "y": b}) != checksum({"x": b, "y": a})
    assert checksum({"x": a}) != checksum({"z": a})
    assert checksum({"x": a}) != checksum({"x": a * 2})
