"""A queue worker process's runtime against a real Postgres and the simulator: Celery's
loop thread runs a call for a blocking task and closes cleanly, and a job given up after
too many deliveries is refunded only if its call never started, also when another
delivery starts it while the give-up runs; an eager Celery task meeting an outage is
retried within the outage limit only, then names the job it leaves reserved; a database
error keeps a job queued only while its call has not started."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append
from callwarden.errors import DatabaseError, DatabaseUnavailable
from callwarden.events.types import CallStarted
from callwarden.projections.fold import EMPTY
from callwarden.providers.base import ProviderSettings
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue import celery as celery_runtime
from callwarden.queue.outage import OutageRetries
from callwarden.queue.process import RunnerOptions, open_runner
from callwarden.replay.verify import verify_job
from tests.support.queues import blocked_on_a_lock

REQUEST = {"model": "nano-banana-pro",
           "input": {"prompt": "a cat", "_sim": {"steps": [{"phase": "running", "polls": 2}],
                                                 "end": "succeeded"}}}


async def _credits(conn: Conn, job: uuid.UUID) -> Any:
    row = await (await conn.execute(
        "SELECT j.call_state, array_agg(u.status) AS credits FROM jobs j "
        "JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s GROUP BY j.call_state",
        (job,))).fetchone()
    assert row is not None
    return (row["call_state"], row["credits"])


def _options(db_url: str, sim: RunningSimulator, tmp_path: Path) -> RunnerOptions:
    return RunnerOptions(database_url=db_url, settings=sim.settings,
                         media=LocalFolderStore(tmp_path / "media"))


async def test_the_celery_runtime_runs_a_blocking_tasks_call_on_its_own_loop(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    job = await create_job(conn, credits=5)
    runtime = await asyncio.to_thread(celery_runtime.Runtime, _options(db_url, sim, tmp_path))
    try:
        assert runtime.process.owner.startswith("celery:")
        outcome = await asyncio.to_thread(runtime.run, job, "kie-standard", REQUEST)
    finally:
        await asyncio.to_thread(runtime.close)
    assert (outcome.result, outcome.projection.state and outcome.projection.state.value) == (
        "completed", "completed")
    assert await _credits(conn, job) == ("completed", ["committed"])
    assert sim.sim.journal.count("kie", "create") == 1
    assert runtime.process.pool.closed


async def test_giving_up_refunds_a_call_that_never_started_and_leaves_a_started_one(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    fresh, started = await create_job(conn, credits=5), await create_job(conn, credits=5)
    process = await open_runner(_options(db_url, sim, tmp_path), role="arq")
    try:
        await append(conn, started, EMPTY, CallStarted(
            at=process.runner.clock(), actor="worker:other", kind="kie-standard", sync=False))
        refunded = await process.give_up(fresh, "tried 6 times")
        left = await process.give_up(started, "tried 6 times")
    finally:
        await process.close()
    assert (refunded.result, refunded.detail) == ("cancelled", "given up: tried 6 times")
    assert await _credits(conn, fresh) == ("cancelled", ["refunded"])
    assert left.result == "left_for_reconciler"
    assert await _credits(conn, started) == ("created", ["reserved"])
    assert sim.sim.journal.count() == 0  # giving up never touches the provider


async def test_a_give_up_never_cancels_a_call_that_started_meanwhile(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    """Issue 24.8. Another delivery of the job records ``CallStarted`` while the give-up
    runs: its transaction is open (the row locked, the event not yet visible) when the
    give-up reads "never started" and sends its cancel, which waits for the lock; the
    delivery commits. The cancel's own decision must see the started call and leave it
    (to the delivery, then the reconciler): never cancelled and refunded while its create
    is in flight."""
    job = await create_job(conn, credits=5)
    process = await open_runner(_options(db_url, sim, tmp_path), role="arq")
    try:
        delivery = await connect(db_url)
        async with delivery:
            async with delivery.transaction():
                started = await append(delivery, job, EMPTY, CallStarted(
                    at=process.runner.clock(), actor="arq:other", kind="kie-standard",
                    sync=False))
                assert started.ok
                giving_up = asyncio.create_task(process.give_up(job, "tried 6 times"))
                await blocked_on_a_lock(conn, giving_up)
            outcome = await giving_up
    finally:
        await process.close()
    assert (outcome.result, outcome.projection.state and outcome.projection.state.value) == (
        "left_for_reconciler", "created")
    assert await _credits(conn, job) == ("created", ["reserved"])
    assert await verify_job(conn, job) == []


def test_an_eager_celery_task_retries_an_outage_only_within_the_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """In a worker a task is retried for as long as the database is unreachable; run
    eagerly (``apply``: each retry runs at once, nested, with no countdown) it is retried
    only within the outage limit's budget, then fails with the outage: never a loop."""
    monkeypatch.setattr(celery_runtime, "_options", None)  # register sets it: put it back
    outage = OutageRetries(limit_s=0.5)  # delays of 0.1 s: 5 retries within the limit
    options = RunnerOptions(database_url="host=127.0.0.1 port=1 dbname=x user=x",
                            settings=ProviderSettings(),
                            media=LocalFolderStore(tmp_path / "media"), outage=outage)
    task = celery_runtime.register(Celery("eager", broker="memory://"), name="t.eager",
                                   options=options)
    job = uuid.uuid4()
    try:
        with caplog.at_level(logging.INFO, logger="callwarden.queue"):
            result = task.apply(args=(str(job), "kie-standard", REQUEST))
    finally:
        celery_runtime.stop_process()
    assert result.state == "FAILURE"
    assert isinstance(result.result, DatabaseUnavailable)
    errors = [r.getMessage() for r in caplog.records
              if r.levelno == logging.ERROR and r.name.startswith("callwarden")
              and f"job {job} " in r.getMessage()]
    assert len(errors) == 1, errors  # the job, named once, left for the host
    assert "the job is left reserved, with no call" in errors[0]
    retried = [r.getMessage() for r in caplog.records if "outage retry" in r.getMessage()]
    assert len(retried) == outage.within_limit == 5  # a 6th is neither made nor logged


async def test_a_database_error_keeps_the_job_queued_only_before_its_call_started(
        db_url: str, conn: Conn, sim: RunningSimulator, tmp_path: Path) -> None:
    """What both queues ask before they fail or ack a job whose try raised a
    ``DatabaseError``: an outage always keeps it queued; any other database error keeps
    it while no ``CallStarted`` is recorded (the job would be lost with no call), and
    not once the call started (the reconciler finishes it), nor for a job with no row."""
    unstarted, started = await create_job(conn, credits=5), await create_job(conn, credits=5)
    process = await open_runner(_options(db_url, sim, tmp_path), role="arq")
    try:
        await append(conn, started, EMPTY, CallStarted(
            at=process.runner.clock(), actor="arq:other", kind="kie-standard", sync=False))
        refused = DatabaseError("database error: refused")
        down = DatabaseUnavailable("database unavailable: down")
        kept = {"unstarted": await process.keeps(unstarted, refused),
                "started": await process.keeps(started, refused),
                "started, down": await process.keeps(started, down),
                "no row": await process.keeps(uuid.uuid4(), refused)}
    finally:
        await process.close()
    assert kept == {"unstarted": True, "started": False, "started, down": True,
                    "no row": False}
