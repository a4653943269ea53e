"""A provider outage longer than a kind's stale threshold (issue 15): the simulator
answers 503 on a route for a stretch of simulated time (``Fault(for_s=...)``), then
recovers. Time is the simulator's clock, advanced by the test (no real waiting), and the
reconciler's logical ``now`` moves with it.

Invariants, for every case: no upstream task is created twice (the simulator's journal),
every reservation is settled at most once and only from ``reserved``, and once the
provider is back every call ends the way its upstream task did — or, past the attempt
cap, ``exhausted`` with its credits refunded (never also committed)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
import msgspec

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.events.states import CallState
from callwarden.providers.base import RetryPolicy
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.loop import Counts, Reconciler
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeReconciler, MakeRunner
from tests.support.calls import NOW_SCRIPT, dead_worker_call, row, upstream_task

KIND, PROVIDER = "kie-standard", "kie"
THRESHOLD_S = 600.0  # kie-standard's stale threshold (the seed's 10 minutes)
DOWN = Fault(kind="http_status", status=503, for_s=2 * THRESHOLD_S)


async def passes_through_the_outage(reconciler: Reconciler, sim: RunningSimulator,
                                    t: datetime, route: str) -> tuple[datetime, Counts]:
    """Reconcile just after every re-poll interval (the simulator's clock moved with
    ``now``) until the provider's outage on ``route`` is over; the time reached and the
    summed counts."""
    step = reconciler.config.repoll_interval_s + 1
    total = Counts()
    while sim.sim.faults.outage_left_s(PROVIDER, route) > 0:
        counts = await reconciler.reconcile_once(t)
        total.errors += counts.errors
        total.exhausted += counts.exhausted
        total.completed += counts.completed
        sim.sim.clock.advance(step)
        t += timedelta(seconds=step)
    return t, total


async def dead_calls(conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
                     n: int) -> list[uuid.UUID]:
    """``n`` calls whose upstream task succeeded while their worker was dead, just past
    the threshold (11 minutes old)."""
    return [await dead_worker_call(conn, KIND, await upstream_task(http, sim, KIND, NOW_SCRIPT),
                                   age=timedelta(minutes=11)) for _ in range(n)]


async def test_a_poll_outage_longer_than_the_threshold_is_ridden_out_then_recovered(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    jobs = await dead_calls(conn, http, sim, 4)
    sim.sim.faults.arm(PROVIDER, "poll", DOWN)
    reconciler = make_reconciler()  # 18 attempts, every 300 s
    t, during = await passes_through_the_outage(reconciler, sim, utcnow(), "poll")
    assert (during.errors, during.completed, during.exhausted) == (4 * 4, 0, 0)  # 4 passes
    for job in jobs:  # each failed poll an attempt; the reservation untouched
        r = await row(conn, job)
        assert (r["call_state"], r["reconcile_attempts"], r["credits"]) == (
            "polling", 4, "reserved")
        assert "503" in r["reconcile_last_error"]
    after = await reconciler.reconcile_once(t)
    assert (after.recovered, after.completed) == (4, 4)
    for job in jobs:
        r = await row(conn, job)
        assert (r["status"], r["credits"], r["credits_charged"]) == ("completed", "committed",
                                                                      10)
        assert await verify_job(conn, job) == []
    assert sim.sim.journal.count(PROVIDER, "create") == 4  # the tests' own, one per job
    polls = sim.sim.journal.entries(PROVIDER, "poll")
    assert len([e for e in polls if e.fault is None]) == 4  # one answered poll per job
    assert len([e for e in polls if e.fault is not None]) >= 4 * 4  # each pass polled


async def test_an_outage_past_the_attempt_cap_exhausts_and_refunds_once(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    jobs = await dead_calls(conn, http, sim, 3)
    sim.sim.faults.arm(PROVIDER, "poll", Fault(kind="http_status", status=503,
                                               for_s=10_000))
    reconciler = make_reconciler(attempt_cap=2, repoll_interval_s=3000)
    t, during = await passes_through_the_outage(reconciler, sim, utcnow(), "poll")
    assert (during.errors, during.exhausted, during.completed) == (3 * 2, 3, 0)
    # The provider is back and every task succeeded upstream: an exhausted call stays so.
    later = await reconciler.reconcile_once(t + timedelta(hours=2))
    assert (later.claimed, later.completed) == (0, 0)
    for job in jobs:
        r = await row(conn, job)
        assert (r["status"], r["error_message"], r["credits"], r["credits_charged"]) == (
            "failed", "reconcile_exhausted", "refunded", 0)
        assert await verify_job(conn, job) == []
    assert sim.sim.journal.count(PROVIDER, "create") == 3


async def test_a_create_outage_is_refunded_and_never_created_again(
        conn: Conn, sim: RunningSimulator, make_runner: MakeRunner,
        make_reconciler: MakeReconciler) -> None:
    """The worker's create gets 503 (ambiguous: the task may exist), so the call is left
    for the reconciler; past the threshold it is swept and refunded without a second
    create, during the outage and after it."""
    sim.sim.faults.arm(PROVIDER, "create", DOWN)
    runner = make_runner()
    jobs = [await create_job(conn, credits=10) for _ in range(3)]
    for job in jobs:
        outcome = await runner.run(job, KIND, {"model": "nano-banana-pro",
                                               "input": {"prompt": "a cat"}})
        assert outcome.projection.state is CallState.CREATED
    assert sim.sim.journal.count(PROVIDER, "create") == 3
    reconciler = make_reconciler()
    t = utcnow() + timedelta(seconds=THRESHOLD_S + 1)
    counts = await reconciler.reconcile_once(t)
    assert counts.swept == 3
    sim.sim.clock.advance(2 * THRESHOLD_S + 1)  # the provider is back
    assert (await reconciler.reconcile_once(t + timedelta(hours=1))).claimed == 0
    for job in jobs:
        r = await row(conn, job)
        assert (r["status"], r["credits"], r["credits_charged"]) == ("failed", "refunded", 0)
        assert await verify_job(conn, job) == []
    assert sim.sim.journal.count(PROVIDER, "create") == 3  # never created again
    assert len(sim.sim.tasks.all()) == 0


async def test_a_live_worker_polls_through_an_outage_longer_than_the_threshold(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """A worker whose polls fail keeps its call (a failed poll is not a reason to give it
    up before its budget): once the provider is back, the call completes, committed once,
    created once."""
    polls = 0

    async def sim_sleep(seconds: float) -> None:  # the worker's wait moves simulated time
        nonlocal polls
        polls += 1
        sim.sim.clock.advance(seconds)

    settings = msgspec.structs.replace(sim.settings, retry=RetryPolicy(max_attempts=1))
    runner = CallRunner(pool, http, settings, LocalFolderStore(tmp_path / "media"),
                        config=CallConfig(poll_interval_s={KIND: 30.0}), sleep=sim_sleep)
    job = await create_job(conn, credits=10)
    sim.sim.faults.arm(PROVIDER, "poll", DOWN)
    outcome = await runner.run(job, KIND, {"model": "nano-banana-pro",
                                           "input": {"prompt": "a cat", "_sim": NOW_SCRIPT}})
    assert outcome.projection.state is CallState.COMPLETED
    assert polls >= (2 * THRESHOLD_S) // 30  # it waited the whole outage out
    assert sim.sim.journal.count(PROVIDER, "poll") == polls + 1
    r = await row(conn, job)
    assert (r["status"], r["credits"], r["credits_charged"]) == ("completed", "committed", 10)
    assert sim.sim.journal.count(PROVIDER, "create") == 1
    assert await verify_job(conn, job) == []
