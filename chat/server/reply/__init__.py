"""The one reply pipeline every surface goes through: a wire request's messages and sampling settings as the
engine's turns (``turns``, ``tools_api``, ``reasoning_api``; each surface's converter makes a ``reader.Prepared``),
one admission (``admission``: the model or a LoRA adapter of it (``adapters``), grammar, the tenant's limits), the
turns run side by side and paced to the client (``choices``), and one reply reader (``reader``: text, thinking, tool
calls, the settle step, usage, errors, slow clients) whose typed events each surface's encoder turns into its wire
events."""
