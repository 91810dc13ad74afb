"""The contract between Python and native.c: one record type for the attention table whose layout the library
confirms, rows that cannot reach C when wrong, a library loaded only from a private directory with the digest
recorded when it was built, and one OpenMP runtime in a serving process."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from chat.models.kernels import native

torch.set_num_threads(1)

KERNELS = native.kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no native kernels on this machine")
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CC") or "cc") is None, reason="no C compiler on this machine"
)


@needs_kernels
def test_the_row_record_has_the_layout_the_library_declares():
    assert KERNELS.abi_version == native.ABI_VERSION
    offsets = tuple(getattr(native.AttentionRow, name).offset for name in native.ROW_FIELDS)
    assert KERNELS.row_layout() == (ctypes.sizeof(native.AttentionRow), *offsets)
    assert len(native.ROW_FIELDS) == 12 and [f for f, _ in native.AttentionRow._fields_] == list(native.ROW_FIELDS)


def _add(table, **changes):
    fields = {
        "keys": 4096,
        "key_head_stride": 64,
        "key_row_stride": 8,
        "values": 8192,
        "value_head_stride": 64,
        "value_row_stride": 8,
        "rows": 4,
        "queries": 1,
        "first": 0,
        "half": 0,
        **changes,
    }
    head = [fields.pop(name) for name in native.ROW_FIELDS[:7]]
    table.add(*head, **fields)


@pytest.mark.parametrize(
    "changes",
    [
        {"keys": 0},
        {"values": -8},
        {"key_row_stride": 0},
        {"value_head_stride": -1},
        {"rows": 0},
        {"queries": 5},  # more query tokens than rows
        {"queries": 0},
        {"first": -1},
        {"half": 2},
        {"new_key": 64},  # a new key without its value
        {"new_key": 64, "new_value": 128, "queries": 2, "rows": 4},  # new K/V for more than one token
        {"rows": 1 << 41},
        {"keys": 1 << 63},  # would not fit an int64
    ],
)
def test_a_wrong_row_cannot_be_added(changes):
    table = native.AttentionTable()
    with pytest.raises(native.AttentionRowError):
        _add(table, **changes)
    assert len(table) == 0 and table.end == 0


def test_rows_are_packed_as_the_record_lays_them_out():
    table = native.AttentionTable(1)
    _add(table, first=0, queries=2, rows=3)
    _add(table, first=2, new_key=640, new_value=1280, half=1)  # the table grows past its first capacity
    assert len(table) == 2 and table.end == 3 and table.new_kv
    second = table[1]
    assert isinstance(second, native.AttentionRow)
    assert (second.keys, second.rows, second.new_key, second.new_value, second.queries, second.first, second.half) == (
        4096,
        4,
        640,
        1280,
        1,
        2,
        1,
    )
    assert table[0].queries == 2 and table[0].new_key == 0
    with pytest.raises(IndexError):
        table[2]


def test_a_row_of_views_takes_their_addresses_strides_and_dtype():
    keys = torch.zeros(1, 2, 16, 8, dtype=torch.float16)
    values = torch.zeros(1, 2, 16, 4, dtype=torch.float16)
    table = native.AttentionTable()
    table.add_views(keys[0, :, 3:9], values[0, :, 3:9], queries=2, first=5)
    row = table[0]
    assert (row.keys, row.key_head_stride, row.key_row_stride) == (keys.data_ptr() + 3 * 8 * 2, 128, 8)
    assert (row.values, row.value_head_stride, row.value_row_stride) == (values.data_ptr() + 3 * 4 * 2, 64, 4)
    assert (row.rows, row.queries, row.first, row.half, row.new_key) == (6, 2, 5, 1, 0)
    with pytest.raises(native.AttentionRowError):  # bfloat16 rows: no kernel reads them
        table.add_views(keys[0].bfloat16(), values[0].bfloat16(), queries=1, first=0)
    with pytest.raises(native.AttentionRowError):  # rows whose last dimension is not contiguous
        table.add_views(keys[0].transpose(1, 2), values[0].transpose(1, 2), queries=1, first=0)
    assert len(table) == 1


@needs_kernels
def test_a_table_that_does_not_fit_its_call_never_reaches_c(monkeypatch):
    calls = []
    monkeypatch.setattr(KERNELS, "_attention", lambda *args: calls.append(args) or 0)
    keys, values = torch.zeros(2, 6, 8), torch.zeros(2, 6, 8)
    queries, out = torch.zeros(3, 4, 8), torch.zeros(3, 4, 8)

    def table(**rows):
        t = native.AttentionTable()
        t.add_views(rows.get("keys", keys), rows.get("values", values), queries=2, first=rows.get("first", 1))
        return t

    KERNELS.attention(queries, 2, table(), None, (0, 0), out, None)
    assert len(calls) == 1  # the call itself goes through
    with_new = native.AttentionTable()
    _add(with_new, keys=keys.data_ptr(), values=values.data_ptr(), new_key=64, new_value=64)
    wrong = [
        table(first=2),  # its tokens 2..3 of a call of 3
        [(keys.data_ptr(), 48, 8, values.data_ptr(), 48, 8, 6, 0, 0, 2, 1, 0)],  # the old untyped 12 integers
        table(keys=torch.zeros(2, 6, 4), values=torch.zeros(2, 6, 4)),  # rows shorter than D
        with_new,  # new K/V without their head strides
    ]
    for t in wrong:
        with pytest.raises(native.AttentionRowError):
            KERNELS.attention(queries, 2, t, None, (0, 0), out, None)
    with pytest.raises(ValueError):  # heads not a multiple of the K/V heads
        KERNELS.attention(queries, 3, table(), None, (0, 0), out, None)
    with pytest.raises(ValueError):  # not contiguous
        KERNELS.attention(queries.transpose(0, 1), 2, table(), None, (0, 0), out, None)
    assert len(calls) == 1


@needs_compiler
def test_a_library_whose_bytes_changed_is_not_loaded_and_is_built_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    compiler = os.environ.get("CC") or "cc"
    built = native._build(compiler)
    native._check_digest(built)
    with built.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(native.UnsafeLibraryError, match="sha256 changed"):
        native._check_digest(built)
    monkeypatch.setattr(native, "_build", lambda compiler: built)  # changed between its build and its load
    with caplog.at_level(logging.WARNING, logger="chat.models.kernels.native"):
        assert native._load() is None
    assert "not the library that was built" in caplog.text
    monkeypatch.undo()
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="chat.models.kernels.native"):
        again = native._build(compiler)  # a changed build is made again, and then matches its record
    assert again == built and "building it again" in caplog.text
    native._check_digest(again)
    built.with_name(built.name + ".sha256").unlink()
    with pytest.raises(native.UnsafeLibraryError, match="no recorded digest"):
        native._check_digest(built)


@needs_compiler
@pytest.mark.parametrize("where", ["itself", "above"])
def test_a_build_directory_others_can_write_to_is_refused(tmp_path, monkeypatch, caplog, where):
    home = tmp_path / "home"
    (home / "native").mkdir(parents=True)
    loose = home / "native" if where == "itself" else home
    loose.chmod(0o777)  # no sticky bit: anyone could replace what it holds
    monkeypatch.setenv("TURNCACHE_HOME", str(home))
    try:
        with caplog.at_level(logging.WARNING, logger="chat.models.kernels.native"):
            assert native._load() is None
        assert "not loaded" in caplog.text and str(loose) in caplog.text
        assert list((home / "native").iterdir()) == []  # nothing was compiled there
        loose.chmod(0o777 | 0o1000)  # sticky: others cannot move our entries (a directory like /tmp)
        if where == "above":
            native._check_private(home / "native")
        else:
            with pytest.raises(native.UnsafeLibraryError):
                native._check_private(home / "native")  # the build directory itself must be ours alone
    finally:
        loose.chmod(0o700)


def test_a_fresh_build_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path / "home"))
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler on this machine")
    path = native._build(os.environ.get("CC") or "cc")
    assert path.parent.stat().st_mode & 0o777 == 0o700


OPENMP = ("libgomp", "libiomp", "libomp")


@needs_kernels
def test_a_serving_process_maps_one_openmp_runtime():
    """The native library links libgomp by soname, which resolves to the copy torch mapped: one runtime, one thread
    pool. A second runtime (an Intel or LLVM OpenMP, another libgomp) would make two pools fight over the cores."""
    script = textwrap.dedent(
        """
        import json, torch
        torch.set_num_threads(1)
        from chat.engine.runtime import Feed
        from chat.models import load_model
        from chat.models.kernels import native
        model = load_model("tiny-llama", weights="int8")
        run = model.new_run()
        model.forward_batch([Feed(run, [5, 6, 7], 1)])
        maps = open("/proc/self/maps").read().splitlines()
        paths = sorted({line.split()[-1] for line in maps if "/" in line})
        print(json.dumps({"paths": paths, "kernels": native.kernels() is not None}))
        """
    )
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root, check=True
    )
    import json

    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["kernels"]
    runtimes = [p for p in seen["paths"] if Path(p).name.startswith(OPENMP)]
    assert len(runtimes) == 1, runtimes
    assert any(Path(p).name.startswith("kernels-") for p in seen["paths"])  # our library was mapped too
