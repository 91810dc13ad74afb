"""One Prometheus text exposition from several replicas' ``/metrics``: every sample gets a ``replica`` label.

Each replica renders exactly what a single-process server renders (so metrics added there appear here); the
ingress adds the label and groups the samples of each metric family under one ``# HELP`` / ``# TYPE`` pair, as the
format requires. A family's samples are the lines after its ``# TYPE`` line (histograms: ``_bucket``, ``_sum``,
``_count``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Family:
    help: str | None = None  # the "# HELP" line
    type: str | None = None  # the "# TYPE" line
    samples: list[str] = field(default_factory=list)


def with_label(sample: str, name: str, value: str) -> str:
    """``metric{a="1"} 3`` -> ``metric{name="value",a="1"} 3``; ``metric 3`` -> ``metric{name="value"} 3``."""
    label = f'{name}="{escape(value)}"'
    head, _, rest = sample.partition(" ")
    if head.endswith("}") and "{" in head:
        metric, _, labels = head[:-1].partition("{")
        return f"{metric}{{{label},{labels}}} {rest}" if labels else f"{metric}{{{label}}} {rest}"
    return f"{head}{{{label}}} {rest}"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def merge(texts: Iterable[tuple[str, str]], label: str = "replica") -> str:
    """``(replica, exposition text)`` pairs -> one exposition text, families in first-seen order."""
    families: dict[str, _Family] = {}
    for replica, text in texts:
        current: _Family | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                current = families.setdefault(name, _Family())
                if line.startswith("# HELP "):
                    current.help = current.help or line
                else:
                    current.type = current.type or line
                continue
            if line.startswith("#"):
                continue
            if current is None:  # a sample before any TYPE line: a family of its own
                current = families.setdefault(line.split("{", 1)[0].split(" ", 1)[0], _Family())
            current.samples.append(with_label(line, label, replica))
    out: list[str] = []
    for family in families.values():
        out.extend(line for line in (family.help, family.type) if line)
        out.extend(family.samples)
    return "\n".join(out) + "\n" if out else ""


def routing_families(views: Iterable, lost_turns: int) -> str:
    """The ingress's own families, from ``RoutingTable.snapshot()`` (``ReplicaView`` records)."""
    views = list(views)
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"))
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    def per_replica(attr: str) -> list[tuple[str, float]]:
        return [(f'{{replica="{escape(v.replica)}"}}', getattr(v, attr)) for v in views]

    family("turncache_cluster_replicas", "gauge", "Engine replicas taking turns.", [("", len(views))])
    family("turncache_cluster_turns_inflight", "gauge", "Turns routed and not finished.", per_replica("inflight"))
    family(
        "turncache_cluster_pinned_sessions",
        "gauge",
        "WebSocket sessions whose last turn this ingress routed here.",
        per_replica("pinned_sessions"),
    )
    family(
        "turncache_cluster_prefix_blocks",
        "gauge",
        "Prompt blocks whose last server is the replica.",
        per_replica("prefix_blocks"),
    )
    routed = [
        (f'{{replica="{escape(v.replica)}",rule="{rule}"}}', n) for v in views for rule, n in sorted(v.routed.items())
    ]
    family("turncache_cluster_routed_total", "counter", "Turns routed, by replica and rule.", routed)
    family("turncache_cluster_lost_turns_total", "counter", "Turns cut off by a lost replica.", [("", lost_turns)])
    return "\n".join(lines) + "\n"
