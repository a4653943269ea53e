"""Apply ``migrations/NNNN_name.sql`` in order, each once, under an advisory lock.

Forward-only. Applied versions are recorded in ``callwarden_migrations``; two migrators
on one database serialise on ``pg_advisory_lock`` so they cannot interleave. Every file
is itself idempotent (``IF NOT EXISTS``), so the baseline is a no-op on a real host.
"""

from __future__ import annotations

import re
from importlib import resources

import msgspec

from callwarden.database.boundary import translated
from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.errors import DatabaseError, DatabaseUnavailable, MigrationError

__all__ = ["LOCK_KEY", "Migration", "applied_versions", "available", "migrate", "pending"]

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
        await conn.execute(mig.sql.encode())
        await execute(conn, "migrations_record", {"version": mig.version, "name": mig.name})


async def migrate(conn: Conn) -> list[Migration]:
    """Apply the pending migrations; return those applied (empty when up to date)."""
    try:
        with translated():
            await execute(conn, "migrations_lock", {"key": LOCK_KEY})
            try:
                await execute(conn, "migrations_create_table", {})
                todo = await pending(conn)
                for mig in todo:
                    await _apply(conn, mig)
                return todo
            finally:
                await execute(conn, "migrations_unlock", {"key": LOCK_KEY})
    except DatabaseUnavailable as exc:
        raise DatabaseUnavailable(f"database unavailable while migrating: {exc}") from exc
    except DatabaseError as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
