"""Riding through an outage (engine/database/outage.py): one log line when it starts and one
when it ends however many attempts fail, a bounded jittered backoff, and the process's
/metrics saying how long the database has been down and whether that is past the limit."""

from __future__ import annotations

import logging
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from callwarden.database.outage import (
    DEFAULT_LIMIT_S,
    LIMIT_ENV,
    Outage,
    configured_limit_s,
    until_up,
)
from callwarden.errors import ConfigError, DatabaseUnavailable
from callwarden.service.metrics import exposition


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def samples(role: str) -> dict[str, float]:
    text = exposition().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("role") == role}


def drill_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the drill's own logger said (caplog also catches the root logger's records: a
    garbage-collected aiohttp session of an earlier test logs "Unclosed connector" through
    asyncio's, at any moment; a CI run saw it land inside this test)."""
    return [r.getMessage() for r in caplog.records if r.name == "callwarden.test"]


def test_an_outage_is_logged_once_and_measured(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    outage = Outage(logging.getLogger("callwarden.test"), "drill w:1", limit_s=300,
                    rng=random.Random(1), clock=clock)
    before = samples("drill").get("callwarden_database_outages_total", 0.0)
    with caplog.at_level(logging.WARNING, logger="callwarden.test"):
        delays = [outage.down(DatabaseUnavailable("gone")) for _ in range(20)]
        clock.t += 42
        seen = samples("drill")
        assert seen["callwarden_database_down_seconds"] == 42
        assert seen["callwarden_database_outage_over_limit"] == 0
        assert seen["callwarden_database_outages_total"] == before + 1
        clock.t += 300
        assert samples("drill")["callwarden_database_outage_over_limit"] == 1
        outage.up()
    assert drill_lines(caplog) == [
        "drill w:1: database unavailable, retrying with backoff: gone",
        "drill w:1: database back after 342.0 s (20 failed attempts)"]
    assert all(0 <= d <= 5.0 for d in delays)
    assert max(delays) > 1.0  # it backs off, not a tight loop
    after = samples("drill")
    assert after["callwarden_database_down_seconds"] == 0
    assert after["callwarden_database_outage_over_limit"] == 0
    assert (outage.outages, outage.downtime_s) == (1, 342.0)


async def test_until_up_retries_only_unavailability() -> None:
    outage = Outage(logging.getLogger("callwarden.test"), "drill2", rng=random.Random(2))
    calls: list[int] = []
    waits: list[float] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise DatabaseUnavailable("down")
        return "ok"

    async def sleep(s: float) -> None:
        waits.append(s)

    assert await until_up(flaky, outage, sleep=sleep) == "ok"
    assert (len(calls), len(waits), outage.is_down, outage.outages) == (4, 3, False, 1)

    async def broken() -> str:
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError, match="a bug"):
        await until_up(broken, outage, sleep=sleep)


def test_an_outage_over_its_limit_is_said_once_and_reported(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    outage = Outage(logging.getLogger("callwarden.test"), "drill3", limit_s=10,
                    rng=random.Random(3), clock=clock)
    with caplog.at_level(logging.WARNING, logger="callwarden.test"):
        outage.down(DatabaseUnavailable("gone"))
        assert outage.report() == {"down_s": 0.0, "limit_s": 10, "over_limit": False}
        clock.t += 10.5
        for _ in range(5):
            outage.down(DatabaseUnavailable("gone"))
        assert outage.report() == {"down_s": 10.5, "limit_s": 10, "over_limit": True}
        outage.up()
        outage.down(DatabaseUnavailable("again"))  # a new outage: said again when over
        clock.t += 11
        outage.down(DatabaseUnavailable("again"))
    over = [r for r in caplog.records if "longer than the outage limit" in r.getMessage()]
    assert [r.levelno for r in over] == [logging.ERROR, logging.ERROR]
    assert "CALLWARDEN_DB_OUTAGE_LIMIT_S=10" in over[0].getMessage()


@pytest.mark.parametrize(("raw", "limit"), [(None, DEFAULT_LIMIT_S), ("", DEFAULT_LIMIT_S),
                                             ("2.5", 2.5), (" 60 ", 60.0)])
def test_the_outage_limit_comes_from_the_environment(raw: str | None, limit: float) -> None:
    env = {} if raw is None else {LIMIT_ENV: raw}
    assert configured_limit_s(env) == limit


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan", "inf", "1e999"])
def test_a_bad_outage_limit_is_a_config_error_naming_it(raw: str) -> None:
    with pytest.raises(ConfigError, match=LIMIT_ENV):
        configured_limit_s({LIMIT_ENV: raw})
