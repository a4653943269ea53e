"""A database an earlier release wrote, upgraded to callwarden's own schema (issue 39,
migration 0011; docs/security.md, "Upgrading").

The earlier release's database is made as that release made it: migrations 0001..0010
(immutable files: the same schema it left), its bookkeeping table where its ``migrate``
kept it, and two calls in flight written with the rows its write path wrote (the same
event encodings, the projection columns a ``TaskCreated`` leaves, the callback token on the
job's row), plus a processed webhook delivery. Then this release's ``migrate``:

- moves everything of callwarden's out of ``public`` with every row unchanged (the log
  byte for byte, migration versions and their dates, the token, the delivery);
- finishes both calls: one whose worker died, by the reconciler; one by the KIE callback
  its upstream task was created with (the token still matches; another does not);
- each settles once, and every job's columns equal the fold of its log.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psycopg
import pytest

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, connect, open_pool
from callwarden.database.migrate import available, migrate
from callwarden.events.codec import encode
from callwarden.events.types import CallStarted, Event, TaskCreated
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from tests.support.calls import NOW_SCRIPT, upstream_task
from tests.support.webhooks import serving

DEAD = "worker:old-release"
LOG = ("SELECT job_id, seq, type, version, payload::text AS payload, actor, recorded_at "
       "FROM {} ORDER BY job_id, seq")


async def _earlier_release(conn: Conn) -> None:
    """0001..0010 as the earlier release's ``migrate`` applied them."""
    await conn.execute("CREATE TABLE callwarden_migrations (version int PRIMARY KEY, "
                       "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
    for mig in available():
        if mig.version <= 10:
            await conn.execute(mig.sql.encode())
            await conn.execute("INSERT INTO callwarden_migrations (version, name, applied_at) "
                               "VALUES (%s, %s, now() - interval '30 days')",
                               (mig.version, mig.name))


async def _in_flight(conn: Conn, task: str, *, age: timedelta, token: str | None) -> uuid.UUID:
    """A KIE call whose worker recorded CallStarted and TaskCreated ``age`` ago, with the
    rows the earlier release's write path wrote for them."""
    job, at = uuid.uuid4(), utcnow() - age
    await conn.execute("INSERT INTO jobs (id, user_id, status) VALUES (%s, 'user-1', "
                       "'processing')", (job,))
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, credits_reserved) "
                       "VALUES (%s, 'user-1', 10)", (job,))
    events: list[Event] = [CallStarted(at=at, actor=DEAD, kind="kie-standard"),
                           TaskCreated(at=at, actor=DEAD, task_id=task)]
    for seq, event in enumerate(events, start=1):
        name, version, payload = encode(event)
        await conn.execute("INSERT INTO call_events (job_id, seq, type, version, payload, "
                           "actor) VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                           (job, seq, name, version, payload.decode(), DEAD))
    await conn.execute(
        "UPDATE jobs SET provider_kind = 'kie-standard', provider_task_id = %s, "
        "provider_call_started_at = %s, call_state = 'polling', call_version = 2, "
        "heartbeat_at = %s, heartbeat_owner = %s, callback_token = %s WHERE id = %s",
        (task, at, at, DEAD, token, job))
    return job


async def _rows(conn: Conn, sql: str, *params: Any) -> list[dict[str, Any]]:
    return await (await conn.execute(sql.encode(), params or None)).fetchall()


async def test_an_earlier_releases_database_moves_and_finishes_its_calls(
        empty_db_url: str, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    async with await connect(empty_db_url) as conn:
        await _earlier_release(conn)
        dead = await _in_flight(conn, await upstream_task(http, sim, "kie-standard",
                                                          NOW_SCRIPT),
                                age=timedelta(minutes=40), token=None)
        called = await _in_flight(conn, await upstream_task(http, sim, "kie-standard",
                                                            NOW_SCRIPT),
                                  age=timedelta(seconds=5), token="old-release-token")
        await conn.execute("INSERT INTO webhook_deliveries (provider, delivery_id, job_id) "
                           "VALUES ('replicate', 'msg_old', %s)", (called,))
        log = await _rows(conn, LOG.format("call_events"))
        versions = await _rows(conn, "SELECT * FROM callwarden_migrations ORDER BY version")

        applied = await migrate(conn)
        assert [m.version for m in applied] == [m.version for m in available()
                                                if m.version > 10]
        assert await _rows(conn, LOG.format("callwarden.call_events")) == log
        assert (await _rows(conn, "SELECT * FROM callwarden.callwarden_migrations "
                            "WHERE version <= 10 ORDER BY version")) == versions
        assert await _rows(conn, "SELECT job_id, token FROM callwarden.callback_tokens") == [
            {"job_id": called, "token": "old-release-token"}]
        assert await _rows(conn, "SELECT delivery_id FROM callwarden.webhook_deliveries") == [
            {"delivery_id": "msg_old"}]
        left = await _rows(conn, "SELECT to_regclass('public.call_events') AS log, "
                           "to_regclass('public.callwarden_migrations') AS book, "
                           "to_regclass('public.webhook_deliveries') AS replay")
        assert left == [{"log": None, "book": None, "replay": None}]
        column = await _rows(conn, "SELECT column_name FROM information_schema.columns "
                             "WHERE table_name = 'jobs' AND column_name = 'callback_token'")
        assert column == []

    async with open_pool(empty_db_url, max_size=4) as pool:
        reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path / "rec"),
                                config=ReconcileConfig())
        try:
            counts = await reconciler.reconcile_once(utcnow())
        finally:
            await reconciler.aclose()
        assert (counts.recovered, counts.completed) == (1, 1)

        async with serving(pool, sim, http, tmp_path) as service:
            task = (await _call(pool, called))["provider_task_id"]
            body = msgspec.json.encode({"code": 200, "msg": "success",
                                        "data": {"taskId": task, "state": "success"}})
            base = f"{service.url}/webhooks/kie/{called}"
            async with http.post(f"{base}/another-token", data=body) as resp:
                assert resp.status == 401
            async with http.post(f"{base}/old-release-token", data=body) as resp:
                assert resp.status == 200, await resp.text()
            await service.drain()

        async with pool.connection() as conn:
            for job in (dead, called):
                row = await _call(pool, job)
                assert (row["call_state"], row["credits"], row["completions"]) == (
                    "completed", "committed", 1), row
                assert await verify_job(conn, job) == []


async def _call(pool: Any, job: uuid.UUID) -> dict[str, Any]:
    async with pool.connection() as conn:
        row = await (await conn.execute(
            "SELECT j.call_state, j.provider_task_id, u.status AS credits, "
            "(SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id "
            " AND e.type = 'Completed') AS completions "
            "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s",
            (job,))).fetchone()
    assert row is not None
    return dict(row)


async def test_the_guard_lets_callwardens_runtime_and_owner_through_and_no_one_else(
        db_url: str, conn: Conn) -> None:
    """A role that may not append to the log changes none of callwarden's columns of
    ``jobs`` or ``usage_logs.settled_by_seq``, on update or insert, whatever its table
    grants; granted the runtime (``callwarden.grant_runtime``) it may; its own columns it
    always may."""
    role = f"cw_guard_{uuid.uuid4().hex[:8]}"
    job = uuid.uuid4()
    await conn.execute(f"CREATE ROLE {role} LOGIN".encode())
    try:
        await conn.execute(f"GRANT SELECT, INSERT, UPDATE ON jobs, usage_logs TO {role}"
                           .encode())
        await conn.execute("INSERT INTO jobs (id, user_id) VALUES (%s, 'u')", (job,))
        await conn.execute("INSERT INTO usage_logs (job_id, user_id, credits_reserved) "
                           "VALUES (%s, 'u', 1)", (job,))
        url = psycopg.conninfo.make_conninfo(db_url, user=role)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
            await other.execute("UPDATE jobs SET input_data = '{\"a\": 1}' WHERE id = %s",
                                (job,))
            for sql in ("UPDATE jobs SET call_state = 'failed' WHERE id = %s",
                        "UPDATE jobs SET heartbeat_at = now() WHERE id = %s",
                        "UPDATE usage_logs SET settled_by_seq = 1 WHERE job_id = %s",
                        "INSERT INTO jobs (id, user_id, provider_kind) VALUES ("
                        "gen_random_uuid(), 'u', %s::text)"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege,
                                   match="may not write callwarden's columns"):
                    await other.execute(sql.encode(), (str(job) if "%s::text" not in sql
                                                       else "kie-standard",))
            # the host settles and corrects its own reservations; callwarden's stamp stays
            await conn.execute("UPDATE usage_logs SET settled_by_seq = 3 WHERE job_id = %s",
                               (job,))
            await other.execute("UPDATE usage_logs SET status = 'refunded', "
                                "credits_charged = 0 WHERE job_id = %s", (job,))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await other.execute("UPDATE usage_logs SET settled_by_seq = NULL "
                                    "WHERE job_id = %s", (job,))
            await conn.execute("SELECT callwarden.grant_runtime(%s::regrole)", (role,))
            await other.execute("UPDATE jobs SET call_state = 'failed' WHERE id = %s", (job,))
    finally:
        await conn.execute(f"DROP OWNED BY {role}".encode())
        await conn.execute(f"DROP ROLE {role}".encode())
    state = await _rows(conn, "SELECT call_state, input_data FROM jobs WHERE id = %s", job)
    assert state == [{"call_state": "failed", "input_data": {"a": 1}}]


async def test_host_tables_outside_public_are_the_ones_callwarden_names(
        empty_db_url: str) -> None:
    """A host whose tables live in its own schema (found through the search_path, as the
    engine's statements find them): 0011's function and grant name that schema's jobs,
    never a public one."""
    async with await connect(empty_db_url) as conn:
        await conn.execute("CREATE SCHEMA app")
        await conn.execute("SET search_path = app, public")
        await migrate(conn)
        where = await _rows(conn, "SELECT to_regclass('app.jobs') IS NOT NULL AS app, "
                            "to_regclass('public.jobs') IS NULL AS no_public")
        assert where == [{"app": True, "no_public": True}]
        await conn.execute("INSERT INTO jobs (id, user_id, status, provider_kind, "
                           "provider_call_started_at) VALUES (gen_random_uuid(), 'u', "
                           "'processing', 'kie-standard', now() - interval '2 hours')")
        stale = await _rows(conn, "SELECT count(*) AS n FROM callwarden.callwarden_stale_jobs("
                            "'{}', 60, 60, now())")
        assert stale == [{"n": 1}]
        role = f"cw_app_{uuid.uuid4().hex[:8]}"
        await conn.execute(f"CREATE ROLE {role}".encode())
        try:
            said = [r["stmt"] for r in await _rows(
                conn, "SELECT callwarden.grant_runtime(%s::regrole) AS stmt", role)]
            assert any("app.jobs" in s for s in said), said
            assert not any("public." in s for s in said), said
        finally:
            await conn.execute(f"DROP OWNED BY {role}".encode())
            await conn.execute(f"DROP ROLE {role}".encode())
