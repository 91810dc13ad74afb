"""Every limit the wire enforces, in one place, for both transports: the WebSocket protocol and the
OpenAI-compatible HTTP API (``chat/server/surfaces/openai_api.py``) read the same constants through the same content and
sampling types.

The parser and the wire types read these constants; ``docs/protocol.md`` lists them in a table (and
``docs/security.md`` with every other limit). A server should also pass :data:`MAX_FRAME_BYTES` to its WebSocket
library (``max_size``) so that a larger frame is refused before it is buffered.
"""

from __future__ import annotations

from typing import Literal, get_args

MAX_FRAME_BYTES = 16 * 1024 * 1024  # one client frame, UTF-8 bytes (media travels inside it, base64-encoded)
MAX_JSON_DEPTH = 200  # nesting depth the JSON parser accepts (pydantic-core's recursion limit; events need < 10)
MAX_EVENT_ID_CHARS = 128  # a client-chosen event_id
MAX_ID_CHARS = 128  # a session, turn or message id sent back by the client
MAX_MODEL_CHARS = 256  # a model name

MAX_TEXT_CHARS = 262_144  # text of one message (all its text parts together), also the system prompt
MAX_PARTS_PER_MESSAGE = 64  # content parts in one message
MAX_MEDIA_PER_TURN = 16  # image / audio / video items in the content of one turn.create or turn.edit
MAX_MESSAGES = 512  # messages in one conversation (a session's, a completion.create list, an HTTP request), system
# included
MAX_MEDIA_PER_CONVERSATION = 64  # media items in one conversation

MAX_TEMPERATURE = 5.0  # temperature is in [0, MAX_TEMPERATURE]; 0 means greedy
MAX_TOP_K = 1_000_000  # top_k is in [0, MAX_TOP_K]; 0 means no limit
MAX_SEED = 2**63 - 1  # seed is in [0, MAX_SEED]
MAX_REPLY_TOKENS = 32_768  # max_tokens is in [1, MAX_REPLY_TOKENS] (0 too in /v1/completions); the engine also
# caps it by the context window
MAX_STOP_STRINGS = 8  # stop strings per request
MAX_STOP_CHARS = 256  # characters in one stop string
MAX_TOP_LOGPROBS = 20  # top_logprobs (and /v1/completions' logprobs) is in [0, MAX_TOP_LOGPROBS]
MAX_LOGIT_BIAS = 1024  # entries in logit_bias (each bias in [-100, 100])
MAX_REPETITION_PENALTY = 10.0  # repetition_penalty is in (0, MAX_REPETITION_PENALTY]; 1 = off
MAX_GRAMMAR_CHARS = 65_536  # a regex or grammar of structured_outputs (a JSON schema: its canonical JSON)
MAX_CHOICES_N = 16  # n (replies per request) is in [1, MAX_CHOICES_N] unless the server sets a lower cap
MAX_COMPLETION_PROMPTS = 256  # prompts in one /v1/completions request
MAX_PRIORITY = 100  # priority (vLLM's field; lower is served sooner) is in [-MAX_PRIORITY, MAX_PRIORITY]

AudioFormat = Literal["wav", "mp3", "flac", "ogg", "opus", "webm", "m4a"]  # input_audio.format values
AUDIO_FORMATS: tuple[str, ...] = get_args(AudioFormat)
