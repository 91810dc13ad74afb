"""Responses API wire models (``chat/server/surfaces/responses_types.py``): an event written into its template is the
event encoded whole. (Every surface's bytes: tests/chat/server/test_wire_bodies.py.)"""

from __future__ import annotations


def test_a_responses_text_delta_written_into_its_template_is_the_delta_encoded_whole():
    from chat.server.surfaces.responses_types import EventWriter

    fast, whole = EventWriter('msg_"x\\'), EventWriter('msg_"x\\')
    for text in ("plain", 'quote " and \\ and \n', "\x01\x1f\x7f", "ünï ✓ \u2028", "987654321", "\ue000", ""):
        assert fast.text_delta(text) == whole.whole_delta(text)
    assert fast.sequence_number == whole.sequence_number == 7
