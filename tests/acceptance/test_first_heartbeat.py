"""TaskCreated is the call's first heartbeat (issue 25.2): a real worker process killed with
SIGKILL right after its task was created and polled once (before any heartbeat of its own)
is taken over by the reconciler once the heartbeat timeout has passed since TaskCreated,
not only after the kind's threshold (1,200 s for ``replicate-prediction``)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp

from callwarden.database.db import Conn, open_pool
from callwarden.database.jobs import create_job
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.claims import input_data
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from tests.acceptance.conftest import Workers

KIND = "replicate-prediction"
REQUEST = {"version": "owner/model",
           "input": {"prompt": "a cat", "_sim": {"steps": [{"phase": "running", "polls": 1}],
                                                 "end": "succeeded"}}}


async def call_row(conn: Conn, job: uuid.UUID) -> dict[str, object]:
    row = await (await conn.execute(
        "SELECT call_state, heartbeat_at, provider_call_started_at, "
        "(SELECT recorded_at FROM callwarden.call_events WHERE job_id = j.id AND type = "
        "'TaskCreated')"
        " AS task_created_at FROM jobs j WHERE id = %s", (job,))).fetchone()
    assert row is not None
    return dict(row)


async def test_a_worker_killed_before_its_first_beat_is_taken_over_after_the_timeout(
        db_url: str, conn: Conn, workers: Workers, sim: RunningSimulator,
        tmp_path: Path) -> None:
    job = await create_job(conn, input_data=input_data(KIND, REQUEST), credits=10)
    crashing = await workers.start(["--concurrency", "1", "--poll-interval", "0.05",
                                    "--media-dir", str(tmp_path / "media")],
                                   failpoints="mid_poll")
    assert await crashing.exited(30.0) == -9, crashing.logs()
    dead = await call_row(conn, job)
    assert dead["call_state"] == "polling"
    assert dead["heartbeat_at"] is not None  # TaskCreated beat for it
    config = ReconcileConfig()
    assert config.heartbeat_timeout_s < config.stale.threshold_for(KIND)
    beat_at = dead["heartbeat_at"]
    assert isinstance(beat_at, datetime)
    async with open_pool(db_url, max_size=2) as pool, aiohttp.ClientSession() as http:
        reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "rec"),
                                config=config)
        early = await reconciler.reconcile_once(
            beat_at + timedelta(seconds=config.heartbeat_timeout_s - 1))
        assert early.claimed == 0  # the worker could still be alive
        later = await reconciler.reconcile_once(
            beat_at + timedelta(seconds=config.heartbeat_timeout_s + 1))
    assert later.completed == 1
    assert (await call_row(conn, job))["call_state"] == "completed"
