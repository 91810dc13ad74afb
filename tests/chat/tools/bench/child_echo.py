"""A child for test_child_process.py: ``python -m tests.chat.tools.bench.child_echo '<config as JSON>'``.

Config ``{"ready": "<first line>", "exit": N, "report": bool}``: says the first line, reads one line from standard
input, then (``report``) prints a line of chatter and one JSON object with the config and the line it was told, and
exits with ``exit``. A child told ``"hang"`` sleeps instead."""

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    print(config.get("ready", "ready"), flush=True)
    told = sys.stdin.readline().strip()
    if told == "hang":
        time.sleep(60)
    if config.get("report", True):
        print("some chatter first", flush=True)
        print(json.dumps({"config": config, "told": told, "pid": os.getpid()}), flush=True)
    return config.get("exit", 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
