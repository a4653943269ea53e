"""callwarden on Citus (issue 27): ``callwarden migrate`` on a coordinator distributes the
tables, colocated by job id, and a call's transitions, its settlement included, run there;
on plain Postgres migration 0010 changes nothing.

The cluster tests run when ``CALLWARDEN_CITUS_URL`` names a coordinator that ``.ci/citus
start`` made (``.ci/run`` builds Citus 12.1.12 and runs them); without it they are
deselected, not skipped. Each test gets a database of its own on every node
(``.ci/citus db``: Citus 12.1 does not propagate ``CREATE DATABASE``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from callwarden import OwnCalls
from callwarden.database.citus import on_citus
from callwarden.database.clock import utcnow
from callwarden.database.databases import create_database
from callwarden.database.db import Conn, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.migrate import available, migrate, pending
from callwarden.database.write import append, load
from callwarden.errors import TaskAlreadyClaimed
from callwarden.events.types import (
    CallStarted,
    Completed,
    Event,
    FinalizeClaimed,
    StoredMedia,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.providers.outcomes import Succeeded
from callwarden.replay.verify import verify, verify_job

ROOT = Path(__file__).resolve().parents[2]
CITUS = pytest.mark.citus
MEDIA = StoredMedia(key="jobs/a.png", url="file:///a.png", content_type="image/png", size=3)


async def _rows(conn: Conn, sql: str, *params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in await (await conn.execute(sql, params)).fetchall()]


async def test_on_plain_postgres_the_citus_migration_changes_nothing(conn: Conn) -> None:
    """0010 is one DO block that returns without the citus extension: the task index
    stays unique, no task table, no changed keys."""
    found = await _rows(conn, "SELECT to_regclass('callwarden.callwarden_tasks') IS NULL "
                              "AS no_tasks, "
                              "to_regclass('jobs_provider_task_idx') IS NOT NULL AS idx, "
                              "(SELECT max(version) FROM callwarden.callwarden_migrations) AS v")
    assert found == [{"no_tasks": True, "idx": True, "v": max(m.version for m in available())}]
    keys = await _rows(conn, "SELECT conrelid::regclass::text AS t, pg_get_constraintdef(oid) "
                             "AS d FROM pg_constraint WHERE contype = 'p' AND conrelid IN "
                             "('usage_logs'::regclass, 'assets'::regclass) ORDER BY 1")
    assert keys == [{"t": "assets", "d": "PRIMARY KEY (id)"},
                    {"t": "usage_logs", "d": "PRIMARY KEY (id)"}]


@pytest.fixture
async def citus(tmp_path: Path) -> AsyncIterator[Conn]:
    """A fresh database on every node of the cluster, migrated, and a connection to it on
    the coordinator."""
    name = f"cw_citus_{uuid.uuid4().hex[:10]}"
    made = await asyncio.to_thread(subprocess.run, ["bash", str(ROOT / ".ci" / "citus"), "db",
                                                    name], capture_output=True, text=True,
                                   check=False, timeout=60)
    assert made.returncode == 0, made.stderr
    conn = await connect(made.stdout.strip())
    async with conn:
        await migrate(conn)
        yield conn


@pytest.fixture
async def calls(citus: Conn) -> AsyncIterator[OwnCalls]:
    """Own calls recorded on the cluster's database, through a pool of its own."""
    pool = open_pool(citus.info.dsn, max_size=2)
    await pool.open()
    try:
        yield OwnCalls(pool)
    finally:
        await pool.close()


@CITUS
async def test_migrate_distributes_the_tables_colocated_by_job_id(citus: Conn) -> None:
    tables = {r["t"]: r for r in await _rows(
        citus, "SELECT logicalrelid::text AS t, partmethod AS m, colocationid AS g, "
               "CASE WHEN partmethod = 'h' THEN column_to_column_name(logicalrelid, partkey) "
               "END AS col FROM pg_dist_partition")}
    by_job = {"jobs": "id", "callwarden.call_events": "job_id", "usage_logs": "job_id",
              "assets": "job_id", "callwarden.callback_tokens": "job_id"}
    for table, column in by_job.items():
        assert (tables[table]["m"], tables[table]["col"]) == ("h", column), table
    assert len({tables[t]["g"] for t in by_job}) == 1  # one colocation group
    for table in ("workflow_executions", "callwarden.callwarden_migrations"):
        assert tables[table]["m"] == "n", table  # reference tables
    tasks = tables["callwarden.callwarden_tasks"]
    assert (tasks["m"], tasks["col"]) == ("h", "provider_task_id")
    nodes = await _rows(citus, "SELECT count(DISTINCT nodeport) AS n FROM pg_dist_shard s "
                               "JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node d "
                               "USING (groupid) WHERE s.logicalrelid = 'jobs'::regclass")
    assert nodes == [{"n": 2}]  # spread over both workers
    assert await pending(citus) == []
    await migrate(citus)  # again: nothing to do, nothing fails


@CITUS
async def test_follow_balance_refuses_on_the_cluster_and_creates_nothing(citus: Conn) -> None:
    """A trigger on the distributed usage_logs may not write another table: the host is
    told so (0A000, with what to do instead) when it asks, not at its first settlement."""
    await citus.execute("CREATE TABLE accounts (user_id text PRIMARY KEY, balance numeric)")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="Citus runs no trigger"):
        await citus.execute(
            "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')")
    assert await _rows(citus, "SELECT tgname FROM pg_trigger WHERE tgrelid = "
                              "'usage_logs'::regclass AND tgname = 'callwarden_balance'") == []


@CITUS
async def test_a_runtime_role_is_granted_on_the_cluster_and_again_after_migrate(
        citus: Conn) -> None:
    """``callwarden grant`` (grant_runtime) on a cluster: its GRANTs on the distributed
    tables, then on a reference table, in one transaction (Citus refused that as "parallel
    DDL access" until 0017); and ``migrate``'s re-grant of every runtime, which ran it too."""
    role = f"cw_rt_{uuid.uuid4().hex[:8]}"
    await citus.execute(f"CREATE ROLE {role}".encode())
    try:
        granted = await _rows(citus, "SELECT count(*) AS n FROM callwarden.grant_runtime("
                                     "%s::regrole)", role)
        assert granted[0]["n"] > 0
        await migrate(citus)  # re-grants every runtime role
        can = await _rows(citus, "SELECT has_table_privilege(%s, 'workflow_executions', "
                                 "'UPDATE') AS ref, has_table_privilege(%s, 'jobs', 'UPDATE') "
                                 "AS jobs, has_function_privilege(%s, 'callwarden.transition("
                                 "jobs, jsonb)', 'EXECUTE') AS fn", role, role, role)
        assert can == [{"ref": True, "jobs": True, "fn": True}]
    finally:
        await citus.execute(f"DROP OWNED BY {role}".encode())
        await citus.execute(f"DROP ROLE {role}".encode())


@CITUS
async def test_calls_with_their_settlement_run_on_the_cluster(citus: Conn,
                                                              calls: OwnCalls) -> None:
    """An async call (CallStarted, TaskCreated, the success and its finalization, with the
    reservation committed and the workflow reopen) and a sync one, through the fenced write
    path on the distributed tables; the projections equal the fold of the log."""
    async_job = await create_job(citus, credits=7)
    call = await calls.start(async_job, "replicate-prediction")
    await call.task_created("t-citus-1")
    done = await call.report(Succeeded(text="a haiku"))
    assert done.result == "completed", done.detail
    sync_job = await create_job(citus, credits=3)
    async with calls.sync_call(sync_job, "anthropic-sync") as sync:
        sync.succeeded(text="hello")
    settled = await _rows(citus, "SELECT job_id, status FROM usage_logs ORDER BY job_id")
    assert sorted(r["status"] for r in settled) == ["committed", "committed"]
    for job in (async_job, sync_job):
        assert await verify_job(citus, job) == []
    summary, _ = await verify(citus)
    assert (summary.jobs, summary.mismatches, summary.errors) == (2, 0, 0)



class _Remote:
    """What the coordinator sent to the workers (``citus.log_remote_commands``): the
    commands of each transition, the workers they went to, whether it committed in two
    phases."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        message = diag.message_primary or ""
        if message.startswith("issuing "):
            self.sent.append((message.removeprefix("issuing "), diag.message_detail or ""))

    def take(self) -> dict[str, Any]:
        sent, self.sent = self.sent, []
        return {"commands": len(sent),
                "workers": len({re.sub(r" connectionId: \d+", "", d) for _, d in sent}),
                "two_phase": any(c.startswith("PREPARE TRANSACTION") for c, _ in sent)}


async def _transitions(conn: psycopg.AsyncConnection[Any], job: uuid.UUID,
                       remote: _Remote) -> dict[str, dict[str, Any]]:
    """A call's transitions on ``job`` as a worker appends them (the start, the task, and
    the success finalized at once with its asset), with what each sent to the workers."""
    now, who = utcnow(), "worker:citus"
    seen: dict[str, dict[str, Any]] = {}
    p = await load(conn, job)
    remote.take()
    runs: tuple[tuple[str, list[Event]], ...] = (
        ("start", [CallStarted(at=now, actor=who, kind="kie-standard")]),
        ("task_created", [TaskCreated(at=now, actor=who, task_id=f"t-{job}")]),
        ("completion", [
            UpstreamSucceeded(at=now, actor=who,
                              result=UpstreamResult(media_urls=("https://x/a.png",))),
            FinalizeClaimed(at=now, actor=who, owner=who,
                            lease_until=now + timedelta(minutes=1)),
            Completed(at=now, actor=who, media=(MEDIA,), cost=3.0)]),
    )
    for name, run in runs:
        r = await append(conn, job, p, run, assets=(MEDIA,) if name == "completion" else None)
        assert r.ok, name
        p = r.projection
        seen[name] = remote.take()
    return seen


@CITUS
async def test_each_transition_goes_to_the_jobs_one_worker_without_two_phase_commit(
        citus: Conn) -> None:
    """Item 3, from Citus's own view (``citus.log_remote_commands``): every transition of
    a call (its start, a move, the success with its claim, finalization, asset row and
    settlement) goes to the one worker holding the job's shard group and commits there in
    one phase, in the recorded number of remote commands (docs/scaling.md). The
    ``TaskCreated`` also claims the task in ``callwarden_tasks``, whose shard is the
    task's: a second worker, in two phases, when it falls on the other one. The reopen of
    a workflow whose sole failure was this node writes a reference table: every worker, in
    two phases, and the workflow is reopened; a running workflow is only read. (Before the
    Citus form of the append, each transition was planned as sub-plans whose results went
    to both workers: 15 commands and two phases for a move, 47 for the three of an own
    call's success.)"""
    remote = _Remote()
    running, failed = uuid.uuid4(), uuid.uuid4()
    await citus.execute("INSERT INTO workflow_executions (id, status, failed_nodes) VALUES "
                        "(%s, 'running', '{}'), (%s, 'failed', ARRAY['n1'])", (running, failed))
    plain = await create_job(citus, credits=5, workflow_execution_id=running, node_id="n1")
    reopens = await create_job(citus, credits=5, workflow_execution_id=failed, node_id="n1")
    async with await psycopg.AsyncConnection.connect(
            citus.info.dsn, autocommit=True, row_factory=dict_row) as conn:
        await conn.execute("SET citus.log_remote_commands = on")
        await conn.execute("SET client_min_messages = log")
        conn.add_notice_handler(remote)
        seen = await _transitions(conn, plain, remote)
        reopening = await _transitions(conn, reopens, remote)
    one_phase = {"workers": 1, "two_phase": False}
    assert seen["start"] == {"commands": 4, **one_phase}, seen
    for task in (seen["task_created"], reopening["task_created"]):
        assert task in ({"commands": 6, **one_phase},
                        {"commands": 10, "workers": 2, "two_phase": True}), task
    assert seen["completion"] == {"commands": 8, **one_phase}, seen
    assert reopening["completion"] == {"commands": 15, "workers": 2, "two_phase": True}
    assert (await _rows(citus, "SELECT id, status FROM workflow_executions ORDER BY status")
            ) == [{"id": failed, "status": "completed"}, {"id": running, "status": "running"}]
    for job in (plain, reopens):
        assert (await _rows(citus, "SELECT status, credits_charged FROM usage_logs "
                                   "WHERE job_id = %s", job)) == [
            {"status": "committed", "credits_charged": 3}]
        assert len(await _rows(citus, "SELECT 1 FROM assets WHERE job_id = %s", job)) == 1
        assert await verify_job(citus, job) == []


async def _command(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLWARDEN_", "AWS_"))}
    env.update({"DATABASE_URL": url, "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media")})
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "callwarden.cli", *args], env=env, cwd=ROOT,
        capture_output=True, text=True, check=False, timeout=120)


@CITUS
async def test_every_face_reads_the_cluster(citus: Conn, calls: OwnCalls,
                                            tmp_path: Path) -> None:
    """``status``, ``stats``, ``verify``, ``audit``, ``rebuild`` as processes, and the
    operator listener's ``/metrics``, dashboard and job page, over distributed tables
    holding an open (stale) call, a completed one and a job with no call. ``stats`` exited
    2 on GROUP BY ROLLUP, and the stale counts failed on the parameterized SQL function."""
    pool_url = citus.info.dsn
    done = await create_job(citus, credits=2)
    call = await calls.start(done, "replicate-prediction")
    await call.task_created(f"t-{done}")
    await call.report(Succeeded(text="ok"))
    stuck = await create_job(citus, credits=2)  # its worker died two days ago
    ago = utcnow() - timedelta(days=2)
    p = (await append(citus, stuck, await load(citus, stuck), CallStarted(
        at=ago, actor="worker:dead", kind="replicate-prediction"))).projection
    await append(citus, stuck, p, TaskCreated(at=ago, actor="worker:dead",
                                              task_id=f"t-{stuck}"))
    await create_job(citus, credits=1)
    for args in (["status"], ["stats"], ["verify"], ["audit", str(done)],
                 ["rebuild", "--all"]):
        ran = await _command(pool_url, tmp_path, *args)
        assert ran.returncode == 0, (args, ran.stdout, ran.stderr)
    stats = await _command(pool_url, tmp_path, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert re.search(r'"stale"', stats.stdout), stats.stdout

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLWARDEN_", "AWS_"))}
    env.update({"DATABASE_URL": pool_url, "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media"),
                "CALLWARDEN_ADMIN_TOKEN": "citus-admin"})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "serve", "--port", "0", env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        found = re.search(r"operator on (http://\S+)", line)
        assert found, line
        operator = found.group(1)
        admin = {"Authorization": "Bearer citus-admin"}
        async with aiohttp.ClientSession(headers=admin) as http:
            async with http.get(f"{operator}/metrics") as resp:
                text = await resp.text()
                assert resp.status == 200, text
            assert 'callwarden_calls_stale{kind="replicate-prediction"} 1.0' in text, text
            for page in ("/", "/jobs", f"/jobs/{done}"):
                async with http.get(f"{operator}{page}") as resp:
                    assert resp.status == 200, (page, await resp.text())
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=30)


@CITUS
async def test_the_demo_runs_on_the_cluster_with_its_invariants(tmp_path: Path) -> None:
    """Item 6: ``callwarden demo`` with ``DATABASE_URL`` at the coordinator makes its
    database on every node (the extension and the workers registered in it), distributes
    the tables over both workers, and passes with killed workers and every invariant,
    the settlement audit (a trigger on every shard of ``usage_logs``) included."""
    admin = os.environ["CALLWARDEN_CITUS_URL"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLWARDEN_", "AWS_"))}
    env["DATABASE_URL"] = admin
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "callwarden.cli", "--data-dir", str(tmp_path), "demo",
         "--jobs", "30", "--workers", "2", "--kill-rate", "0.7", "--seed", "5",
         "--duration", "150", "--json"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert (summary["jobs"], summary["non_terminal"], summary["duplicate_settlements"],
            summary["credits"]["leaked"], summary["verify_mismatches"],
            summary["upstream_creates_max_per_job"]) == (30, 0, 0, 0, 0, 1)
    async with await connect(make_conninfo(admin, dbname="callwarden_demo")) as conn:
        spread = await _rows(conn, "SELECT s.logicalrelid::text AS t, "
                                   "count(DISTINCT d.nodeport) AS nodes FROM pg_dist_shard s "
                                   "JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node "
                                   "d USING (groupid) GROUP BY 1 ORDER BY 1")
        audited = await _rows(conn, "SELECT count(*) AS n FROM demo_usage_audit")
    nodes = {r["t"]: r["nodes"] for r in spread}
    for table in ("jobs", "callwarden.call_events", "usage_logs", "demo_usage_audit"):
        assert nodes[table] == 2, nodes
    assert audited[0]["n"] >= 30  # every reservation's move, seen on its shard


@CITUS
async def test_a_database_migrated_before_citus_is_distributed_and_its_calls_finish() -> None:
    """Moving to Citus: a database migrated on one node (0010 then a no-op) gets the
    extension and its workers (``.ci/citus db``, the steps of docs/scaling.md); the next
    ``migrate`` distributes its tables with their rows, records nothing new, and a call
    that was in flight before the move finishes on the cluster, settled once."""
    admin = os.environ["CALLWARDEN_CITUS_URL"]
    name = f"cw_moved_{uuid.uuid4().hex[:10]}"
    url = await asyncio.to_thread(create_database, admin, name, cluster=False)
    async with await connect(url) as conn:
        await migrate(conn)
        flying = await create_job(conn, credits=4)
        now, who = utcnow(), "worker:before-the-move"
        p = (await append(conn, flying, await load(conn, flying),
                          CallStarted(at=now, actor=who, kind="replicate-prediction"))).projection
        await append(conn, flying, p, TaskCreated(at=now, actor=who, task_id=f"t-{flying}"))
        versions = await _rows(conn, "SELECT version FROM callwarden.callwarden_migrations "
                                     "ORDER BY 1")
    made = await asyncio.to_thread(subprocess.run, ["bash", str(ROOT / ".ci" / "citus"), "db",
                                                    name], capture_output=True, text=True,
                                   check=False, timeout=60)
    assert made.returncode == 0, made.stderr
    async with await connect(url) as conn:
        assert await migrate(conn) == []
        assert await on_citus(conn)  # (migrate made this process ask again)
        assert await _rows(conn, "SELECT version FROM callwarden.callwarden_migrations ORDER BY 1"
                           ) == versions
        spread = await _rows(conn, "SELECT logicalrelid::text AS t FROM pg_dist_partition "
                                   "WHERE partmethod = 'h' ORDER BY 1")
        assert sorted(r["t"] for r in spread) == [
            "assets", "callwarden.call_events", "callwarden.callback_tokens",
            "callwarden.callwarden_tasks", "callwarden.waiting", "jobs", "usage_logs"]
        pool = open_pool(url, max_size=2)
        await pool.open()
        try:
            call = await OwnCalls(pool).start(flying, "replicate-prediction")
            assert call.resume_task_id == f"t-{flying}"
            done = await call.report(Succeeded(text="after the move"))
        finally:
            await pool.close()
        assert done.result == "completed", done.detail
        assert await _rows(conn, "SELECT status FROM usage_logs WHERE job_id = %s",
                           flying) == [{"status": "committed"}]
        assert await verify_job(conn, flying) == []
        # the task written before the move is still its job's alone (callwarden_tasks)
        other = await create_job(conn, credits=1)
        p = (await append(conn, other, await load(conn, other), CallStarted(
            at=now, actor=who, kind="replicate-prediction"))).projection
        with pytest.raises(TaskAlreadyClaimed):
            await append(conn, other, p, TaskCreated(at=now, actor=who, task_id=f"t-{flying}"))
