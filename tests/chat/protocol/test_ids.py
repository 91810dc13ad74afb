"""chat.protocol.ids: ids are their prefix, an underscore and 24 random hex digits (96 bits: a session id is a
capability, so it must not be guessable)."""

from __future__ import annotations

import re

from chat.protocol.ids import new_id


def test_an_id_is_its_prefix_and_24_hex_digits_and_never_repeats():
    ids = [new_id(prefix) for prefix in ("sess", "turn", "msg") for _ in range(200)]
    assert all(re.fullmatch(r"(sess|turn|msg)_[0-9a-f]{24}", i) for i in ids)
    assert ids[0].startswith("sess_") and ids[-1].startswith("msg_")
    assert len(set(ids)) == len(ids)
