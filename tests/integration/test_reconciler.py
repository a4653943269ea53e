"""The reconciler against a real Postgres and the provider simulator over HTTP: every
outcome for each provider family, adoption, heartbeats, the attempt cap, a dropped
connection, and the claim query's plan. (Races between actors: test_reconciler_races.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import aiohttp
import psycopg
import pytest

from callwarden.database.citus import on_citus
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.queries import QUERIES
from callwarden.database.write import append, execute, load, load_events
from callwarden.events.states import CallState
from callwarden.events.types import FinalizeClaimed
from callwarden.providers.base import AsyncKindClient
from callwarden.providers.registry import client_for
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.replay.verify import verify_job
from callwarden.rules.upstream import upstream_event
from tests.integration.conftest import MakeReconciler
from tests.support.calls import (
    DEAD,
    NOW_SCRIPT,
    OLD,
    REQUESTS,
    counted,
    dead_worker_call,
    row,
    seed_row,
    upstream_task,
)

POLL_ROUTE = {"kie-standard": ("kie", "poll"), "replicate-prediction": ("replicate", "poll"),
              "replicate-training": ("replicate", "poll_training"),
              "elevenlabs-async": ("elevenlabs", "poll")}


# -- every outcome, for each provider family ------------------------------------------------

@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_each_poll_outcome_is_recorded_and_settled(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler, kind: str) -> None:
    scripts = {"completed": NOW_SCRIPT,
               "failed": {"steps": [], "end": "failed", "error": "upstream said no"},
               "swept": {"steps": [], "end": "vanished"},
               "still_running": {"end": "stuck"}}
    jobs = {name: await dead_worker_call(conn, kind, await upstream_task(http, sim, kind, s))
            for name, s in scripts.items()}
    now = utcnow()
    counts = await make_reconciler().reconcile_once(now)
    assert counted(counts) == {"claimed": 4, "recovered": 1, "completed": 1, "failed": 1,
                               "swept": 1, "still_running": 1}
    done, failed, swept, running = [await row(conn, jobs[n]) for n in scripts]
    assert (done["status"], done["credits"], done["assets"]) == ("completed", "committed", 1)
    assert (failed["status"], failed["credits"]) == ("failed", "refunded")
    assert "upstream said no" in failed["error_message"]
    assert (swept["call_state"], swept["error_message"], swept["credits"]) == (
        "swept", "upstream_task_not_found", "refunded")
    assert (running["call_state"], running["reconcile_attempts"], running["credits"]) == (
        "polling", 1, "reserved")
    assert running["reconcile_next_at"] == now + timedelta(seconds=300)
    for job in jobs.values():
        assert await verify_job(conn, job) == []
        assert (await row(conn, job))["reconcile_owner"] is None  # claims released


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_provider_error_bumps_the_attempt_and_keeps_the_error(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler, kind: str) -> None:
    job = await dead_worker_call(conn, kind, await upstream_task(http, sim, kind, NOW_SCRIPT))
    provider, route = POLL_ROUTE[kind]
    sim.sim.faults.arm(provider, route, Fault(kind="http_status", status=500, times=10))
    now = utcnow()
    reconciler = make_reconciler()
    assert counted(await reconciler.reconcile_once(now)) == {"claimed": 1, "errors": 1}
    r = await row(conn, job)
    assert (r["call_state"], r["reconcile_attempts"], r["credits"]) == (
        "polling", 1, "reserved")
    assert "500" in r["reconcile_last_error"]
    assert counted(await reconciler.reconcile_once(now)) == {}  # not before the re-poll
    sim.sim.faults.clear()
    later = await reconciler.reconcile_once(now + timedelta(seconds=301))
    assert later.completed == 1
    assert (await row(conn, job))["credits"] == "committed"


async def test_replicate_output_removed_after_an_hour_fails_and_refunds(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "replicate-prediction", NOW_SCRIPT)
    job = await dead_worker_call(conn, "replicate-prediction", task)
    sim.sim.clock.advance(3601)  # data_removed: the output is gone
    assert (await make_reconciler().reconcile_once()).failed == 1
    r = await row(conn, job)
    assert (r["status"], r["credits"], r["assets"]) == ("failed", "refunded", 0)
    assert "result expired" in r["error_message"]


async def test_calls_that_cannot_be_recovered_are_swept_without_asking_upstream(
        conn: Conn, sim: RunningSimulator, make_reconciler: MakeReconciler) -> None:
    jobs = [await dead_worker_call(conn, kind, None, sync=True)
            for kind in ("kie-llm", "elevenlabs-sync", "anthropic-sync")]
    jobs.append(await dead_worker_call(conn, "elevenlabs-async", None, sync=True))  # clone
    jobs.append(await dead_worker_call(conn, "kie-standard", None))  # died inside create
    jobs.append(await dead_worker_call(conn, "midjourney", "t-9", age=timedelta(hours=2)))
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 6, "swept": 6}
    for job in jobs:
        r = await row(conn, job)
        assert (r["status"], r["error_message"], r["credits"]) == (
            "failed", "reconcile_no_recovery", "refunded")
    assert sim.sim.journal.count() == 0


async def test_stuck_upstream_success_and_expired_finalization_are_finalized(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    jobs = []
    for claimed in (False, True):
        task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
        job = await dead_worker_call(conn, "kie-standard", task)
        client = cast(AsyncKindClient, client_for("kie-standard", http, sim.settings))
        at = utcnow() - OLD
        event = upstream_event(await client.poll(task), DEAD, at)
        assert event is not None
        p = (await append(conn, job, await load(conn, job), event)).projection
        if claimed:  # the dead worker held the finalization claim; its lease expired
            await append(conn, job, p, FinalizeClaimed(
                at=at, actor=DEAD, owner=DEAD, lease_until=at + timedelta(minutes=2)))
        jobs.append(job)
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 2, "completed": 2}
    for job in jobs:
        assert (await row(conn, job))["credits"] == "committed"
        assert await verify_job(conn, job) == []


async def test_open_call_cancelled_by_the_host_is_recorded_and_refunded(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", {"end": "stuck"})
    job = await dead_worker_call(conn, "kie-standard", task)
    await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (job,))
    assert counted(await make_reconciler().reconcile_once()) == {"claimed": 1, "host_ended": 1}
    r = await row(conn, job)
    assert (r["status"], r["call_state"], r["credits"]) == ("cancelled", "cancelled", "refunded")
    assert [type(e).__name__ for e in await load_events(conn, job)][-1] == "HostEnded"
    assert sim.sim.journal.count("kie", "poll") == 0
    assert await verify_job(conn, job) == []


# -- the seed's triggering incident, adoption, heartbeats ------------------------------------

async def test_kie_task_that_succeeded_while_its_worker_was_dead_is_completed_with_media(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler, tmp_path: Path) -> None:
    script = {"steps": [{"phase": "running", "seconds": 30, "progress": 92}],
              "end": "succeeded"}
    task = await upstream_task(http, sim, "kie-standard", script)
    job = await dead_worker_call(conn, "kie-standard", task, age=timedelta(minutes=11))
    await execute(conn, "heartbeat", {"job_id": job, "owner": DEAD, "progress": 92})
    sim.sim.clock.advance(60)  # upstream finished while nobody was polling
    # The worker's last heartbeat is 2 minutes old by the reconciler's clock.
    counts = await make_reconciler().reconcile_once(utcnow() + timedelta(minutes=2))
    assert counted(counts) == {"claimed": 1, "recovered": 1, "completed": 1}
    r = await row(conn, job)
    assert (r["status"], r["progress"], r["credits"], r["assets"]) == (
        "completed", 100, "committed", 1)
    stored = list((tmp_path / "media" / str(job)).glob("0.*"))
    assert len(stored) == 1
    assert stored[0].read_bytes()
    assert sim.sim.journal.count("kie", "create") == 1  # never re-created
    assert await verify_job(conn, job) == []


async def test_row_written_by_a_foreign_worker_is_adopted_and_recovered(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    job = await create_job(conn, credits=10)
    await conn.execute(  # the host's other-language worker, straight onto jobs (seed §5.2)
        "UPDATE jobs SET provider_kind = 'kie-standard', provider_task_id = %s, "
        "provider_call_started_at = now() - interval '15 minutes', status = 'processing' "
        "WHERE id = %s", (task, job))
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 1, "adopted": 1, "recovered": 1, "completed": 1}
    assert [type(e).__name__ for e in await load_events(conn, job)] == [
        "Adopted", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    assert (await row(conn, job))["credits"] == "committed"
    assert await verify_job(conn, job) == []


async def test_two_host_rows_naming_one_task_never_both_poll_it(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    """One upstream task, one job, for rows the host wrote by SQL: on plain Postgres the
    unique index refuses the second row; on Citus (no unique index spans the shards of
    jobs) both rows are written, the reconciler adopts one and polls its task, and the
    other's ``Adopted`` finds the task claimed (``callwarden_tasks``): it is swept and
    refunded in the same write, so the task's result is committed once."""
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    first = await seed_row(conn, task)
    if not await on_citus(conn):
        with pytest.raises(psycopg.errors.UniqueViolation):
            await seed_row(conn, task)
        return
    second = await seed_row(conn, task)
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 2, "adopted": 2, "recovered": 1, "completed": 1,
                               "swept": 1}
    ends = sorted([[(await row(conn, job))["credits"],
                    [type(e).__name__ for e in await load_events(conn, job)]]
                   for job in (first, second)])
    assert ends == [["committed", ["Adopted", "UpstreamSucceeded", "FinalizeClaimed",
                                   "Completed"]],
                    ["refunded", ["Adopted", "Swept"]]]
    assert sim.sim.journal.count("kie", "poll") == 1
    for job in (first, second):
        assert await verify_job(conn, job) == []


async def test_legacy_and_sync_seed_rows_are_adopted_then_swept(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    legacy = await create_job(conn, status="processing")  # from before the call columns
    await conn.execute("UPDATE jobs SET started_at = now() - interval '2 hours', "
                       "created_at = now() - interval '2 hours' WHERE id = %s", (legacy,))
    fresh = await create_job(conn, status="pending")  # queued a minute ago: not touched
    route = await create_job(conn, status="pending")  # seed §5.8 sync route, then crashed
    await conn.execute("UPDATE jobs SET provider_kind = 'anthropic-sync', "
                       "provider_call_started_at = now() - interval '6 minutes' "
                       "WHERE id = %s", (route,))
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 2, "adopted": 2, "swept": 2}
    for job in (legacy, route):
        r = await row(conn, job)
        assert (r["status"], r["error_message"], r["credits"]) == (
            "failed", "reconcile_no_recovery", "refunded")
        assert [type(e).__name__ for e in await load_events(conn, job)] == [
            "Adopted", "Swept"]
    assert (await row(conn, fresh))["call_state"] is None


async def test_fresh_heartbeat_is_left_alone_and_silent_one_is_acted_on_early(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    job = await dead_worker_call(conn, "kie-standard", task, age=timedelta(minutes=3))
    await execute(conn, "heartbeat", {"job_id": job, "owner": DEAD, "progress": 40})
    reconciler = make_reconciler()
    assert counted(await reconciler.reconcile_once(utcnow() + timedelta(seconds=30))) == {}
    assert sim.sim.journal.count("kie", "poll") == 0
    # 90 s after the last heartbeat, 4.5 min into a 10 min threshold: acted on.
    counts = await reconciler.reconcile_once(utcnow() + timedelta(seconds=90))
    assert counts.completed == 1


async def test_attempt_cap_exhausts_and_refunds(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", {"end": "stuck"})
    # Just past the 10 min threshold: the horizon (threshold + 3 x 1800 s) is not reached
    # before the third attempt.
    job = await dead_worker_call(conn, "kie-standard", task, age=timedelta(minutes=11))
    reconciler = make_reconciler(attempt_cap=3, repoll_interval_s=1800)
    t0 = utcnow()
    for i in range(3):
        assert (await reconciler.reconcile_once(t0 + timedelta(seconds=1800 * i))
                ).still_running == 1
        assert counted(await reconciler.reconcile_once(
            t0 + timedelta(seconds=1800 * i + 10))) == {}  # re-poll interval respected
    counts = await reconciler.reconcile_once(t0 + timedelta(seconds=5400))
    assert counted(counts) == {"claimed": 1, "exhausted": 1}
    r = await row(conn, job)
    assert (r["status"], r["error_message"], r["credits"], r["reconcile_attempts"]) == (
        "failed", "reconcile_exhausted", "refunded", 3)
    assert sim.sim.journal.count("kie", "poll") == 3


# -- a dropped connection, and the claim's plan ----------------------------------------------

def _terminator(db_url: str, jobs: set[uuid.UUID]) -> Callable[[str, uuid.UUID],
                                                               Awaitable[None]]:
    async def signal(point: str, job: uuid.UUID) -> None:
        if point != "write" or job not in jobs:
            return
        jobs.discard(job)
        from callwarden.database.db import connect

        async with await connect(db_url) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE application_name = 'cw-integration-test' AND pid <> pg_backend_pid()")
    return signal


@pytest.mark.own_backend
async def test_connection_dropped_mid_pass_writes_nothing_and_next_pass_completes(
        db_url: str, conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    job = await dead_worker_call(conn, "kie-standard", task)
    reconciler = make_reconciler(signal=_terminator(db_url, {job}))
    first = await reconciler.reconcile_once()
    assert counted(first) == {"claimed": 1, "errors": 1, "interrupted": 1}
    r = await row(conn, job)
    assert (r["call_state"], r["call_version"], r["credits"], r["assets"]) == (
        "polling", 2, "reserved", 0)
    second = await reconciler.reconcile_once()
    assert (second.completed, second.errors) == (1, 0)
    assert await verify_job(conn, job) == []


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += _nodes(child)
    return out


@pytest.mark.plain_postgres  # the plan of the FOR UPDATE SKIP LOCKED form
async def test_claim_is_served_by_partial_indexes_not_by_the_size_of_jobs(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    await conn.execute(
        "INSERT INTO jobs (id, user_id, status, call_state, call_version, provider_kind, "
        "provider_call_started_at) SELECT gen_random_uuid(), 'u', 'completed', 'completed', "
        "5, 'kie-standard', now() - interval '2 days' FROM generate_series(1, 20000)")
    await conn.execute(
        "INSERT INTO jobs (id, user_id, status, call_state, call_version, provider_kind, "
        "provider_task_id, provider_call_started_at) SELECT gen_random_uuid(), 'u', "
        "'processing', 'polling', 2, 'kie-standard', 'task-' || i, "
        "now() - interval '1 hour' FROM generate_series(1, 50) i")
    await conn.execute("ANALYZE jobs")
    reconciler = make_reconciler(batch_size=20)
    now = utcnow()
    plan = await (await conn.execute("EXPLAIN (FORMAT JSON) " + QUERIES["reconcile_claim"],
                                     reconciler.claim_params(now))).fetchone()
    assert plan is not None
    nodes = _nodes(plan["QUERY PLAN"][0]["Plan"])
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if "Relation Name" in n}
    assert not any(t == "Seq Scan" for t, _ in scans), scans
    assert {"jobs_open_calls_idx", "jobs_inflight_idx"} <= {name for _, name in scans}
    claimed = await reconciler.claim(now)
    assert len(claimed) == 20  # one batch, from the 50 open calls only
    assert {c["call_state"] for c in claimed} == {CallState.POLLING.value}
