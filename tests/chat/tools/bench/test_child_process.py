"""chat/tools/bench/child_process.py: a helper process that says "ready", is told to go, and reports one JSON object
on its last line; one that does not start or does not report is an error that names it, and one still running when
the block ends is killed."""

import os
import subprocess

import pytest

from chat.tools.bench.child_process import child_report, ready_child

CHILD = "tests.chat.tools.bench.child_echo"


def test_a_ready_child_is_told_to_go_and_its_last_line_is_its_report():
    with ready_child(CHILD, {"n": 3}, "the echo") as process:
        report = child_report(process, "go\n", 60, "the echo")
    assert report == {"config": {"n": 3}, "told": "go", "pid": process.pid} and process.pid != os.getpid()


def test_a_child_that_does_not_say_ready_is_refused_and_killed():
    refused = pytest.raises(RuntimeError, match=r"the echo did not start \(said 'starting\\n'")
    with refused, ready_child(CHILD, {"ready": "starting"}, "the echo"):
        pytest.fail("entered the block")


@pytest.mark.parametrize("config", [{"exit": 2}, {"report": False}], ids=["failed", "silent"])
def test_a_child_that_fails_or_reports_nothing_is_an_error_naming_it(config):
    failed = pytest.raises(RuntimeError, match=r"the echo failed \(exit")
    with ready_child(CHILD, config, "the echo") as process, failed:
        child_report(process, "go\n", 60, "the echo")


def test_a_child_still_running_when_the_block_ends_is_killed():
    with pytest.raises(subprocess.TimeoutExpired), ready_child(CHILD, {}, "the echo") as process:
        child_report(process, "hang\n", 0.5, "the echo")
    assert process.returncode is not None and process.returncode < 0  # killed, not ended
