"""Apply ``migrations/NNNN_name.sql`` in order, each once, under an advisory lock.

Forward-only. Applied versions are recorded in ``callwarden_migrations``; two migrators
on one database serialise on ``pg_advisory_lock`` so they cannot interleave. Every file
is itself idempotent (``IF NOT EXISTS``), so the baseline is a no-op on a real host.

A file is sent whole, as one query string. On a database with the ``citus`` extension it
is sent one statement at a time instead (in the same one transaction): Citus propagates
some DDL on a distributed table (``CREATE INDEX``) to the workers with the text of the
whole query string, and a worker refuses a string of several commands ("cannot insert
multiple commands into a prepared statement").
"""

from __future__ import annotations

import re
from importlib import resources

import msgspec

from callwarden.database.boundary import translated
from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.errors import DatabaseError, DatabaseUnavailable, MigrationError

__all__ = ["LOCK_KEY", "Migration", "applied_versions", "available", "migrate", "pending",
           "statements"]

LOCK_KEY = 0x63616C6C  # "call"
_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")
# What a ';' inside of does not end a statement: comments, strings (E'' with backslash
# escapes; '' and "" are read as two adjacent strings, which splits the same), quoted
# identifiers and dollar-quoted bodies. Block comments are taken as not nested.
_LEXEME = re.compile(
    r"--[^\n]*|/\*.*?\*/|(?<![\w$])[Ee]'(?:[^'\\]|\\.)*'|'[^']*'|\"[^\"]*\""
    r"|(?<![\w$])\$(?P<tag>(?:[A-Za-z_]\w*)?)\$.*?\$(?P=tag)\$|;",
    re.DOTALL)
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)



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


def statements(sql: str) -> list[str]:
    """``sql`` split at each ``;`` that ends a statement; pieces that hold only comments
    and blanks are left out."""
    pieces, start = [], 0
    for m in _LEXEME.finditer(sql):
        if m[0] == ";":
            pieces.append(sql[start:m.start()])
            start = m.end()
    pieces.append(sql[start:])
    return [p.strip() for p in pieces if _COMMENT.sub("", p).strip()]


async def _apply(conn: Conn, mig: Migration) -> None:
    async with conn.transaction():
        if (await execute(conn, "migrations_on_citus", {}))[0]["ok"]:
            for statement in statements(mig.sql):
                await conn.execute(statement.encode())
        else:
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
