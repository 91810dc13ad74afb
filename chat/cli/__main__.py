"""``python -m chat.cli``: the `turncache` command (restart_bench starts its servers this way)."""

from chat.cli import main

raise SystemExit(main())
