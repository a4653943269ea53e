"""Which form of a statement a database runs: a Citus coordinator (the ``citus`` extension
in the database) plans no ``FOR UPDATE`` across shards, so the two claims have a second
form there (``*_citus`` in the SQL files: candidates read without a lock, then an
``UPDATE`` that re-checks them on the row it locks; the reconciler's one candidate at a
time, engine/database/postgres.py). Plain Postgres keeps the
``FOR UPDATE SKIP LOCKED`` form. And the one upstream task, one job rule, which plain
Postgres keeps with a unique index on ``jobs``, is kept there by ``callwarden_tasks``
(distributed by the task id, migration 0010), written in the transaction that appends the
event naming the task (:func:`callwarden.database.write.append`).

Whether a database is on Citus is asked once per server and database in a process
(``migrations_on_citus``), then remembered: a database moved to Citus is seen by processes
started after the move, and by the process that ran ``migrate``, as every other schema
change is (stop the workers and the reconciler, run ``callwarden migrate``, start them: a
process that asked before the move would go on with the plain forms, and 0010 drops the
unique index they rely on for one task, one job)."""

from __future__ import annotations

import weakref

from callwarden.database.boundary import translated
from callwarden.database.db import Conn
from callwarden.database.queries import QUERIES

__all__ = ["forget", "on_citus", "statement_for"]

_SEEN: dict[tuple[str, int, str], bool] = {}
#: Each connection's server and database, read from libpq once (every append asks).
_KEYS: weakref.WeakKeyDictionary[Conn, tuple[str, int, str]] = weakref.WeakKeyDictionary()


def _key(conn: Conn) -> tuple[str, int, str]:
    key = _KEYS.get(conn)
    if key is None:
        key = _KEYS[conn] = (conn.info.host, conn.info.port, conn.info.dbname)
    return key


async def on_citus(conn: Conn) -> bool:
    """Whether ``conn``'s database has the ``citus`` extension (asked once, remembered)."""
    key = _key(conn)
    found = _SEEN.get(key)
    if found is None:
        with translated():
            row = await (await conn.execute(QUERIES["migrations_on_citus"])).fetchone()
        found = bool(row is not None and row["ok"])
        _SEEN[key] = found
    return found


def forget(conn: Conn) -> None:
    """Ask again next time (``migrate`` calls it: it may have moved the database to
    Citus; processes that asked before must still be restarted)."""
    _SEEN.pop(_key(conn), None)


async def statement_for(conn: Conn, name: str) -> str:
    """``name``, or its Citus form on a Citus database."""
    return f"{name}_citus" if await on_citus(conn) else name
