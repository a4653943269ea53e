"""callwarden in a shared database (issue 39): on an emulated Supabase project
(tests/fixtures/supabase.sql: the API roles, the non-superuser owner, Supabase's default
privileges on public, the host's tables under row-level security), migrated by the
owner with the real CLI, its runtime granted with ``callwarden grant``.

Each probe is made the way a browser's request reaches the database: PostgREST connects
as ``authenticator`` and ``SET ROLE``s to ``anon`` or ``authenticated`` with the JWT's
claims. Every probe that reached callwarden's objects in ``public`` before the move is
refused with ``insufficient_privilege``; a signed-in user can still rename their own job
but not rewrite its call; the lints Supabase runs on a project (splinter's "RLS disabled
in public", "function search_path mutable", "security definer function executable")
find nothing of callwarden's; and callwarden's real processes, as the runtime role, run
a call to completion, recover a dead worker's call, and verify, while ``check`` names
every other role that can reach callwarden's objects (exit 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from callwarden.database.databases import create_database, drop_database
from callwarden.database.migrate import available
from callwarden.providers.simulator.core import RunningSimulator
from tests.acceptance.conftest import ROOT
from tests.support.calls import NOW_SCRIPT, REQUESTS, upstream_task
from tests.support.processes import cli, environment

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "supabase.sql"
OWNER, RUNTIME = "cw_sb_postgres", "cw_sb_runtime"
USER_A, USER_B = "user-a", "user-b"
SCRIPT = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded"}


@dataclass
class Project:
    admin: str  # a superuser: Supabase's supabase_admin
    owner: str  # the project's `postgres`: runs migrate
    runtime: str  # callwarden's runtime role
    api: str  # PostgREST's authenticator


def _fixture_parts() -> tuple[list[str], str]:
    text = FIXTURE.read_text(encoding="utf-8").replace("{owner}", OWNER).replace(
        "{runtime}", RUNTIME)
    roles, database = text.split("\n-- roles", 1)[1].split("\n", 1)[1].split(
        "-- end roles", 1)
    statements = [ln.strip() for ln in roles.splitlines()
                  if ln.strip() and not ln.lstrip().startswith("--")]
    return statements, database.replace("-- {host_tables}", available()[0].sql)


def _make_roles(admin: str, statements: list[str]) -> None:
    """The cluster's roles, made once (a role another test run made is taken as it is)."""
    with psycopg.connect(admin, autocommit=True) as c:
        for statement in statements:
            with contextlib.suppress(psycopg.errors.DuplicateObject,
                                     psycopg.errors.UniqueViolation):
                c.execute(statement.encode())


@pytest.fixture
def project(pg_admin_url: str) -> Iterator[Project]:
    roles, database = _fixture_parts()
    _make_roles(pg_admin_url, roles)
    name = f"cw_supabase_{uuid.uuid4().hex[:12]}"
    admin = create_database(pg_admin_url, name)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f"ALTER DATABASE {name} OWNER TO {OWNER}".encode())
        c.execute(f"ALTER SCHEMA public OWNER TO {OWNER}".encode())
    at = Project(admin, make_conninfo(admin, user=OWNER), make_conninfo(admin, user=RUNTIME),
                 make_conninfo(admin, user="authenticator"))
    with psycopg.connect(at.owner, autocommit=True) as c:
        c.execute(database.encode())
    yield at
    drop_database(pg_admin_url, name)


async def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                     row_factory=dict_row) as c:
        cur = await c.execute(sql.encode(), params or None)
        return await cur.fetchall() if cur.description else []


async def _as(project: Project, role: str, user: str | None, sql: str, *params: Any
              ) -> list[dict[str, Any]]:
    """``sql`` as PostgREST runs a request: connected as authenticator, in a transaction
    that SET ROLEs to ``role`` with the JWT's claims (``sub`` = ``user``)."""
    async with await psycopg.AsyncConnection.connect(project.api,
                                                     row_factory=dict_row) as c:
        try:
            await c.execute(f"SET LOCAL ROLE {role}".encode())
            await c.execute("SELECT set_config('request.jwt.claims', %s, true)",
                            (json.dumps({"sub": user, "role": role}) if user else "",))
            cur = await c.execute(sql.encode(), params or None)
            rows = await cur.fetchall() if cur.description else []
            return [*rows, {"rowcount": cur.rowcount}]
        finally:
            await c.rollback()


async def _refused(project: Project, role: str, user: str | None, sql: str, *params: Any
                   ) -> str:
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
        await _as(project, role, user, sql, *params)
    return str(refused.value)


async def _until(what: str, check: Any, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.fixture
async def called(project: Project, sim: RunningSimulator, tmp_path: Path
                 ) -> dict[str, uuid.UUID]:
    """callwarden migrated by the owner and granted to the runtime, both with the CLI;
    then, as the runtime role only: user A's job enqueued and run to completion by a
    worker process (with a callback URL, so the call has a callback token), and user B's
    call, left by a dead worker, recovered by ``reconcile --once``."""
    owner_env = environment(project.owner, sim, tmp_path / "media")
    code, out, err = await cli(["migrate"], owner_env)
    assert code == 0, out + err
    code, out, err = await cli(["grant", RUNTIME], owner_env)
    assert code == 0, out + err
    assert f"{RUNTIME} is callwarden's runtime role" in out, out

    env = environment(project.runtime, sim, tmp_path / "media")
    request = json.dumps(REQUESTS["kie-standard"](SCRIPT))
    code, out, err = await cli(["enqueue", "--kind", "kie-standard", "--request", request,
                                "--credits", "5", "--user", USER_A], env)
    assert code == 0, out + err
    (a,) = [r["id"] for r in await _rows(project.owner, "SELECT id FROM jobs")]
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "worker", "--poll-interval", "0.2",
        "--poll-empty", "0.1", env={**env, "CALLWARDEN_CALLBACK_BASE_URL": "http://127.0.0.1:9"},
        cwd=ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        async def acked() -> bool:
            rows = await _rows(project.owner, "SELECT queue_acked_at FROM jobs WHERE id = %s",
                               a)
            return rows[0]["queue_acked_at"] is not None
        await _until("the runtime's worker to finish user A's call", acked)
    finally:
        worker.terminate()
        log, _ = await worker.communicate()
    assert worker.returncode == 0, log.decode()

    async with aiohttp.ClientSession() as http:
        task = await upstream_task(http, sim, "kie-standard", NOW_SCRIPT)
    b = uuid.uuid4()
    # the host's own Phase 1 writes, as the project's owner (its backend)
    await _rows(project.owner,
                "INSERT INTO jobs (id, user_id, status, created_at) "
                "VALUES (%s, %s, 'processing', now() - interval '1 hour')", b, USER_B)
    await _rows(project.owner, "INSERT INTO usage_logs (job_id, user_id, credits_reserved) "
                "VALUES (%s, %s, 7)", b, USER_B)
    await _rows(project.owner,
                "UPDATE jobs SET provider_kind = 'kie-standard', provider_task_id = %s, "
                "provider_call_started_at = now() - interval '40 minutes' WHERE id = %s",
                task, b)
    code, out, err = await cli(["reconcile", "--once", "--json"], env)
    assert code == 0, out + err
    assert json.loads(out)["recovered"] == 1, out
    return {"a": a, "b": b}


async def test_callwardens_processes_work_as_the_runtime_role_alone(
        project: Project, called: dict[str, uuid.UUID], sim: RunningSimulator,
        tmp_path: Path) -> None:
    """The runtime role ran a call and a recovery (the fixture); here what they wrote,
    read by SQL: both completed and committed once, one asset each, a callback token kept
    in callwarden's schema; ``verify`` as the runtime finds no drift; ``check`` as the
    owner names the runtime and nothing else (exit 0)."""
    rows = await _rows(
        project.owner,
        "SELECT j.id, j.call_state, u.status AS credits, "
        "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets, "
        "(SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id "
        " AND e.type = 'Completed') AS completions "
        "FROM jobs j JOIN usage_logs u ON u.job_id = j.id ORDER BY j.user_id")
    assert [(r["call_state"], r["credits"], r["assets"], r["completions"]) for r in rows] == [
        ("completed", "committed", 1, 1)] * 2
    tokens = await _rows(project.owner, "SELECT job_id FROM callwarden.callback_tokens")
    assert [t["job_id"] for t in tokens] == [called["a"]]

    env = environment(project.runtime, sim, tmp_path / "media")
    code, out, err = await cli(["verify"], env)
    assert code == 0, out + err
    code, out, err = await cli(["check"], environment(project.owner, sim, tmp_path / "m"))
    assert code == 0, out + err
    assert f"runtime role(s): {RUNTIME}" in out
    assert "only callwarden's runtime may write its columns of jobs" in out


async def test_api_roles_reach_nothing_of_callwardens(
        project: Project, called: dict[str, uuid.UUID]) -> None:
    """Every probe of the issue, as anon or as a signed-in user, is refused: reading the
    log (another user's job's events included), forging an event, the replay table, the
    bookkeeping table, truncating the log, the functions, the callback tokens; and
    nothing of callwarden's is left in public."""
    a, b = called["a"], called["b"]
    probes = [
        ("anon", None, "SELECT * FROM callwarden.call_events"),
        ("authenticated", USER_A, f"SELECT * FROM callwarden.call_events WHERE job_id = '{b}'"),
        ("anon", None, "INSERT INTO callwarden.call_events (job_id, seq, type, payload, actor)"
                       f" VALUES ('{a}', 99, 'Completed', '{{}}', 'anon')"),
        ("anon", None, "INSERT INTO callwarden.webhook_deliveries (provider, delivery_id) "
                       "VALUES ('kie', 'x')"),
        ("anon", None, "DELETE FROM callwarden.webhook_deliveries"),
        ("anon", None, "DELETE FROM callwarden.callwarden_migrations"),
        ("anon", None, "TRUNCATE callwarden.call_events"),
        ("anon", None, "SELECT callwarden.callwarden_is_stale(now(), now(), now(), now(), "
                       "'x', '{}', 1, 1, now())"),
        ("anon", None, "SELECT * FROM callwarden.callwarden_stale_jobs('{}', 1, 1, now())"),
        ("authenticated", USER_A, "SELECT * FROM callwarden.callback_tokens"),
        ("authenticated", USER_A, "SELECT callwarden.grant_runtime('authenticated')"),
    ]
    for role, user, sql in probes:
        message = await _refused(project, role, user, sql)
        assert "permission denied for schema callwarden" in message, (sql, message)
    left = await _rows(project.owner,
                       "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::"
                       "regnamespace AND c.relname IN ('call_events', 'webhook_deliveries', "
                       "'callwarden_migrations', 'callwarden_tasks', 'callback_tokens') "
                       "UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = "
                       "'public'::regnamespace AND proname LIKE 'callwarden%%'")
    assert left == []


async def test_a_user_renames_their_job_but_never_rewrites_its_call(
        project: Project, called: dict[str, uuid.UUID]) -> None:
    """Under the host's own "rename my job" policy a signed-in user updates their row's
    own columns; every column callwarden adds is refused by the guard (0011), on update
    and on insert; the row they read carries no callback token."""
    a = called["a"]
    renamed = await _as(project, "authenticated", USER_A,
                        "UPDATE jobs SET input_data = input_data || '{\"title\": \"mine\"}' "
                        "WHERE id = %s", a)
    assert renamed[-1]["rowcount"] == 1
    for column, value in [("call_state", "'failed'"), ("call_version", "1"),
                          ("finalize_lease_until", "now() + interval '1 day'"),
                          ("provider_task_id", "'task-of-mine'"),
                          ("reconcile_attempts", "5"), ("call_output", "'{}'"),
                          ("queue_acked_at", "NULL")]:
        message = await _refused(project, "authenticated", USER_A,
                                 f"UPDATE jobs SET {column} = {value} WHERE id = %s", a)
        assert "may not write callwarden's columns of public.jobs" in message, (column,
                                                                                 message)
    message = await _refused(
        project, "authenticated", USER_A,
        "INSERT INTO jobs (id, user_id, call_state) VALUES (gen_random_uuid(), %s, "
        "'completed')", USER_A)
    assert "may not write callwarden's columns" in message
    made = await _as(project, "authenticated", USER_A,
                     "INSERT INTO jobs (id, user_id) VALUES (gen_random_uuid(), %s)", USER_A)
    assert made[-1]["rowcount"] == 1
    (own, _count) = await _as(project, "authenticated", USER_A,
                              "SELECT * FROM jobs WHERE id = %s", a)
    assert own["call_state"] == "completed"
    assert not [k for k in own if "token" in k]
    seen = await _as(project, "authenticated", USER_A, "SELECT id FROM jobs")
    assert [r["id"] for r in seen[:-1]] == [a]  # RLS: user B's job is not theirs


# The lints Supabase runs on a project (supabase/splinter), restated: each lists what it
# finds among the schemas callwarden writes to (public, callwarden).
LINTS = {
    "rls_disabled_in_public": """
        SELECT format('%s.%s', n.nspname, c.relname) AS found
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind = 'r' AND NOT c.relrowsecurity AND n.nspname = 'public'
          AND (has_table_privilege('anon', c.oid, 'SELECT')
               OR has_table_privilege('authenticated', c.oid, 'SELECT'))""",
    "function_search_path_mutable": """
        SELECT format('%s.%s', n.nspname, p.proname) AS found
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname IN ('public', 'callwarden')
          AND NOT EXISTS (SELECT 1 FROM unnest(coalesce(p.proconfig, '{}')) AS setting
                          WHERE setting LIKE 'search_path=%%')""",
    "security_definer_function_executable": """
        SELECT format('%s.%s', n.nspname, p.proname) AS found
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname IN ('public', 'callwarden') AND p.prosecdef
          AND (has_function_privilege('anon', p.oid, 'EXECUTE')
               OR has_function_privilege('authenticated', p.oid, 'EXECUTE'))""",
}


async def test_supabases_lints_find_nothing_of_callwardens(
        project: Project, called: dict[str, uuid.UUID]) -> None:
    """Supabase's security lints, restated, find nothing in public or callwarden's
    schema: no table the API roles can read without RLS, no function with a mutable
    search_path, no SECURITY DEFINER function they can run."""
    for lint, sql in LINTS.items():
        assert await _rows(project.owner, sql) == [], lint


async def test_check_names_every_other_role_that_reaches_callwarden(
        project: Project, called: dict[str, uuid.UUID], sim: RunningSimulator,
        tmp_path: Path) -> None:
    """A grant a dashboard click might make (SELECT on the log to authenticated, EXECUTE
    to PUBLIC, a grant to a role that also writes everything through pg_write_all_data),
    or the runtime's row-level security policy gone, turns ``check`` to exit 2, naming the
    role and the objects; undone, it is clean again."""
    env = environment(project.owner, sim, tmp_path / "media")
    # a monitoring role that writes everything (pg_write_all_data): a note, not a problem
    reader = f"cw_sb_reader_{uuid.uuid4().hex[:8]}"
    await _rows(project.admin, f"CREATE ROLE {reader}; GRANT pg_write_all_data TO {reader}")
    try:
        await _check_names(project, env, reader)
    finally:
        await _rows(project.admin, f"DROP OWNED BY {reader}; DROP ROLE {reader}")


async def _check_names(project: Project, env: dict[str, str], reader: str) -> None:
    code, out, err = await cli(["check"], env)
    assert code == 0, out + err
    assert f"{reader} reaches callwarden's objects through pg_read_all_data" in " ".join(
        out.split())
    for grant, revoke, named in [
            ("GRANT USAGE ON SCHEMA callwarden TO authenticated; "
             "GRANT SELECT ON callwarden.call_events TO authenticated",
             "REVOKE ALL ON callwarden.call_events FROM authenticated; "
             "REVOKE USAGE ON SCHEMA callwarden FROM authenticated",
             "authenticated is not callwarden's runtime but can reach table call_events"),
            ("GRANT EXECUTE ON FUNCTION callwarden.callwarden_stale_jobs(jsonb, float8, "
             "float8, timestamptz) TO PUBLIC",
             "REVOKE EXECUTE ON FUNCTION callwarden.callwarden_stale_jobs(jsonb, float8, "
             "float8, timestamptz) FROM PUBLIC",
             "PUBLIC (every role) holds privileges on callwarden's function "
             "callwarden_stale_jobs"),
            (f"DROP POLICY callwarden_{RUNTIME} ON jobs",
             f"SELECT callwarden.grant_runtime('{RUNTIME}')",
             f"runtime role {RUNTIME} sees no row of jobs under its row-level security"),
            (f"GRANT SELECT ON callwarden.webhook_deliveries TO {reader}",
             f"REVOKE SELECT ON callwarden.webhook_deliveries FROM {reader}",
             f"{reader} is not callwarden's runtime but can reach table "
             "webhook_deliveries")]:
        await _rows(project.owner, grant)
        code, out, err = await cli(["check"], env)
        assert code == 2, out + err
        assert named in re.sub(r"\s+", " ", err), err
        await _rows(project.owner, revoke)
        code, out, err = await cli(["check"], env)
        assert code == 0, out + err


async def test_a_role_never_granted_is_told_how_to_become_the_runtime(
        project: Project, called: dict[str, uuid.UUID], sim: RunningSimulator,
        tmp_path: Path) -> None:
    """A process connected as a role the owner never granted (here PostgREST's
    authenticator) is refused by the database, and the error says what to run."""
    code, out, err = await cli(["verify"], environment(project.api, sim, tmp_path / "m"))
    assert code != 0, out + err
    said = " ".join(err.split())
    assert "permission denied for schema callwarden" in said, said
    assert "the owner grants it with `callwarden grant ROLE`" in said, said


async def test_migrate_grants_the_runtime_again_what_it_lacks(
        project: Project, called: dict[str, uuid.UUID], sim: RunningSimulator,
        tmp_path: Path) -> None:
    """A runtime missing part of its set (as after a migration that adds an object, or a
    late move to Citus that makes the task table) has it back after ``migrate``, which
    grants every runtime role again; no other role gains anything."""
    await _rows(project.owner, f"REVOKE INSERT ON callwarden.callback_tokens FROM {RUNTIME}")
    query = ("SELECT has_table_privilege(%s, 'callwarden.callback_tokens', 'INSERT') AS r, "
             "has_table_privilege('anon', 'callwarden.callback_tokens', 'INSERT') AS anon")
    assert await _rows(project.owner, query, RUNTIME) == [{"r": False, "anon": False}]
    code, out, err = await cli(["migrate"], environment(project.owner, sim, tmp_path / "m"))
    assert code == 0, out + err
    assert await _rows(project.owner, query, RUNTIME) == [{"r": True, "anon": False}]
