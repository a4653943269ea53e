"""The one error boundary (engine/database/boundary.py), driven with a real server: a pool
that cannot lend a connection, a dropped connection, a server that says it is not there for
us (class 08, 57P01-03, read-only 25006) and a failing statement all come out as the
engine's types, the driver's error kept as ``__cause__``, and nothing is written; a
connection that met a read-only server is not lent again."""

from __future__ import annotations

from pathlib import Path

import psycopg
import psycopg_pool
import pytest

from callwarden.cli.main import main
from callwarden.database.boundary import connection, transaction, translated
from callwarden.database.db import Conn, Pool, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.write import execute
from callwarden.errors import ConfigError, DatabaseError, DatabaseUnavailable, WriteConflict


async def test_a_pool_that_cannot_lend_a_connection_is_unavailable(db_url: str) -> None:
    async with open_pool(db_url, min_size=1, max_size=1) as pool, connection(pool):
        with pytest.raises(DatabaseUnavailable) as caught:
            async with connection(pool, wait_s=0.05):
                pass
    assert isinstance(caught.value.__cause__, psycopg_pool.PoolTimeout)


async def test_a_connection_dropped_inside_the_block_is_unavailable(db_url: str) -> None:
    async def drop_mine_then_query(pool: Pool, admin: Conn) -> None:
        async with connection(pool) as conn:
            pid = await (await conn.execute("SELECT pg_backend_pid() AS p")).fetchone()
            assert pid is not None
            await admin.execute("SELECT pg_terminate_backend(%s::int)", (pid["p"],))
            await conn.execute("SELECT 1")

    async with open_pool(db_url, min_size=1, max_size=2) as pool, await connect(db_url) as admin:
        with pytest.raises(DatabaseUnavailable):
            await drop_mine_then_query(pool, admin)


async def test_a_failing_statement_is_a_database_error_named_by_sqlstate(db_url: str) -> None:
    async with await connect(db_url) as conn:
        with pytest.raises(DatabaseError) as caught, translated():
            await conn.execute("SELECT 1 / 0")
    assert not isinstance(caught.value, DatabaseUnavailable)
    assert isinstance(caught.value.__cause__, psycopg.errors.DivisionByZero)


# What a server says when it is not there for us: the whole connection-exception class
# (08), the server shutting down, crashed or not yet accepting connections (57P01-03), and
# a read-only server (25006: a standby, a primary being demoted at a failover).
UNAVAILABLE = ["08000", "08003", "08006", "08001", "08004", "08007", "08P01",
               "57P01", "57P02", "57P03", "25006"]


@pytest.mark.parametrize("sqlstate", UNAVAILABLE)
async def test_a_server_that_is_not_there_for_us_is_unavailable(conn: Conn,
                                                               sqlstate: str) -> None:
    """Raised by the server itself with that SQLSTATE (read by code, never by text)."""
    with pytest.raises(DatabaseUnavailable) as caught, translated():
        await conn.execute(f"DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '{sqlstate}'; "
                           "END $$")
    assert isinstance(caught.value.__cause__, psycopg.Error)
    assert caught.value.__cause__.sqlstate == sqlstate


async def test_a_write_on_a_read_only_server_is_unavailable_and_its_connection_replaced(
        db_url: str) -> None:
    """A session opened while the database refused writes keeps refusing them after it
    accepts them again (``default_transaction_read_only`` is read when the session
    starts): the pool must not lend it again. The failing write is ``DatabaseUnavailable``
    (before: a plain ``DatabaseError``, and the same read-only backend lent again)."""
    async with open_pool(db_url, min_size=1, max_size=1) as pool:
        async with connection(pool) as conn:
            first = await (await conn.execute("SELECT pg_backend_pid() AS p")).fetchone()
            await conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(DatabaseUnavailable) as caught:
            async with connection(pool) as conn:
                await create_job(conn, credits=1)
        assert isinstance(caught.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
        async with connection(pool) as conn:
            now = await (await conn.execute(
                "SELECT pg_backend_pid() AS p, current_setting('default_transaction_read_only')"
                " AS ro")).fetchone()
            await create_job(conn, credits=1)  # writes again
    assert first is not None
    assert now is not None
    assert (now["p"] != first["p"], now["ro"]) == (True, "off")


DEAD = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1


async def test_connecting_to_a_dead_server_is_unavailable() -> None:
    with pytest.raises(DatabaseUnavailable) as caught:
        await connect(DEAD)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


@pytest.mark.parametrize(("argv", "code"), [
    (["migrate"], 2), (["status"], 2), (["stats"], 2), (["verify"], 2), (["jobs"], 2),
    (["audit", "abcd"], 2), (["reconcile", "--once", "--json"], 1),
])
def test_every_command_says_the_database_is_unavailable_and_exits_non_zero(
        argv: list[str], code: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A dead DATABASE_URL: one clear line (no traceback), a non-zero exit; ``reconcile
    --once`` reports the failed pass (exit 1) once the outage outlasts its limit."""
    monkeypatch.setenv("DATABASE_URL", DEAD)
    monkeypatch.setenv("CALLWARDEN_DB_OUTAGE_LIMIT_S", "1")
    monkeypatch.setenv("CALLWARDEN_MEDIA_DIR", str(tmp_path / "media"))
    assert main(argv) == code
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert "database unavailable" in (out.err + out.out).lower()


async def test_a_serialization_failure_in_the_callers_transaction_is_a_write_conflict(
        conn: Conn, db_url: str) -> None:
    """Inside a transaction a 40001 rolls the caller's work back: ``WriteConflict`` (the
    finalizer's cue to read again and retry), not a plain ``DatabaseError``."""
    job = await create_job(conn, credits=1)
    await conn.execute("UPDATE jobs SET reconcile_owner = 'r1' WHERE id = %s", (job,))
    async def lose_the_race(other: Conn) -> None:
        async with transaction(conn):
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            await execute(conn, "load_projection", {"job_id": job})  # the snapshot
            await other.execute("UPDATE jobs SET reconcile_lease_until = now() "
                                "WHERE id = %s", (job,))
            await execute(conn, "reconcile_release", {"job_id": job, "owner": "r1"})

    async with await connect(db_url) as other:
        with pytest.raises(WriteConflict):
            await lose_the_race(other)


async def test_an_unknown_pooler_mode_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLWARDEN_DB_POOLER", "statement-ish")
    with pytest.raises(ConfigError, match="CALLWARDEN_DB_POOLER"):
        await connect(DEAD)
