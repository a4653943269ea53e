"""The one error boundary (engine/store/boundary.py), driven with a real server: a pool
that cannot lend a connection, a dropped connection, and a failing statement all
come out as the engine's types, the driver's error
kept as ``__cause__``, and nothing is written."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest

from engine.errors import DatabaseError, DatabaseUnavailable
from engine.store.boundary import connection, translated
from engine.store.db import Conn, Pool, connect, open_pool


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
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid["p"],))
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
