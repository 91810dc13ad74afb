"""The config and tokenizer transformers builds from a GGUF file's metadata, kept by the file's sha256, so that a
file's metadata is parsed once per machine rather than once per process.

transformers reads a GGUF file's metadata through gguf-py, one numpy view per element of every array: Gemma 3 270M's
262,144-token vocabulary took 14.6 s to parse, the same pair 1.0 s to unpickle (2 vCPUs AMD EPYC, 2026-11-28). Every
server start, cluster replica, ingress and benchmark process paid the parse. Here the pair is pickled after the first
parse into ``models_home()/gguf/.metadata/<sha256>-<transformers>-<tokenizers>-<FORMAT>.pickle`` (written
atomically; transformers' and tokenizers' versions in the name, since they decide what is built) and, for the last
file used, held in memory as the same bytes: each recall is a fresh pair that no other load shares. Processes that
load the same file at once (a cluster's replicas on one machine, a test suite's workers) take turns
(:func:`one_at_a_time`, a lock file beside the entry): the first parses, the others recall what it kept.

What is recalled is the pair as transformers built it: no field is rebuilt, so a model loads with the fingerprint,
template and vocabulary of a parse. The families a config may have are checked on every load by the caller (a
later turncache may refuse what an earlier one stored). The files are pickles: only this process's own user writes
them, into the directory that also holds the model files the server runs (a writer there can change the weights
too); an entry that cannot be read or does not hold a pair is logged, parsed again and replaced. Failing to write
one costs only a later parse.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tokenizers
import transformers

from chat.models.gguf_files import GGUF_DIR, models_home

_log = logging.getLogger(__name__)

FORMAT = 1  # what one entry holds: pickle.dumps((config, tokenizer)); raised when that changes
STORE_DIR = ".metadata"  # under models_home()/gguf

_last: dict[str, bytes] = {}  # entry name -> its bytes: the last file recalled or stored in this process


def entry_path(digest: str) -> Path:
    """Where the pair of the file whose bytes have sha256 ``digest`` is kept."""
    name = f"{digest}-{transformers.__version__}-{tokenizers.__version__}-{FORMAT}.pickle"
    return models_home() / GGUF_DIR / STORE_DIR / name


def recall(digest: str) -> tuple[Any, Any] | None:
    """A fresh ``(config, tokenizer)`` of the file with sha256 ``digest``, or None when none is kept (or the entry is
    unreadable: logged)."""
    path = entry_path(digest)
    blob = _last.get(path.name)
    if blob is None:
        try:
            blob = path.read_bytes()
        except OSError:
            return None  # none kept yet
    try:
        pair = pickle.loads(blob)
    except Exception as exc:  # a truncated or foreign file: unpickling raises what the bytes make it raise
        _log.warning("%s cannot be read (%s); the file's metadata is parsed again", path, exc)
        return None
    if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], transformers.PretrainedConfig)):
        _log.warning("%s does not hold a config and a tokenizer; the file's metadata is parsed again", path)
        return None
    _last.clear()
    _last[path.name] = blob
    return pair


def remember(digest: str, config: Any, tokenizer: Any) -> None:
    """Keep ``(config, tokenizer)`` as the pair of the file with sha256 ``digest`` (in memory, and on disk unless
    it cannot be written: logged)."""
    path = entry_path(digest)
    blob = pickle.dumps((config, tokenizer), protocol=pickle.HIGHEST_PROTOCOL)
    _last.clear()
    _last[path.name] = blob
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        _log.info("the metadata of %s... is not kept on disk (%s): a later process parses it again", digest[:12], exc)


@contextlib.contextmanager
def one_at_a_time(digest: str) -> Iterator[None]:
    """While it is open, no other process (or thread) holds it for the same ``digest``: a recall, and the parse and
    :func:`remember` where nothing was kept, happen once at a time per file (``flock`` on ``<entry>.lock``; where
    the lock file cannot be made, e.g. a home that cannot be written, nothing is held)."""
    path = entry_path(digest).with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # releases the lock


def forget_in_memory() -> None:
    """Drop the pair held in memory (the disk's entries stay)."""
    _last.clear()
