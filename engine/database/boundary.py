"""The one error boundary: where driver errors become engine errors.

Every exception psycopg or its pool raises is translated by :func:`translate` (by class,
SQLSTATE and constraint name; by message text only where libpq gives no SQLSTATE: a
connection the server refused at its start, see :func:`refused_for_good`) before it
leaves ``engine/database``;
nothing outside this package catches a driver error (``tests/unit/test_architecture.py``
checks). The tree it translates into is drawn in :mod:`callwarden.errors`.

What is ``DatabaseUnavailable`` (the actors ride it through as an outage; a queue keeps
the job): a connection that cannot be made or was lost (psycopg's ``OperationalError`` and
``InterfaceError``, the pool's timeout among them), every SQLSTATE of class 08 (connection
exception), 57P01/57P02/57P03 (the server shutting down or crashed, or not yet accepting
connections) and 25006 (``read_only_sql_transaction``: a server that refuses writes, as a
standby or a primary being demoted does at a failover). A pooled connection that met 25006
is closed rather than put back (:func:`connection`), so the pool replaces it with one made
to wherever the URL now leads: a session opened while the database was read-only may stay
so (``default_transaction_read_only`` is read when it starts).

The ways through it: :func:`callwarden.database.db.connect` and :func:`connection` (a
connection; a pool timeout or a dropped connection comes out as ``DatabaseUnavailable``),
:func:`transaction`, :func:`translated` (around raw statements inside the store), and
``callwarden.database.write.execute`` / ``execute_batch`` / ``execute_script`` (named queries).
"""

from __future__ import annotations

import re
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

__all__ = ["connection", "is_lost_append_race", "is_read_only", "refused_for_good",
           "transaction", "translate", "translated"]

# SQLSTATEs after which the statement did nothing and may be decided again.
_RETRYABLE = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
# SQLSTATEs that say the database is not there for us right now (an outage, not a bug).
_READ_ONLY = "25006"  # read_only_sql_transaction: a standby, a primary being demoted
_UNAVAILABLE = frozenset({
    _READ_ONLY,
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, shutting down, in recovery)
})
_UNAVAILABLE_CLASS = "08"  # connection_exception and all of its subclasses
# The constraints whose violation means something to the engine.
_TASK_CLAIMED = "jobs_provider_task_idx"  # another job holds this (kind, task id)
_EVENT_SEQ = "call_events_pkey"  # someone appended this seq first


def _constraint(exc: psycopg.Error) -> str | None:
    diag = getattr(exc, "diag", None)
    return diag.constraint_name if diag is not None else None


def _violates(exc: BaseException, name: str) -> bool:
    """``exc`` is a unique violation of constraint ``name``. On Citus the error comes from
    a shard, whose constraint is ``<name>_<shard id>``, and the coordinator passes it on
    with no constraint name, only in the message: both are read."""
    if not isinstance(exc, psycopg.errors.UniqueViolation):
        return False
    found = _constraint(exc)
    if not found:
        quoted = re.search(r'unique constraint "([^"]+)"', str(exc))
        found = quoted.group(1) if quoted else None
    return found is not None and re.fullmatch(rf"{re.escape(name)}(?:_\d+)?", found) is not None


_NO_PRIVILEGE = "42501"  # insufficient_privilege


#: What the server answers at a connection's start when it will never accept this URL
#: as it is (libpq reports a refused connection with no SQLSTATE, only its message: 28P01
#: invalid_password, 28000 no pg_hba.conf entry or a role that may not log in, 3D000 an
#: unknown database, 42501 no CONNECT privilege). A server starting up, shutting down or
#: full (57P03, 53300) is not among them: that is an outage, ridden through.
_REFUSED = re.compile(r'password authentication failed|authentication failed for user|'
                      r'no pg_hba\.conf entry|role ".*" (?:does not exist|is not permitted '
                      r'to log in)|database ".*" does not exist|permission denied for database')
_FATAL = re.compile(r"FATAL: +(.*)")


def refused_for_good(exc: BaseException) -> str | None:
    """The server's reason when ``exc`` is a connection it refused for good (a wrong
    password, an unknown role or database, no ``pg_hba.conf`` entry); ``None`` for
    anything else (a server that is down is an outage: the actors wait it out)."""
    if not isinstance(exc, psycopg.OperationalError):
        return None
    for reason in _FATAL.findall(str(exc)):
        if _REFUSED.search(reason):
            return str(reason).strip()
    return None


def _unavailable(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or ""
    return (state in _UNAVAILABLE or state.startswith(_UNAVAILABLE_CLASS)
            or isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError))


def translate(exc: psycopg.Error) -> DatabaseError | TaskAlreadyClaimed:
    """The engine error for a driver error (``PoolTimeout`` is an ``OperationalError``:
    the database is unavailable to us; so is a read-only server, see the module)."""
    if exc.sqlstate in _RETRYABLE:
        return WriteConflict(str(exc))
    if _unavailable(exc):
        return DatabaseUnavailable(f"database unavailable: {exc}")
    if _violates(exc, _TASK_CLAIMED):
        return TaskAlreadyClaimed(f"upstream task already claimed by another job: {exc}")
    if exc.sqlstate == _NO_PRIVILEGE and "callwarden" in str(exc):
        return DatabaseError(f"database error: {exc} (this role is not callwarden's runtime: "
                             "the owner grants it with `callwarden grant ROLE`; "
                             "docs/security.md)")
    return DatabaseError(f"database error: {exc}")


def is_lost_append_race(exc: BaseException) -> bool:
    """The event's ``seq`` was taken by a concurrent append (not an error: a lost race)."""
    return _violates(exc, _EVENT_SEQ)


def is_read_only(exc: BaseException) -> bool:
    """``exc``, or an error it was raised from, is the server refusing writes (25006)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, psycopg.Error) and cause.sqlstate == _READ_ONLY:
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


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
    the pool's own timeout among them, come out translated. A connection on which the
    server refused a write as read-only is closed, not put back: the pool makes a new one."""
    with translated():
        async with pool.connection(timeout=wait_s) as conn:
            try:
                yield conn
            except BaseException as exc:
                if is_read_only(exc):
                    await conn.close()
                raise


@asynccontextmanager
async def transaction(conn: Conn) -> AsyncIterator[Conn]:
    """A transaction on ``conn`` (its commit's errors translated too)."""
    with translated():
        async with conn.transaction():
            yield conn
