"""Chat completions (``chat/server/surfaces/openai_api.py``): the stream chunks written from templates are the
generic chunks. (Over HTTP: tests/chat/server/test_http.py, test_openai_surface.py; the bytes: test_wire_bodies.py.)"""

from __future__ import annotations

import orjson

from chat.server.surfaces.openai_api import ChunkEncoder
from chat.server.surfaces.openai_types import ChunkLogprobs, ContentDelta, ReasoningDelta, TokenLogprob, TopLogprob


def test_a_content_chunk_encoded_from_its_template_is_the_generic_chunk():
    encoder = ChunkEncoder("chatcmpl-x", 123, 'm"odel')
    for text in ("plain", 'quote " and \\ and \n', "ünï ✓ \u2028", ""):
        fast, generic = encoder.content(3, text), encoder.whole(3, ContentDelta(content=text))
        assert fast.startswith(b"data: ") and fast.endswith(b"\n\n")
        assert fast == generic and orjson.loads(fast[6:])["choices"][0]["delta"] == {"content": text}
        top = [TopLogprob(token=text, logprob=-1.0, bytes=[1])]
        logprobs = ChunkLogprobs(content=[TokenLogprob(token=text, logprob=-0.5, bytes=[1], top_logprobs=top)])
        for delta, lp in ((ReasoningDelta(reasoning_content=text), None), (ContentDelta(content=text), logprobs)):
            assert encoder.encoded(3, delta, lp) == encoder.whole(3, delta, lp)
