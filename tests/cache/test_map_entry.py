"""cache.map_entry: an entry's distinct tensor storages (what the policy counts): a storage shared by several tensors
or layers counts once, at its whole size; an entry held only on disk holds none."""

from __future__ import annotations

from array import array

import torch

from cache import DEVICE, DISK, Namespace, NormalKV, RotatingKV, Stateless
from cache.map_entry import Entry, storages_of
from tests.cache.helpers import recurrent

NS = Namespace("m", "float32")


def entry(layers) -> Entry:
    return Entry(1, NS, array("q", range(4)), layers, (), (), DEVICE if layers is not None else DISK)


def test_views_of_one_buffer_count_once_at_its_whole_size():
    buffer = torch.zeros(2, 1, 1, 8, 2)  # K and V of two layers in one allocation, 8 rows each
    keys, values = buffer[0, :, :, :4], buffer[1, :, :, :4]  # views of its first 4 rows
    shared = NormalKV(keys, values)
    out = storages_of(entry((shared, shared, Stateless())))
    assert [size for _, size in out] == [buffer.untyped_storage().nbytes()] == [2 * 8 * 2 * 4]


def test_separate_tensors_count_each():
    kv = NormalKV(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))
    window = RotatingKV(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), 4, 4)
    snaps = recurrent({2, 4})
    sizes = sorted(size for _, size in storages_of(entry((kv, window, snaps))))
    assert sizes == sorted([32, 32, 24, 24, 12, 12])
    assert len({key for key, _ in storages_of(entry((kv, window, snaps)))}) == 6


def test_an_entry_only_on_disk_holds_no_storage():
    assert storages_of(entry(None)) == ()
