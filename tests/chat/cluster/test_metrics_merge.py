"""Several replicas' /metrics as one exposition with a replica label."""

from chat.cluster.metrics_merge import merge, routing_families, with_label
from chat.cluster.routing import ReplicaView

ONE = """# HELP turncache_turns_total Turns finished.
# TYPE turncache_turns_total counter
turncache_turns_total 3
# HELP turncache_finished_turns_total Finished turns by finish reason.
# TYPE turncache_finished_turns_total counter
turncache_finished_turns_total{reason="stop"} 2
# HELP turncache_ttft_seconds Time to first token.
# TYPE turncache_ttft_seconds histogram
turncache_ttft_seconds_bucket{le="0.1"} 1
turncache_ttft_seconds_bucket{le="+Inf"} 3
turncache_ttft_seconds_sum 0.9
turncache_ttft_seconds_count 3
"""


def test_a_label_is_added_to_every_kind_of_sample():
    assert with_label("m 3", "replica", "r1") == 'm{replica="r1"} 3'
    assert with_label('m{a="x"} 3', "replica", "r1") == 'm{replica="r1",a="x"} 3'
    assert with_label("m{} 3", "replica", "r1") == 'm{replica="r1"} 3'
    assert with_label("m 3", "replica", 'a"b') == 'm{replica="a\\"b"} 3'


def test_families_are_grouped_once_with_every_replicas_samples():
    text = merge([("r1", ONE), ("r2", ONE.replace(" 3\n", " 5\n"))])
    lines = text.splitlines()
    assert lines.count("# TYPE turncache_ttft_seconds histogram") == 1
    turns = [line for line in lines if line.startswith("turncache_turns_total")]
    assert turns == ['turncache_turns_total{replica="r1"} 3', 'turncache_turns_total{replica="r2"} 5']
    start = lines.index("# TYPE turncache_ttft_seconds histogram")
    family = lines[start + 1 : start + 9]  # the histogram's 8 samples follow its TYPE line, nothing else between
    assert all(line.startswith("turncache_ttft_seconds_") for line in family)
    assert 'turncache_ttft_seconds_bucket{replica="r2",le="+Inf"} 5' in family
    assert merge([]) == ""


def test_routing_families_report_each_replica():
    views = [ReplicaView("r1", 2, 1, 10, {"session": 3, "prefix": 1}), ReplicaView("r2", 0, 0, 0, {})]
    text = routing_families(views, lost_turns=1)
    assert "turncache_cluster_replicas 2" in text
    assert 'turncache_cluster_turns_inflight{replica="r1"} 2' in text
    assert 'turncache_cluster_routed_total{replica="r1",rule="session"} 3' in text
    assert "turncache_cluster_lost_turns_total 1" in text
    assert all(line.startswith("#") or " " in line for line in text.splitlines())
