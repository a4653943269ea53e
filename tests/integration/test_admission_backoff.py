"""A provider's own 429 on a create (issue 42 item 3): for a kind a ``[limits]`` account names,
the 429 slows the whole fleet instead of failing the call: ``callwarden.slow_down`` pauses
the account's starts and halves its caps (once per pause, however many 429s arrive), the
call creates again after the pause until ``rate_limited_wait_s`` runs out, and only then
fails and refunds, naming the account; each admitted start adds one call's worth back.
Driven through ``CallRunner.run`` against the simulator over HTTP (its 429 fault), the
limit rows written by plain SQL; the runner's sleep returns at once (no real time waited)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from callwarden import OwnCalls
from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import load_events
from callwarden.events.types import UpstreamFailed
from callwarden.providers.base import ProviderSettings, RetryPolicy
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.replay.verify import verify_job
from tests.support import no_sleep

KIND = "kie-standard"
REQUEST: dict[str, Any] = {"model": "nano-banana-pro",
                           "input": {"prompt": "a cat", "_sim": {"steps": [],
                                                                 "end": "succeeded"}}}
ATTEMPTS = 2  # the transport's tries per create before the runner sees RateLimited


def runner(pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator, tmp_path: Path,
           **config: Any) -> CallRunner:
    settings = msgspec.structs.replace(
        ProviderSettings.for_simulator(sim.base_url),
        retry=RetryPolicy(max_attempts=ATTEMPTS, base_delay_s=0.0, max_delay_s=0.0))
    return CallRunner(pool, http, settings, LocalFolderStore(tmp_path / "media"),
                      config=CallConfig(**config), sleep=no_sleep)


async def row(conn: Conn, sql: str, *args: Any) -> dict[str, Any]:
    found = await (await conn.execute(sql, args)).fetchone()
    assert found is not None
    return dict(found)


async def limit(conn: Conn) -> None:
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight, wait_s) "
                       "VALUES ('kie-main', ARRAY['kie-standard'], 4, 30)")


def creates(sim: RunningSimulator) -> tuple[int, int]:
    entries = sim.sim.journal.entries("kie", "create")
    return len(entries), sum(e.processed for e in entries)


async def test_a_429_pauses_the_account_halves_it_once_and_the_call_completes_once(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    """Two rounds of 429 (each past the transport's retries): the call is not failed; it
    creates a third time and completes with one task, committing once. The account is
    paused (a new start waits, naming the 429) and its factor halved once (0.5, not 0.25:
    the second 429 came inside the first pause), so its cap of 4 admits 2."""
    await limit(conn)
    sim.sim.faults.arm("kie", "create", Fault(kind="rate_limit", times=2 * ATTEMPTS))
    job = await create_job(conn, credits=10)
    out = await runner(pool, http, sim, tmp_path).run(job, KIND, REQUEST)
    assert out.result == "completed"
    assert creates(sim) == (2 * ATTEMPTS + 1, 1)
    assert len(sim.sim.tasks.all()) == 1
    paused = await row(conn, "SELECT rate_factor, paused_until > now() AS paused "
                             "FROM callwarden.limits")
    assert paused == {"rate_factor": 0.5, "paused": True}
    later = await create_job(conn, credits=10)
    waits = await runner(pool, http, sim, tmp_path).run(later, KIND, REQUEST)
    assert waits.result == "waiting"
    assert waits.detail == "kie-main: the provider refused a create (429): paused"
    assert waits.retry_after_s is not None
    assert 0 < waits.retry_after_s <= 30

    # the pause over for 31 s (one wait_s): 0.5 + 1/4, a cap of 3; the two calls held
    # (3 starts by SQL: the third waits) and the completed one do not count
    await conn.execute("UPDATE callwarden.limits SET paused_until = now() - interval '31 s'")
    held = [await create_job(conn, credits=1) for _ in range(4)]
    actions = [(await row(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:1')",
                          job_id, KIND))["action"] for job_id in held]
    assert actions == ["create", "create", "create", "wait"]
    why = await row(conn, "SELECT * FROM callwarden.waiting_for(%s)", held[3])
    assert why["reason"] == "kie-main: 3 of 3 calls in flight"
    await conn.execute("UPDATE callwarden.limits SET paused_until = now() - interval '61 s'")
    assert (await row(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:1')",
                      held[3], KIND))["action"] == "create"  # 0.5 + 2/4: the cap of 4
    assert await verify_job(conn, job) == []


async def test_when_the_wait_runs_out_the_call_fails_and_refunds_naming_the_account(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    """rate_limited_wait_s shorter than the account's pause: the first 429 fails the call
    (UpstreamFailed rate_limited, its error naming the account and the setting), refunded;
    the fleet is still slowed for the others."""
    await limit(conn)
    sim.sim.faults.arm("kie", "create", Fault(kind="rate_limit", times=ATTEMPTS))
    job = await create_job(conn, credits=10)
    out = await runner(pool, http, sim, tmp_path, rate_limited_wait_s=1.0).run(
        job, KIND, REQUEST)
    assert out.result == "failed"
    failed = (await load_events(conn, job))[-1]
    assert isinstance(failed, UpstreamFailed)
    assert failed.code == "rate_limited"
    assert "account kie-main" in failed.error
    assert "rate_limited_wait_s, 1 s" in failed.error
    settled = await row(conn, "SELECT status FROM usage_logs WHERE job_id = %s", job)
    assert settled["status"] == "refunded"
    assert (await row(conn, "SELECT rate_factor FROM callwarden.limits"))["rate_factor"] == 0.5


@pytest.mark.parametrize("retry_after", [None, 7.0])
async def test_slow_down_pauses_for_the_providers_retry_after_or_the_accounts_wait(
        conn: Conn, retry_after: float | None) -> None:
    """slow_down answers the account, the pause (the provider's Retry-After when it gave
    one, else wait_s) and the factor; a kind no limit names answers no row."""
    await limit(conn)
    got = await row(conn, "SELECT * FROM callwarden.slow_down(%s, %s)", KIND, retry_after)
    assert got["account"] == "kie-main"
    assert got["rate_factor"] == 0.5
    assert (retry_after or 30) - 1 < got["paused_s"] <= (retry_after or 30)
    none = await (await conn.execute("SELECT * FROM callwarden.slow_down('replicate-prediction',"
                                     " 1)")).fetchall()
    assert none == []


async def test_a_sync_calls_429_slows_its_account_and_it_calls_again(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    """anthropic-sync in a limited account, its call answered 429 (past the transport's
    retries) once: the account is paused and halved, and the call is made again and
    completes, committing once, where before it failed and refunded at the first 429."""
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight, wait_s) "
                       "VALUES ('anthropic-main', ARRAY['anthropic-sync'], 4, 30)")
    sim.sim.faults.arm("anthropic", "call", Fault(kind="rate_limit", times=ATTEMPTS))
    job = await create_job(conn, credits=10)
    out = await runner(pool, http, sim, tmp_path).run(job, "anthropic-sync", {
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert out.result == "completed"
    calls = sim.sim.journal.entries("anthropic", "call")
    assert (len(calls), sum(e.processed for e in calls)) == (ATTEMPTS + 1, 1)
    slowed = await row(conn, "SELECT rate_factor, paused_until > now() AS paused "
                             "FROM callwarden.limits")
    assert slowed == {"rate_factor": 0.5, "paused": True}
    settled = await row(conn, "SELECT status FROM usage_logs WHERE job_id = %s", job)
    assert settled["status"] == "committed"
    assert await verify_job(conn, job) == []


async def test_an_own_calls_429_slows_its_account_then_fails_naming_it(
        conn: Conn, pool: Pool, tmp_path: Path) -> None:
    """A host's own create refused with 429 (its code makes the request): rate_limited
    pauses and halves the kind's account and answers the wait (the provider's 7 s, up to a
    quarter more); once rate_limited_wait_s (12 s) cannot hold the next wait (20 s), the
    call is failed
    (rate_limited, naming the account) and refunded, and None answered. A kind no limit
    names fails at the first 429 with the host's own text."""
    await limit(conn)
    calls = OwnCalls(pool, media=LocalFolderStore(tmp_path / "media"),
                     config=CallConfig(rate_limited_wait_s=12.0))
    job = await create_job(conn, credits=10)
    call = await calls.start(job, KIND)
    assert call.action == "create"
    wait = await call.rate_limited(7.0)
    assert wait is not None
    assert 7.0 <= wait <= 8.75
    assert (await row(conn, "SELECT rate_factor FROM callwarden.limits"))["rate_factor"] == 0.5
    assert await call.rate_limited(20.0) is None  # a 20 s pause would pass the 12 s
    failed = (await load_events(conn, job))[-1]
    assert isinstance(failed, UpstreamFailed)
    assert failed.code == "rate_limited"
    assert "account kie-main" in failed.error
    settled = await row(conn, "SELECT status FROM usage_logs WHERE job_id = %s", job)
    assert settled["status"] == "refunded"

    other = await create_job(conn, credits=10)
    unlimited = await calls.start(other, "replicate-prediction")
    assert await unlimited.rate_limited(1.0, error="acme said 429") is None
    plain = (await load_events(conn, other))[-1]
    assert isinstance(plain, UpstreamFailed)
    assert plain.error == "acme said 429"
    assert await verify_job(conn, job) == []
