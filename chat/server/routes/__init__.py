"""The app's routes, one module per surface or concern, each with ``register(app, parts)``
(``chat.server.app.create_app`` calls them in order): ``errors`` (exception handlers: every error in its surface's
shape), ``ops`` (``/health``, ``/metrics``, ``/v1/models``), ``openai`` (chat completions, completions, responses),
``anthropic`` (messages, count_tokens), ``tokens`` (``/tokenize``, ``/detokenize``), ``chat_socket`` (``/v1/ws``) and
``web`` (the web UI, mounted last). ``parts`` is what they share (:class:`~chat.server.routes.parts.ServerParts`)."""
