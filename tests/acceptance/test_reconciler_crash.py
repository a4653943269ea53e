"""Real ``callwarden reconcile`` processes: one is SIGKILLed right after claiming a batch;
nothing is lost. Invariant: once its claim lease expires, another reconciler process takes
the same calls and settles each exactly once — recovered from the persisted task id (no
second upstream create), media stored, credits committed, projections equal to the log."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.replay.verify import verify_job
from tests.acceptance.conftest import KEY_VARS, PROVIDERS, ROOT

N = 6


def _env(db_url: str, sim: RunningSimulator, media: Path, failpoints: str | None
         ) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALLWARDEN_", "AWS_")) and k not in KEY_VARS}
    env.update({"DATABASE_URL": db_url, "CALLWARDEN_MEDIA_DIR": str(media),
                "CALLWARDEN_RECONCILE_CLAIM_LEASE_S": "2",
                "CALLWARDEN_RECONCILE_BATCH_SIZE": str(N)})
    env.update(dict.fromkeys(KEY_VARS, sim.sim.api_key))
    for p in PROVIDERS:
        env[f"CALLWARDEN_{p.upper()}_URL"] = sim.url(p)
    if failpoints:
        env["CALLWARDEN_FAILPOINTS"] = failpoints
    return env


async def _dead_worker_call(conn: Conn, http: aiohttp.ClientSession,
                            sim: RunningSimulator) -> uuid.UUID:
    """A kie-standard call whose worker died 20 minutes ago after creating its task,
    which went on to succeed upstream (the seed's incident)."""
    job = await create_job(conn, credits=5)
    long_ago = datetime.now(UTC) - timedelta(minutes=20)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=long_ago, actor="worker:dead", kind="kie-standard"))).projection
    async with http.post(sim.url("kie", "/api/v1/jobs/createTask"), json={
            "model": "nano-banana-pro", "input": {
                "prompt": str(job), "_sim": {"steps": [], "end": "succeeded"}}},
            headers={"Authorization": f"Bearer {sim.sim.api_key}"}) as resp:
        task_id = (await resp.json())["data"]["taskId"]
    await append(conn, job, p, TaskCreated(at=long_ago, actor="worker:dead", task_id=task_id))
    return job


async def _reconcile(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "reconcile", *args, env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def _wait_for_lease_expiry(conn: Conn, jobs: list[uuid.UUID]) -> None:
    async def expired() -> bool:
        row = await (await conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s) "
            "AND reconcile_lease_until > now()", (jobs,))).fetchone()
        return row is not None and row["n"] == 0
    for _ in range(200):  # bounded: the lease is 2 s
        if await expired():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("claim leases never expired")


async def test_reconciler_killed_mid_batch_loses_nothing(
        db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    async with await connect(db_url) as conn, aiohttp.ClientSession() as http:
        jobs = [await _dead_worker_call(conn, http, sim) for _ in range(N)]
        creates = sim.sim.journal.count("kie", "create")

        code, out = await _reconcile(
            _env(db_url, sim, tmp_path, "reconciler_after_claim"), "--once")
        assert code == -9, out
        claimed = await (await conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s) "
            "AND reconcile_owner LIKE 'reconciler:%%' AND call_state = 'polling'",
            (jobs,))).fetchone()
        assert claimed == {"n": N}  # claimed, then nothing handled: the process died

        await _wait_for_lease_expiry(conn, jobs)
        code, out = await _reconcile(_env(db_url, sim, tmp_path, None), "--once", "--json")
        assert code == 0, out
        counts = json.loads(out.strip().splitlines()[-1])
        assert counts["completed"] == N

        for job in jobs:
            row = await (await conn.execute(
                "SELECT j.call_state, u.status, (SELECT count(*) FROM assets a "
                "WHERE a.job_id = j.id) AS assets FROM jobs j JOIN usage_logs u "
                "ON u.job_id = j.id WHERE j.id = %s", (job,))).fetchone()
            assert row == {"call_state": "completed", "status": "committed", "assets": 1}
            assert await verify_job(conn, job) == []
        assert sim.sim.journal.count("kie", "create") == creates  # resumed, never re-created
