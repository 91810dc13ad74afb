"""Legacy completions wire models (``chat/server/surfaces/completions_types.py``): a chunk written into its template
is the chunk encoded whole. (Every surface's bytes: tests/chat/server/test_wire_bodies.py.)"""

from __future__ import annotations


def test_a_completion_chunk_written_into_its_template_is_the_chunk_encoded_whole():
    from chat.server.surfaces.completions_types import ChunkTemplate, CompletionLogprobs

    template = ChunkTemplate("cmpl-x", 123, 'm"odel')
    table = CompletionLogprobs(tokens=["a"], token_logprobs=[None], top_logprobs=[{"a": -0.5}], text_offset=[0])
    for text in ("plain", 'quote " and \\ and \n', "ünï ✓ \u2028", ""):
        for logprobs in (None, table):
            assert template.text(3, text, logprobs) == template.whole(3, text, logprobs)
