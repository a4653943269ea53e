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
(0010 again, see :func:`_distribute_late`; docs/scaling.md, "Moving to Citus").
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


async def applied_versions(conn: Conn) -> set[int]:
    if not (await execute(conn, "migrations_table_exists", {}))[0]["ok"]:
        return set()
    return {r["version"] for r in await execute(conn, "migrations_applied", {})}


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


async def _distribute_late(conn: Conn) -> None:
    """A database migrated before it had the ``citus`` extension (0010 was then a no-op)
    and moved to Citus since: 0010 runs again (it leaves distributed tables as they are),
    in one transaction, and nothing new is recorded: the migration keeps its identity."""
    if not await on_citus(conn):
        return
    if (await execute(conn, "migrations_citus_done", {}))[0]["ok"]:
        return
    (citus,) = [m for m in available() if m.name == "citus"]
    async with conn.transaction():
        for statement in statements(citus.sql):
            await conn.execute(statement.encode())


async def migrate(conn: Conn) -> list[Migration]:
    """Apply the pending migrations; return those applied (empty when up to date)."""
    try:
        with translated():
            await execute(conn, "migrations_lock", {"key": LOCK_KEY})
            forget(conn)  # (asked again, and remembered from here: a move to Citus is seen)
            try:
                await execute(conn, "migrations_create_table", {})
                todo = await pending(conn)
                for mig in todo:
                    await _apply(conn, mig)
                await _distribute_late(conn)
                return todo
            finally:
                await execute(conn, "migrations_unlock", {"key": LOCK_KEY})
    except DatabaseUnavailable as exc:
        raise DatabaseUnavailable(f"database unavailable while migrating: {exc}") from exc
    except DatabaseError as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
