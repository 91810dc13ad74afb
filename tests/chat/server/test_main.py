"""``turncache serve``'s assembly (``chat/server/main.py``): the prefix cache, the batch and the volatile lines the
settings ask for, the shutdown that writes the disk tier's queue, SIGTERM as a clean exit, and a malformed keys
file refused before the model loads. (The flags reaching these, and a bad chat template refused:
tests/chat/cli/test_serve.py.)"""

from __future__ import annotations

import logging

import pytest

from chat.cli import main as cli_main
from chat.server import main
from chat.server.settings import MiB, ServerSettings
from tests.chat.server.tenancy.test_auth import KEY_A


def settings(**values) -> ServerSettings:
    return ServerSettings(**{"sessions_db": None, **values})


def test_the_prefix_cache_has_the_settings_budgets_and_a_disk_tier_only_with_a_directory(tmp_path):
    stats = main.build_cache(settings(device_cache_mib=3, host_cache_mib=5, cache_dir="")).stats()
    assert (stats.budget_per_tier["device"], stats.budget_per_tier["host"]) == (3 * MiB, 5 * MiB)
    assert stats.disk_healthy is None  # no directory: no disk tier, whatever the disk budget
    cache = main.build_cache(settings(cache_dir=str(tmp_path), disk_budget=7 * MiB))
    assert cache.stats().disk_healthy is True and cache.stats().budget_per_tier["disk"] == 7 * MiB
    cache.close(timeout=5)
    assert main.build_cache(settings(prefix_cache=False)) is None


def test_the_batch_and_the_volatile_lines_are_the_settings():
    batch = main.batch_settings(settings(max_batch=3, token_budget=512, yield_budget=16, yield_hold_s=0.5))
    assert (batch.max_batch, batch.token_budget, batch.yield_budget, batch.yield_hold_s) == (3, 512, 16, 0.5)
    lines = main.volatile_lines(settings(volatile_lines=[r"^Date: .*$"], keep_volatile_lines=True))
    assert lines.patterns == (r"^Date: .*$",) and lines.drop is False
    assert main.volatile_lines(settings()).drop is True


class _Cache:
    def __init__(self, disk_healthy, written=True) -> None:
        self.disk_healthy, self.written, self.closed_with = disk_healthy, written, None

    def stats(self):
        return self

    def close(self, timeout):
        self.closed_with = timeout
        return self.written


class _Engine:
    def __init__(self, cache) -> None:
        self.cache, self.closed = cache, False

    def close(self):
        self.closed = True


@pytest.mark.parametrize(("healthy", "written", "said"), [(True, True, "flushed"), (False, False, "NOT fully flushed")])
def test_a_shutdown_stops_the_engine_then_writes_the_disk_tiers_queue(healthy, written, said, caplog):
    engine = _Engine(_Cache(healthy, written))
    with caplog.at_level(logging.INFO, "turncache.server"):
        main.close_engine(engine)
    assert engine.closed and engine.cache.closed_with == main.SHUTDOWN_FLUSH_S
    assert f"disk tier {said} at shutdown" in caplog.text


@pytest.mark.parametrize("cache", [None, _Cache(None)])  # no prefix cache; no disk tier
def test_a_shutdown_without_a_disk_tier_only_stops_the_engine(cache):
    engine = _Engine(cache)
    main.close_engine(engine)
    assert engine.closed and (cache is None or cache.closed_with is None)


def test_sigterm_ends_serve_with_status_0():
    with pytest.raises(SystemExit) as info:
        main._exit_cleanly(15, None)
    assert info.value.code == 0


def test_serve_refuses_a_malformed_keys_file_before_loading_the_model(tmp_path, capsys):
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} alice\ntoo-short bob\n")
    with pytest.raises(SystemExit) as info:
        cli_main(["serve", "--model", "no-such-model", "--api-keys-file", str(path), "--sessions-db", ""])
    message = str(info.value.code)
    assert message.startswith("turncache: --api-keys-file") and str(path) in message and "entry 2" in message
    assert KEY_A not in message and "too-short" not in message
    assert "loading" not in capsys.readouterr().err  # refused before the model
