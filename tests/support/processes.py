"""Helpers of the tests that run callwarden as real processes: its environment, the CLI as
a subprocess, a call seeded by SQL, and the demo's invariants read back by SQL."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from psycopg import sql

from callwarden.database.db import Conn
from callwarden.providers.simulator.core import RunningSimulator
from tests.acceptance.conftest import KEY_VARS, PROVIDERS, ROOT


async def cli(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", *args, env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def environment(db_url: str, sim: RunningSimulator, media: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALLWARDEN_", "AWS_")) and k not in KEY_VARS}
    env.update({"DATABASE_URL": db_url, "CALLWARDEN_MEDIA_DIR": str(media)})
    env.update(dict.fromkeys(KEY_VARS, sim.sim.api_key))
    for p in PROVIDERS:
        env[f"CALLWARDEN_{p.upper()}_URL"] = sim.url(p)
    return env


async def host_job(conn: Conn, *, status: str = "processing", age: str = "20 minutes",
                   credits: float = 10, **columns: Any) -> uuid.UUID:
    """A job and its reservation, inserted the way the host's API does (plain SQL)."""
    job = uuid.uuid4()
    await conn.execute(
        "INSERT INTO jobs (id, user_id, status, created_at) "
        "VALUES (%s, 'user-9', %s, now() - %s::interval)", (job, status, age))
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                       "VALUES (%s, 'user-9', 'reserved', %s)", (job, credits))
    for column, value in columns.items():
        cast = sql.SQL("::jsonb" if column == "output_data" else "")
        await conn.execute(sql.SQL("UPDATE jobs SET {} = %s{} WHERE id = %s").format(
            sql.Identifier(column), cast), (value, job))
    return job


async def seed_call(conn: Conn, kind: str, task: str | None, age: str = "15 minutes",
                    **columns: Any) -> uuid.UUID:
    """The seed's Phase 1 in the host's own worker: kind, task id, call start (§5.2)."""
    job = await host_job(conn, **columns)
    await conn.execute(
        "UPDATE jobs SET provider_kind = %s, provider_task_id = %s, "
        "provider_call_started_at = now() - %s::interval WHERE id = %s",
        (kind, task, age, job))
    return job


def assert_invariants(summary: dict[str, object], jobs: int) -> None:
    assert summary["jobs"] == jobs
    assert summary["non_terminal"] == 0
    assert summary["upstream_creates_max_per_job"] == 1
    assert summary["duplicate_settlements"] == 0
    assert summary["verify_mismatches"] == 0
    assert summary["violations"] == []
    credits = summary["credits"]
    assert isinstance(credits, dict)
    assert credits["leaked"] == 0
