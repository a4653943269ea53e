"""The one error boundary: where driver errors become engine errors.

Every exception psycopg or its pool raises is translated by :func:`translate` (by class,
SQLSTATE and constraint name, never by message text) before it leaves ``engine/database``;
nothing outside this package catches a driver error (``tests/unit/test_architecture.py``
checks). The tree it translates into is drawn in :mod:`callwarden.errors`.

The ways through it: :func:`callwarden.database.db.connect` and :func:`connection` (a
connection; a pool timeout or a dropped connection comes out as ``DatabaseUnavailable``),
:func:`transaction`, :func:`translated` (around raw statements inside the store), and
``callwarden.database.write.execute`` / ``execute_batch`` / ``execute_script`` (named queries).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg

from callwarden.database.db import Conn, Pool
from callwarden.errors import (
    DatabaseError,
    DatabaseUnavailable,
    TaskAlreadyClaimed,
    WriteConflict,
)

__all__ = ["connection", "is_lost_append_race", "transaction", "translate", "translated"]

# SQLSTATEs after which the statement did nothing and may be decided again.
_RETRYABLE = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
# The constraints whose violation means something to the engine.
_TASK_CLAIMED = "jobs_provider_task_idx"  # another job holds this (kind, task id)
_EVENT_SEQ = "call_events_pkey"  # someone appended this seq first


def _constraint(exc: psycopg.Error) -> str | None:
    diag = getattr(exc, "diag", None)
    return diag.constraint_name if diag is not None else None


def translate(exc: psycopg.Error) -> DatabaseError | TaskAlreadyClaimed:
    """The engine error for a driver error (``PoolTimeout`` is an ``OperationalError``:
    the database is unavailable to us)."""
    if exc.sqlstate in _RETRYABLE:
        return WriteConflict(str(exc))
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(f"database unavailable: {exc}")
    if isinstance(exc, psycopg.errors.UniqueViolation) and _constraint(exc) == _TASK_CLAIMED:
        return TaskAlreadyClaimed(f"upstream task already claimed by another job: {exc}")
    return DatabaseError(f"database error: {exc}")


def is_lost_append_race(exc: BaseException) -> bool:
    """The event's ``seq`` was taken by a concurrent append (not an error: a lost race)."""
    return isinstance(exc, psycopg.errors.UniqueViolation) and _constraint(exc) == _EVENT_SEQ


@contextmanager
def translated() -> Iterator[None]:
    """Driver errors raised inside the block come out translated (``__cause__`` kept)."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc


@asynccontextmanager
async def connection(pool: Pool, *, wait_s: float | None = None) -> AsyncIterator[Conn]:
    """A connection from ``pool`` (``wait_s``: how long to wait for one); driver errors,
    the pool's own timeout among them, come out translated."""
    with translated():
        async with pool.connection(timeout=wait_s) as conn:
            yield conn


@asynccontextmanager
async def transaction(conn: Conn) -> AsyncIterator[Conn]:
    """A transaction on ``conn`` (its commit's errors translated too)."""
    with translated():
        async with conn.transaction():
            yield conn
