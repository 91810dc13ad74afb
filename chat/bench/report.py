"""How every benchmark prints its result: one JSON object, or a readable table with the issue's targets."""

from __future__ import annotations

import json
from collections.abc import Mapping


def format_table(result: Mapping[str, object], targets: Mapping[str, tuple[str, float]]) -> str:
    lines = [f"{'figure':<28}{'value':>14}  target"]
    for key, value in result.items():
        target = targets.get(key)
        if isinstance(value, float):
            shown = f"{value:,.4f}"
        elif isinstance(value, int):
            shown = f"{value:,}"
        else:
            shown = str(value)
        lines.append(f"{key:<28}{shown:>14}  {'' if target is None else ' '.join(map(str, target))}")
    return "\n".join(lines)


def emit(result: Mapping[str, object], targets: Mapping[str, tuple[str, float]], as_json: bool) -> None:
    print(json.dumps(result) if as_json else format_table(result, targets))
