"""A queue worker process's runtime against a real Postgres and the simulator: Celery's
loop thread runs a call for a blocking task and closes cleanly, and a job given up after
too many deliveries is refunded only if its call never started."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import append
from callwarden.events.types import CallStarted
from callwarden.projections.fold import EMPTY
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue import celery as celery_runtime
from callwarden.queue.process import RunnerOptions, open_runner

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
