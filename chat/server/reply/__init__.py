"""The one reply pipeline every surface goes through: a wire request's messages and sampling settings as the
engine's turn (``turns``, ``tools_api``, ``reasoning_api``), several turns of one request (``choices``)."""
