"""The host shares the jobs table (issue 11): host rows written with plain SQL, at any
moment, never stop recovery, are never overwritten, and keep what the host wrote.

Each test names the behaviour it holds; rows are written by SQL the way a host's own code
writes them (the seed's columns, statuses and settlements), on a real Postgres, with the
provider simulator over HTTP.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import aiohttp
import msgspec

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.migrate import available
from callwarden.database.write import append, cancel, load, load_events, transition
from callwarden.events.states import CallState
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    ReconcileAttempted,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import CallProjection
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.reconciler.config import ReconcileConfig
from callwarden.replay.audit import stats
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeReconciler, MakeRunner
from tests.support.calls import (
    NOW_SCRIPT,
    OLD,
    counted,
    dead_worker_call,
    row,
    seed_row,
    upstream_task,
)

HOST_OUTPUT = {"media": ["https://cdn.example/x.png"], "thumbnail": "t.png"}


async def events_of(conn: Conn, job: uuid.UUID) -> list[str]:
    return [type(e).__name__ for e in await load_events(conn, job)]


# -- 1. a host row never stops recovery ------------------------------------------------------

async def test_host_json_in_output_data_never_stops_the_reconciler(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    """The host keeps its own shapes in output_data; a call is recovered whatever they
    are, and the host's keys survive the completion."""
    shapes = [HOST_OUTPUT, ["a", "list"], "a string", 42]
    jobs = []
    for shape in shapes:
        task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
        job = await dead_worker_call(conn, "kie-standard", task)
        await conn.execute("UPDATE jobs SET output_data = %s::jsonb WHERE id = %s",
                           (msgspec.json.encode(shape).decode(), job))
        jobs.append(job)
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 4, "recovered": 4, "completed": 4}
    for job in jobs:
        assert (await row(conn, job))["credits"] == "committed"
        assert await verify_job(conn, job) == []
    out = (await (await conn.execute("SELECT output_data FROM jobs WHERE id = %s",
                                     (jobs[0],))).fetchone() or {})["output_data"]
    assert out["thumbnail"] == "t.png"  # the host's key kept
    assert out["media"][0]["key"].startswith(f"media/{jobs[0]}/")  # callwarden's merged in


async def test_worker_resumes_a_call_whose_row_holds_host_json(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        make_runner: MakeRunner) -> None:
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    job = await dead_worker_call(conn, "kie-standard", task, age=timedelta(seconds=5))
    await conn.execute("UPDATE jobs SET output_data = %s::jsonb WHERE id = %s",
                       (msgspec.json.encode(HOST_OUTPUT).decode(), job))
    out = await make_runner().run(job, "kie-standard", {"model": "m", "input": {}})
    assert out.result == "completed"
    assert sim.sim.journal.count("kie", "create") == 1  # resumed, never re-created


async def test_callwarden_column_overwritten_by_the_host_is_read_from_the_log(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    job = await dead_worker_call(conn, "kie-standard", task)
    p = await load(conn, job)
    result = UpstreamResult(media_urls=(sim.url("kie", "/nowhere"),))
    await append(conn, job, p, UpstreamSucceeded(at=utcnow() - OLD, actor="w", result=result))
    await conn.execute("UPDATE jobs SET upstream_result = '\"not ours\"'::jsonb "
                       "WHERE id = %s", (job,))
    counts = await make_reconciler().reconcile_once()
    assert counts.unreadable == 0
    assert counts.claimed == 1
    assert "FinalizeClaimed" in await events_of(conn, job)  # it acted on the log's truth
    assert await verify_job(conn, job) == []  # and the row was rewritten from the fold


async def test_unreadable_row_is_parked_and_counted_and_the_rest_recovered(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    bad = await dead_worker_call(conn, "kie-standard", "t-bad")
    await conn.execute("UPDATE callwarden.call_events SET payload = '{\"garbage\": true}' "
                       "WHERE job_id = %s", (bad,))
    await conn.execute("UPDATE jobs SET upstream_result = '[1]'::jsonb WHERE id = %s", (bad,))
    good = await dead_worker_call(conn, "kie-standard",
                                  await upstream_task(http, sim, "kie-standard", NOW_SCRIPT))
    reconciler = make_reconciler()
    now = utcnow()
    counts = await reconciler.reconcile_once(now)
    assert (counts.claimed, counts.unreadable, counts.completed) == (2, 1, 1)
    assert (await row(conn, good))["credits"] == "committed"
    parked = await (await conn.execute(
        "SELECT reconcile_owner, reconcile_lease_until FROM jobs WHERE id = %s",
        (bad,))).fetchone()
    assert parked is not None
    assert parked["reconcile_owner"] is None
    assert parked["reconcile_lease_until"] > now + timedelta(seconds=200)
    assert counted(await reconciler.reconcile_once(now + timedelta(seconds=10))) == {}


async def test_unexpected_error_on_one_row_is_an_attempt_on_that_row_only(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    victim = await dead_worker_call(conn, "kie-standard", "t-1")
    other = await dead_worker_call(conn, "kie-standard",
                                   await upstream_task(http, sim, "kie-standard", NOW_SCRIPT))

    async def bug(point: str, job: uuid.UUID) -> None:
        if point == "decided" and job == victim:
            raise RuntimeError("a bug in one row's handling")

    counts = await make_reconciler(signal=bug).reconcile_once()
    assert (counts.errors, counts.completed) == (1, 1)
    r = await row(conn, victim)
    assert (r["call_state"], r["reconcile_attempts"]) == ("polling", 1)
    assert "RuntimeError: a bug in one row's handling" in r["reconcile_last_error"]
    assert (await row(conn, other))["credits"] == "committed"
    assert await verify_job(conn, victim) == []


# -- 4. never overwrite what the host decided -----------------------------------------------

async def test_seed_row_the_host_completed_after_the_claim_is_never_swept(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    """River #1302: the reconciler claimed a seed row, then the host completed it and
    committed the credits; the reconciler's Adopted + Swept must not land. (The same
    pass then records the job as ended by the host, outside callwarden: HostEnded, the
    host's commit untouched.)"""
    job = await seed_row(conn, None, kind="anthropic-sync", age=timedelta(minutes=6))

    async def host_finishes_first(point: str, claimed: uuid.UUID) -> None:
        if point == "write" and claimed == job:
            await conn.execute("UPDATE jobs SET status = 'completed' WHERE id = %s", (job,))
            await conn.execute("UPDATE usage_logs SET status = 'committed', "
                               "credits_charged = 3 WHERE job_id = %s", (job,))

    counts = await make_reconciler(signal=host_finishes_first).reconcile_once()
    assert (counts.swept, counts.adopted, counts.lost_race) == (0, 0, 1)
    r = await row(conn, job)
    assert (r["status"], r["credits"], r["credits_charged"], r["call_state"]) == (
        "completed", "committed", 3, "completed")
    assert await events_of(conn, job) == ["HostEnded"]
    assert await verify_job(conn, job) == []


async def test_call_the_host_failed_and_refunded_is_never_completed(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    """A result in hand, but the host failed and refunded the job first: no media, no
    commit, the host's failure kept (recorded as HostEnded)."""
    task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    job = await dead_worker_call(conn, "kie-standard", task)

    async def host_fails_it(point: str, claimed: uuid.UUID) -> None:
        if point == "write":
            await conn.execute("UPDATE jobs SET status = 'failed', error_message = "
                               "'host: user gave up' WHERE id = %s", (job,))
            await conn.execute("UPDATE usage_logs SET status = 'refunded', "
                               "credits_charged = 0 WHERE job_id = %s", (job,))

    counts = await make_reconciler(signal=host_fails_it).reconcile_once()
    assert (counts.completed, counts.host_ended) == (0, 1)
    r = await row(conn, job)
    assert (r["status"], r["error_message"], r["credits"], r["assets"]) == (
        "failed", "host: user gave up", "refunded", 0)
    assert (await events_of(conn, job))[-1] == "HostEnded"
    assert r["call_state"] == "failed"
    assert await verify_job(conn, job) == []


async def test_host_completion_before_the_worker_records_is_kept_and_left_to_the_host(
        conn: Conn) -> None:
    job = await dead_worker_call(conn, "kie-standard", "t-2", age=timedelta(seconds=5))
    p = await load(conn, job)
    await conn.execute("UPDATE jobs SET status = 'completed' WHERE id = %s", (job,))
    late = UpstreamSucceeded(at=utcnow(), actor="worker", result=UpstreamResult())
    r = await transition(conn, job, lambda q: late if q.state is CallState.POLLING else None,
                         current=p)
    assert (r.ok, r.host_ended, r.projection.state) == (False, True, CallState.COMPLETED)
    settled = await (await conn.execute(
        "SELECT status, credits_charged FROM usage_logs WHERE job_id = %s", (job,))).fetchall()
    assert [(s["status"], s["credits_charged"]) for s in settled] == [("reserved", None)]
    assert await events_of(conn, job) == ["CallStarted", "TaskCreated", "HostEnded"]


# -- 5. legacy means "before the instrumentation" --------------------------------------------

async def test_call_less_rows_created_after_the_call_columns_are_never_swept(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    """A pipeline wrapper job (no provider_kind on purpose) and a queued job: created after
    the call columns were installed, they are the host's; only older rows are legacy."""
    await conn.execute("UPDATE callwarden.callwarden_migrations SET applied_at = now() - interval "
                       "'3 hours' WHERE version = 2")  # the columns came 3 hours ago
    wrapper = await create_job(conn, status="processing", job_type="pipeline")
    queued = await create_job(conn, status="pending")
    legacy = await create_job(conn, status="processing")
    for job, age in ((wrapper, "2 hours"), (queued, "90 minutes"), (legacy, "4 hours")):
        await conn.execute("UPDATE jobs SET created_at = now() - %s::interval "
                           "WHERE id = %s", (age, job))
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 1, "adopted": 1, "swept": 1}
    assert (await row(conn, legacy))["credits"] == "refunded"
    for job in (wrapper, queued):
        r = await row(conn, job)
        assert (r["call_state"], r["credits"]) == (None, "reserved")
    report = await stats(conn, now=utcnow(), window=timedelta(hours=1),
                         stale=ReconcileConfig().stale)
    assert report.jobs_without_call == 2


async def test_a_configured_legacy_cutoff_wins_over_the_migration_time(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    job = await create_job(conn, status="processing")
    await conn.execute("UPDATE jobs SET created_at = now() - interval '5 hours' "
                       "WHERE id = %s", (job,))
    cutoff = utcnow() - timedelta(hours=6)  # the host instrumented 6 hours ago
    assert counted(await make_reconciler(legacy_cutoff=cutoff).reconcile_once()) == {}
    assert (await row(conn, job))["credits"] == "reserved"


# -- 10. transient database errors and host cancels ------------------------------------------

# The first three heartbeat writes fail in the database (a sequence is not rolled back
# with the failed statement, so it counts them).
FAIL_HEARTBEATS = """
CREATE SEQUENCE hb_writes;
CREATE OR REPLACE FUNCTION hb_fail() RETURNS trigger AS $$
BEGIN
    -- a heartbeat write: the heartbeat moves, no event (TaskCreated's own beat passes)
    IF NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at
       AND NEW.call_version = OLD.call_version
       AND nextval('hb_writes') <= 3 THEN
        RAISE EXCEPTION 'heartbeat refused (test trigger)';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER hb_fail BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION hb_fail();
"""


async def test_failed_heartbeat_writes_do_not_abandon_a_polling_call(
        conn: Conn, make_runner: MakeRunner) -> None:
    await conn.execute(FAIL_HEARTBEATS.encode())
    job = await create_job(conn, credits=10)
    script = {"steps": [{"phase": "running", "polls": 8, "progress": 40}], "end": "succeeded"}
    out = await make_runner(heartbeat_every_s=0.001).run(
        job, "kie-standard", {"model": "m", "input": {"_sim": script}})
    assert out.result == "completed"
    tries = await (await conn.execute("SELECT last_value FROM hb_writes")).fetchone()
    assert tries is not None
    assert tries["last_value"] > 3
    beat = await (await conn.execute("SELECT heartbeat_at FROM jobs WHERE id = %s",
                                     (job,))).fetchone()
    assert beat is not None
    assert beat["heartbeat_at"] is not None
    assert (await row(conn, job))["credits"] == "committed"


async def test_host_cancel_is_an_outcome_not_a_conflict(conn: Conn) -> None:
    job = await dead_worker_call(conn, "kie-standard", "t-3", age=timedelta(seconds=5))
    await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (job,))
    attempts = []

    def decide(p: CallProjection) -> Event | None:
        attempts.append(p.version)
        return Completed(at=utcnow(), actor="worker")

    r = await transition(conn, job, decide)
    assert (r.ok, r.host_ended, r.projection.state) == (False, True, CallState.CANCELLED)
    assert len(attempts) == 1  # decided once, then the host's decision was recorded
    assert (await row(conn, job))["credits"] == "refunded"


# -- 11. host data survives adoption and cancel ----------------------------------------------

async def test_adoption_keeps_the_hosts_attempt_counters(
        conn: Conn, http: aiohttp.ClientSession, sim: RunningSimulator,
        make_reconciler: MakeReconciler) -> None:
    task = await upstream_task(http, sim, "kie-standard", {"end": "stuck"})
    job = await seed_row(conn, task, reconcile_attempts=5, reconcile_last_error="host: 502")
    counts = await make_reconciler().reconcile_once()
    assert counted(counts) == {"claimed": 1, "adopted": 1, "still_running": 1}
    r = await row(conn, job)
    assert r["reconcile_attempts"] == 6  # the host's five, plus this attempt
    assert await verify_job(conn, job) == []


async def test_cancel_of_a_never_adopted_row_keeps_the_hosts_seed_columns(conn: Conn) -> None:
    job = await seed_row(conn, "host-task-9", reconcile_attempts=2,
                         reconcile_last_error="host: slow")
    before = await (await conn.execute(
        "SELECT provider_kind, provider_task_id, provider_call_started_at, "
        "reconcile_attempts, reconcile_last_error FROM jobs WHERE id = %s", (job,))).fetchone()
    assert (await cancel(conn, job, by="admin", now=utcnow())).ok
    after = await (await conn.execute(
        "SELECT provider_kind, provider_task_id, provider_call_started_at, "
        "reconcile_attempts, reconcile_last_error FROM jobs WHERE id = %s", (job,))).fetchone()
    assert after == before
    assert (await row(conn, job))["credits"] == "refunded"
    assert await verify_job(conn, job) == []


# -- found by the adversarial review -----------------------------------------------------------

async def test_a_host_timestamp_python_cannot_hold_never_stops_the_claim(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    await conn.execute("UPDATE callwarden.callwarden_migrations SET applied_at = now() - interval "
                       "'3 hours' WHERE version = 2")
    odd = await create_job(conn, status="processing")
    await conn.execute("UPDATE jobs SET started_at = 'infinity', created_at = '-infinity' "
                       "WHERE id = %s", (odd,))
    far = await create_job(conn, status="processing")
    await conn.execute("UPDATE jobs SET created_at = '12026-01-01' WHERE id = %s", (far,))
    legacy = await create_job(conn, status="processing")
    await conn.execute("UPDATE jobs SET created_at = now() - interval '4 hours' "
                       "WHERE id = %s", (legacy,))
    counts = await make_reconciler().reconcile_once()
    assert counts.pass_failed is False
    assert (await row(conn, legacy))["credits"] == "refunded"


async def test_a_job_the_host_completed_is_left_for_the_host_to_commit(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    """The host writes completed, then (a statement later) commits its own amount: the
    reconciler records the host's decision at once but settles nothing — only the host
    knows the charge — and the host's commit then lands, once."""
    job = await dead_worker_call(conn, "kie-standard", "t-host", age=timedelta(minutes=11))
    await conn.execute("UPDATE jobs SET status = 'completed' WHERE id = %s", (job,))
    assert (await make_reconciler().reconcile_once()).host_ended == 1
    assert (await row(conn, job))["credits"] == "reserved"
    await conn.execute("UPDATE usage_logs SET status = 'committed', credits_charged = 3 "
                       "WHERE job_id = %s AND status = 'reserved'", (job,))
    r = await row(conn, job)
    assert (r["call_state"], r["credits"], r["credits_charged"]) == ("completed", "committed", 3)
    assert await verify_job(conn, job) == []


async def test_with_no_known_cutoff_no_row_is_legacy(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    await conn.execute("DELETE FROM callwarden.callwarden_migrations WHERE version = 2")
    wrapper = await create_job(conn, status="processing", job_type="pipeline")
    await conn.execute("UPDATE jobs SET created_at = now() - interval '2 hours' "
                       "WHERE id = %s", (wrapper,))
    assert counted(await make_reconciler().reconcile_once()) == {}
    assert (await row(conn, wrapper))["credits"] == "reserved"


async def test_a_legacy_sweep_leaves_the_hosts_empty_seed_columns_empty(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    job = await create_job(conn, status="processing")
    await conn.execute("UPDATE jobs SET created_at = now() - interval '1 day', started_at = "
                       "now() - interval '2 hours' WHERE id = %s", (job,))
    assert counted(await make_reconciler().reconcile_once()) == {
        "claimed": 1, "adopted": 1, "swept": 1}
    seed = await (await conn.execute(
        "SELECT provider_kind, provider_call_started_at FROM jobs WHERE id = %s",
        (job,))).fetchone()
    assert seed == {"provider_kind": None, "provider_call_started_at": None}
    assert await verify_job(conn, job) == []


async def test_a_write_on_a_created_call_keeps_the_hosts_flip_to_processing(
        conn: Conn) -> None:
    job = await create_job(conn, credits=10)  # pending
    p = await load(conn, job)
    p = (await append(conn, job, p, CallStarted(at=utcnow(), actor="w",
                                                kind="anthropic-sync", sync=True))).projection
    await conn.execute("UPDATE jobs SET status = 'processing' WHERE id = %s", (job,))
    r = await append(conn, job, p, ReconcileAttempted(at=utcnow(), actor="r",
                                                      outcome="still_running"))
    assert r.ok
    assert (await row(conn, job))["status"] == "processing"
    assert await verify_job(conn, job) == []


async def test_calls_in_flight_across_the_upgrade_keep_their_inline_media(
        conn: Conn) -> None:
    """A v1 UpstreamSucceeded cached its inline keys in upstream_result.raw: migration
    0006 moves them where v2 reads them, so the finalizer still finds the media."""
    job = await create_job(conn, credits=10)
    await conn.execute(
        "UPDATE jobs SET upstream_result = %s::jsonb WHERE id = %s",
        (msgspec.json.encode({"raw": {"prestored_keys": [f"media/{job}/0.mp3"]}}).decode(),
         job))
    (sql,) = [m.sql for m in available() if m.version == 6]
    await conn.execute(sql.encode())  # idempotent: applying it again is what an upgrade did
    cached = await (await conn.execute("SELECT upstream_result FROM jobs WHERE id = %s",
                                       (job,))).fetchone()
    assert cached is not None
    assert cached["upstream_result"] == {"raw": {}, "stored_keys": [f"media/{job}/0.mp3"]}
