"""Apply ``migrations/NNNN_name.sql`` in order, each once, under an advisory lock.

Forward-only. Applied versions are recorded in ``callwarden_migrations``; two migrators
on one database serialise on ``pg_advisory_lock`` so they cannot interleave. Every file
is itself idempotent (``IF NOT EXISTS``), so the baseline is a no-op on a real host.

A file is sent whole, as one query string. On a database with the ``citus`` extension it
is sent one statement at a time instead (in the same one transaction): Citus propagates
some DDL on a distributed table (``CREATE INDEX``) to the workers with the text of the
whole query string, and a worker refuses a string of several commands ("cannot insert
multiple commands into a prepared statement").

A database moved to Citus after it was migrated is distributed by the next ``migrate``
(0010 and 0012 again, see :func:`_distribute_late`; docs/scaling.md, "Moving to Citus").

Since 0011 callwarden's objects, the bookkeeping table included, live in the schema
``callwarden``. Migrations are immutable, and 0001..0010 name theirs unqualified, so
``migrate`` runs with ``callwarden`` appended to the connection's ``search_path`` (and puts
it back): a fresh database and one an earlier release migrated take the same path (0001..0010
make their objects where they always did, 0011 moves them), and the bookkeeping queries find
the table before and after the move. Outside ``migrate`` :func:`applied_versions` reads it
wherever it is (``migrations_place``), so ``status``, ``check`` and ``/readyz`` work on a
database not yet moved.
"""

from __future__ import annotations

import re
from importlib import resources

import msgspec

from callwarden.database.boundary import translated
from callwarden.database.citus import forget, on_citus
from callwarden.database.db import Conn
from callwarden.database.scripts import statements
from callwarden.database.write import execute
from callwarden.errors import DatabaseError, DatabaseUnavailable, MigrationError

__all__ = ["LOCK_KEY", "Migration", "applied_versions", "available", "migrate", "pending",
           "statements"]

LOCK_KEY = 0x63616C6C  # "call"
_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")
class Migration(msgspec.Struct, frozen=True):
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped in the ``migrations`` package, in version order."""
    found = []
    for entry in resources.files("callwarden.migrations").iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m[1]), m[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


async def _place(conn: Conn) -> str | None:
    place = (await execute(conn, "migrations_place", {}))[0]["place"]
    return None if place is None else str(place)


async def applied_versions(conn: Conn) -> set[int]:
    """The versions applied, read from callwarden's schema or, on a database an earlier
    release migrated and this one has not yet, from where that release kept them."""
    place = await _place(conn)
    if place is None:
        return set()
    query = "migrations_applied" if place == "own" else "migrations_applied_legacy"
    return {r["version"] for r in await execute(conn, query, {})}


async def pending(conn: Conn) -> list[Migration]:
    done = await applied_versions(conn)
    return [m for m in available() if m.version not in done]


async def _apply(conn: Conn, mig: Migration) -> None:
    async with conn.transaction():
        if await on_citus(conn):
            for statement in statements(mig.sql):
                await conn.execute(statement.encode())
        else:
            await conn.execute(mig.sql.encode())
        await execute(conn, "migrations_record", {"version": mig.version, "name": mig.name})


async def _distribute_late(conn: Conn, path: str) -> None:
    """A database migrated before it had the ``citus`` extension (0010 and 0012 were then
    no-ops) and moved to Citus since: they run again (each leaves distributed tables as
    they are), in one transaction, with ``callwarden`` first in the search path (where
    0011 moved what 0010 names, and where it makes ``callwarden_tasks``), after 0011's
    guard triggers are dropped (Citus refuses a table with triggers). Nothing new is
    recorded: the migrations keep their identity."""
    if not await on_citus(conn):
        return
    if (await execute(conn, "migrations_citus_done", {}))[0]["ok"]:
        return
    again = [m for m in available() if m.name.endswith("citus")]
    async with conn.transaction():
        await execute(conn, "migrations_set_search_path", {"path": _with_own(path, first=True)})
        for name in ("migrations_drop_guards", "migrations_drop_guards_insert",
                     "migrations_drop_guards_settlement",
                     "migrations_drop_guards_settlement_insert"):
            await execute(conn, name, {})
        for mig in again:
            for statement in statements(mig.sql):
                await conn.execute(statement.encode())
    await execute(conn, "migrations_set_search_path", {"path": _with_own(path)})


def _with_own(path: str, *, first: bool = False) -> str:
    """``path`` with the schema ``callwarden`` last (or first)."""
    if not path.strip():
        return "callwarden"
    return f"callwarden, {path}" if first else f"{path}, callwarden"


async def migrate(conn: Conn, *, upto: int | None = None) -> list[Migration]:
    """Apply the pending migrations (those up to version ``upto`` only, when given: a
    database as an earlier release left it, for upgrade tests and benchmarks); return those
    applied (empty when up to date)."""
    try:
        with translated():
            await execute(conn, "migrations_lock", {"key": LOCK_KEY})
            forget(conn)  # (asked again, and remembered from here: a move to Citus is seen)
            path = str((await execute(conn, "migrations_search_path", {}))[0]["path"])
            try:
                await execute(conn, "migrations_set_search_path", {"path": _with_own(path)})
                if await _place(conn) is None:
                    await execute(conn, "migrations_create_table", {})
                done = {r["version"]
                        for r in await execute(conn, "migrations_applied_legacy", {})}
                todo = [m for m in available()
                        if m.version not in done and (upto is None or m.version <= upto)]
                for mig in todo:
                    await _apply(conn, mig)
                await _distribute_late(conn, path)
                await execute(conn, "migrations_regrant", {})
                return todo
            finally:
                await execute(conn, "migrations_set_search_path", {"path": path})
                await execute(conn, "migrations_unlock", {"key": LOCK_KEY})
    except DatabaseUnavailable as exc:
        raise DatabaseUnavailable(f"database unavailable while migrating: {exc}") from exc
    except DatabaseError as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
