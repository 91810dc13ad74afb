"""What runs around the serving path, never on it: the Python client of the WebSocket protocol (``client``), the
evaluation runner (``evaluation``, ``turncache eval``), the benchmarks (``bench``, ``turncache bench``), the terminal
chat (``terminal``, ``turncache chat``) and test scaffolding (``testing``: tiny seeded models, stock transformers
baselines). The serving path (``chat.server`` -> ``chat.protocol`` -> ``chat.engine`` -> ``chat.models``, and
``chat.cluster``) imports none of it, but for ``--model tiny-*``, whose models are built by ``chat.tools.testing``.
"""
