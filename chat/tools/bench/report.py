"""How every benchmark prints its result: one JSON object, or a readable table with the issue's targets."""

from __future__ import annotations

import json
from collections.abc import Mapping


def _shown(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, list) and len(value) > 8:  # samples: their count and range
        return f"{len(value)} values, {min(value, default=0):.4g}..{max(value, default=0):.4g}"
    if isinstance(value, list):  # a series (per turn, per entry count): compact
        return "[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value) + "]"
    return str(value)


def format_table(result: Mapping[str, object], targets: Mapping[str, tuple[str, float]]) -> str:
    lines = [f"{'figure':<28}{'value':>14}  target"]
    for key, value in result.items():
        target = targets.get(key)
        shown = _shown(value)
        lines.append(f"{key:<28}{shown:>14}  {'' if target is None else ' '.join(map(str, target))}")
    return "\n".join(lines)


def emit(result: Mapping[str, object], targets: Mapping[str, tuple[str, float]], as_json: bool) -> None:
    print(json.dumps(result) if as_json else format_table(result, targets))
