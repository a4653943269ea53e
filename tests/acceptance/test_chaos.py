"""The database fails under a running fleet (issue 15, short profile): `callwarden demo`
as a user runs it, with real worker subprocesses killed at random, while its Postgres is
restarted in immediate mode (crash recovery on start) and every connection is cut. The
invariants are the demo's own, checked with SQL afterwards: every job terminal, at most one
upstream create per job, every reservation settled exactly once, no credit leaked, the
projections equal to the fold of the log — and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import psycopg

from engine.store.db import EmbeddedServer

DEADLINE_S = 240


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


def test_demo_chaos_restarts_the_database_and_cuts_connections_and_passes(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "--data-dir", str(tmp_path), "demo",
         "--jobs", "60", "--workers", "2", "--kill-rate", "0.5", "--seed", "5",
         "--chaos", "--chaos-every", "3", "--duration", "150", "--json"],
        env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert_invariants(summary, 60)
    assert summary["database_restarts"] >= 2
    assert summary["connections_cut"] >= 1
    # The restarted server was stopped at the end too (its handle knew the new postmaster).
    pgdata = str(tmp_path / "demo" / "pgdata")
    assert [p.pid for p in psutil.process_iter(attrs=["cmdline"])
            if p.info["cmdline"] and pgdata in " ".join(p.info["cmdline"])] == []


async def _restart_when_busy(server: EmbeddedServer, url: str, times: int) -> int:
    """Restart ``server`` ``times`` times, each once the demo has recorded more events
    since the last (so every restart lands while calls are in flight)."""
    done, seen = 0, 0
    while done < times:
        try:
            with psycopg.connect(url, connect_timeout=2) as c:
                row = c.execute("SELECT count(*) FROM call_events").fetchone()
                n = int(row[0]) if row else 0
        except psycopg.Error:  # not created yet, or still recovering
            n = seen
        if n > seen + 40:
            await asyncio.to_thread(server.restart, down_s=1.5)
            done, seen = done + 1, n
        await asyncio.sleep(0.3)  # a polling period of this observer, not synchronisation
    return done


def test_plain_demo_rides_through_an_external_restart_of_its_database(
        tmp_path: Path) -> None:
    """The operator restarts Postgres under a running demo (DATABASE_URL): the demo, its
    workers, reconciler and webhook receiver keep going and still pass."""
    server = EmbeddedServer(tmp_path / "pg", cleanup="delete")
    try:
        admin = server.url()
        env = {**os.environ, "DATABASE_URL": admin}

        async def go() -> tuple[subprocess.CompletedProcess[str], int]:
            demo = asyncio.create_task(asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "engine.cli", "--data-dir", str(tmp_path), "demo",
                 "--jobs", "60", "--workers", "2", "--seed", "9", "--duration", "150",
                 "--json"],
                env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False))
            demo_db = server.url("callwarden_demo")
            restarts = await asyncio.wait_for(_restart_when_busy(server, demo_db, 2),
                                              timeout=DEADLINE_S)
            return await demo, restarts

        proc, restarts = asyncio.run(go())
    finally:
        server.stop()
    assert restarts == 2
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert_invariants(summary, 60)
