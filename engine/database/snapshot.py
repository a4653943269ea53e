"""One consistent read: a ``REPEATABLE READ READ ONLY`` transaction, so a job's row, its
events and its reservations come from the same snapshot (plain reads: no writer waits)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from callwarden.database.boundary import transaction
from callwarden.database.db import Conn
from callwarden.database.write import execute

__all__ = ["snapshot"]


@asynccontextmanager
async def snapshot(conn: Conn) -> AsyncIterator[Conn]:
    """A REPEATABLE READ READ ONLY transaction on ``conn`` (an autocommit connection)."""
    async with transaction(conn):
        await execute(conn, "read_snapshot", {})
        yield conn
