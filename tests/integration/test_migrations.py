"""Migrations own the schema: forward-only, idempotent, and what docs/schema.md says."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from callwarden.database.db import Conn, connect
from callwarden.database.migrate import available, migrate

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"
TABLES = ("jobs", "usage_logs", "workflow_executions", "assets", "call_events",
          "callwarden_migrations", "callback_tokens", "webhook_deliveries", "limits", "waiting")
SCHEMAS = ["public", "callwarden"]


async def snapshot(conn: Conn) -> list[str]:
    """A stable text form of the tables, columns, indexes and constraints we own (the
    host's in ``public``, callwarden's own in ``callwarden``: names carry their schema)."""
    cols = await (await conn.execute(
        "SELECT table_schema, table_name, column_name, data_type, is_nullable, "
        "column_default FROM information_schema.columns WHERE table_schema = ANY(%s) "
        "AND table_name = ANY(%s) ORDER BY table_schema DESC, table_name, column_name",
        (SCHEMAS, list(TABLES)))).fetchall()
    idx = await (await conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = ANY(%s) "
        "AND tablename = ANY(%s) ORDER BY schemaname DESC, indexname",
        (SCHEMAS, list(TABLES)))).fetchall()
    cons = await (await conn.execute(
        "SELECT conrelid::regclass::text AS t, conname, pg_get_constraintdef(oid) AS d "
        "FROM pg_constraint WHERE connamespace = ANY(%s::regnamespace[]) "
        "AND contype IN ('c', 'f') ORDER BY 1, 2", (SCHEMAS,))).fetchall()
    lines = [
        f"column {'' if r['table_schema'] == 'public' else r['table_schema'] + '.'}"
        f"{r['table_name']}.{r['column_name']} {r['data_type']}"
        f"{' NOT NULL' if r['is_nullable'] == 'NO' else ''}"
        f"{' DEFAULT ' + r['column_default'] if r['column_default'] else ''}"
        for r in cols]
    lines += [f"index {r['indexdef']}" for r in idx]
    lines += [f"constraint {r['t']}.{r['conname']} {r['d']}" for r in cons]
    return lines


def documented() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- schema-snapshot -->\n```text\n(.*?)```", text, re.S)
    assert block, "docs/schema.md has no schema-snapshot block"
    return block.group(1).strip().splitlines()


async def test_applying_all_migrations_twice_changes_nothing(empty_db_url: str) -> None:
    async with await connect(empty_db_url) as conn:
        first = await migrate(conn)
        assert [m.version for m in first] == [m.version for m in available()]
        before = await snapshot(conn)
        assert await migrate(conn) == []
        # Re-running a file by hand is a no-op too: each statement is idempotent. From
        # 0011 on: an earlier file re-run by hand after 0011 moved its objects into the
        # schema callwarden would make them again where it made them first.
        for m in available():
            if m.version >= 11:
                await conn.execute(m.sql.encode())
        assert await snapshot(conn) == before


async def test_migrated_schema_matches_the_documented_one(conn: Conn) -> None:
    assert await snapshot(conn) == documented()


async def test_two_migrators_serialise_on_the_advisory_lock(empty_db_url: str) -> None:
    async def run() -> list[int]:
        async with await connect(empty_db_url) as c:
            return [m.version for m in await migrate(c)]

    a, b = await asyncio.gather(run(), run())
    assert sorted([a, b], key=len) == [[], [m.version for m in available()]]


async def test_reconciler_scan_index_is_partial_on_open_calls(conn: Conn) -> None:
    row = await (await conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'jobs_open_calls_idx'")).fetchone()
    assert row is not None
    assert "WHERE (call_state = ANY" in row["indexdef"]
