"""Apply ``migrations/NNNN_name.sql`` in order, each once, under an advisory lock.

Forward-only. Applied versions are recorded in ``callwarden_migrations``; two migrators
on one database serialise on ``pg_advisory_lock`` so they cannot interleave. Every file
is itself idempotent (``IF NOT EXISTS``), so the baseline is a no-op on a real host.
"""

from __future__ import annotations

import re
from importlib import resources

import msgspec
import psycopg

from engine.errors import DatabaseUnavailable, MigrationError
from engine.store.write import Conn

__all__ = ["LOCK_KEY", "Migration", "applied_versions", "available", "migrate", "pending"]

LOCK_KEY = 0x63616C6C  # "call"
_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")

_CREATE = """
CREATE TABLE IF NOT EXISTS callwarden_migrations (
    version    int PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


class Migration(msgspec.Struct, frozen=True):
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped in the ``migrations`` package, in version order."""
    found = []
    for entry in resources.files("migrations").iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(int(m[1]), m[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


async def applied_versions(conn: Conn) -> set[int]:
    exists = await (await conn.execute(
        "SELECT to_regclass('callwarden_migrations') IS NOT NULL AS ok")).fetchone()
    if not exists or not exists["ok"]:
        return set()
    rows = await (await conn.execute("SELECT version FROM callwarden_migrations")).fetchall()
    return {r["version"] for r in rows}


async def pending(conn: Conn) -> list[Migration]:
    done = await applied_versions(conn)
    return [m for m in available() if m.version not in done]


async def _apply(conn: Conn, mig: Migration) -> None:
    async with conn.transaction():
        await conn.execute(mig.sql.encode())
        await conn.execute(
            "INSERT INTO callwarden_migrations (version, name) VALUES (%s, %s)",
            (mig.version, mig.name))


async def migrate(conn: Conn) -> list[Migration]:
    """Apply the pending migrations; return those applied (empty when up to date)."""
    try:
        await conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        try:
            await conn.execute(_CREATE)
            todo = await pending(conn)
            for mig in todo:
                await _apply(conn, mig)
            return todo
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database unavailable while migrating: {exc}") from exc
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
