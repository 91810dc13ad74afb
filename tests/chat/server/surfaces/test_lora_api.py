"""LoRA adapters' admin surface (``chat/server/surfaces/lora_api.py``): ``--lora NAME=PATH[:SCALE]`` specs. (Loading at
start and over HTTP, selecting by ``model``: tests/chat/server/test_lora_http.py.)"""

from __future__ import annotations

import pytest

from chat.server.settings import ServerSettings
from chat.server.surfaces.lora_api import parse_lora_spec


def test_lora_specs():
    assert parse_lora_spec("a=/x/y") == ("a", "/x/y", 1.0)
    assert parse_lora_spec("a=/x/y:0.5") == ("a", "/x/y", 0.5)
    assert parse_lora_spec("a=/x:y/z") == ("a", "/x:y/z", 1.0)
    for bad in ("a", "=/x", "a b=/x", "a=", "a=/x:inf"):
        with pytest.raises(ValueError):
            parse_lora_spec(bad)
    with pytest.raises(ValueError, match="twice"):
        ServerSettings(lora=["a=/x", "a=/y"])
