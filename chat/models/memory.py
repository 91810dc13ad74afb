"""The process's resident memory, and giving back what a model load freed.

Loading a model allocates and frees a great deal (the float32 dequantization of every tensor, the copies a format
packs from): glibc keeps freed heap memory in its arenas rather than returning it, so a process that loaded a model
held about twice what the model keeps (smollm2 in int8: 1.9 GB resident after the load, 0.8 GB once trimmed; the
same figure a server idles at). :func:`release_free_memory` asks glibc to return it (``malloc_trim``); a load ends
with it (:func:`chat.models.load_model`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from pathlib import Path


def resident_mib() -> float:
    """The resident set size of this process (``VmRSS``), in MiB; 0.0 where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@functools.cache
def _trim() -> ctypes._CFuncPtr | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # no glibc (musl, macOS): nothing to trim
        return None


def release_free_memory() -> None:
    """Collect unreachable objects, then return the C heap's free memory to the system (glibc's ``malloc_trim``;
    nothing elsewhere)."""
    gc.collect()
    trim = _trim()
    if trim is not None:
        trim(0)
