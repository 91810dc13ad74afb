"""chat.protocol.sampling: the sampling settings' ranges (their edges taken, values outside refused naming the field),
a single stop string made a list, and an update merged field by field."""

from __future__ import annotations

import json

import pytest

from chat.protocol import ErrorCode, ProtocolError, SamplingSettings, parse_client_event
from chat.protocol import limits as L

GOOD_SAMPLING = [
    {},
    {"temperature": 0},
    {"temperature": L.MAX_TEMPERATURE, "top_p": 1, "top_k": L.MAX_TOP_K, "seed": L.MAX_SEED},
    {"top_p": 1e-9, "max_tokens": 1},
    {"max_tokens": L.MAX_REPLY_TOKENS, "seed": None},
    {"stop": "###"},
    {"stop": ["a"] * L.MAX_STOP_STRINGS},
]


BAD_SAMPLING = {
    "temperature<0": ({"temperature": -0.1}, "sampling.temperature"),
    "temperature>max": ({"temperature": L.MAX_TEMPERATURE + 0.1}, "sampling.temperature"),
    "temperature str": ({"temperature": "0.5"}, "sampling.temperature"),
    "top_p=0": ({"top_p": 0}, "sampling.top_p"),
    "top_p>1": ({"top_p": 1.01}, "sampling.top_p"),
    "top_k<0": ({"top_k": -1}, "sampling.top_k"),
    "top_k float": ({"top_k": 5.0}, "sampling.top_k"),
    "top_k bool": ({"top_k": True}, "sampling.top_k"),
    "seed<0": ({"seed": -1}, "sampling.seed"),
    "seed>max": ({"seed": L.MAX_SEED + 1}, "sampling.seed"),
    "max_tokens=0": ({"max_tokens": 0}, "sampling.max_tokens"),
    "max_tokens>max": ({"max_tokens": L.MAX_REPLY_TOKENS + 1}, "sampling.max_tokens"),
    "empty stop": ({"stop": [""]}, "sampling.stop.0"),
    "long stop": ({"stop": ["x" * (L.MAX_STOP_CHARS + 1)]}, "sampling.stop.0"),
    "many stops": ({"stop": ["a"] * (L.MAX_STOP_STRINGS + 1)}, "sampling.stop"),
    "unknown field": ({"temprature": 1}, "sampling.temprature"),
}


@pytest.mark.parametrize("sampling", GOOD_SAMPLING)
def test_sampling_accepts_the_edges_of_each_range(sampling):
    event = parse_client_event(json.dumps({"type": "session.create", "sampling": sampling}))
    assert isinstance(event.sampling, SamplingSettings)


def test_a_single_stop_string_becomes_a_list():
    event = parse_client_event('{"type": "session.create", "sampling": {"stop": "###"}}')
    assert event.sampling.stop == ["###"]


@pytest.mark.parametrize(("sampling", "path"), BAD_SAMPLING.values(), ids=BAD_SAMPLING.keys())
def test_sampling_refuses_values_out_of_range(sampling, path):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(json.dumps({"type": "session.update", "event_id": "u", "sampling": sampling}))
    assert info.value.code is ErrorCode.INVALID_EVENT
    assert info.value.message.startswith(f"{path}:")
    assert info.value.event_id == "u"


def test_merged_changes_only_the_fields_sent():
    base = SamplingSettings(temperature=0.7, top_k=40, stop=["x"])
    update = parse_client_event('{"type":"session.update","sampling":{"top_k":0}}').sampling
    assert base.merged(update) == SamplingSettings(temperature=0.7, top_k=0, stop=["x"])
