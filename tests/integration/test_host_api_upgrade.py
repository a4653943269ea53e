"""Calls a host started through the host API of an earlier release (migrations up to 0016,
its column writes by hand) finish through this release's (0017: the same signatures,
writing through the rendered apply_event/write_events/settle), each settled once, every
row the fold of its log (issue 38: upgrades stay safe; docs/schema.md)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from callwarden.database.db import Conn, connect
from callwarden.database.migrate import applied_versions, available, migrate
from callwarden.replay.verify import verify_job

MEDIA = '[{"key": "k/0", "url": "/m/k/0", "content_type": "image/png", "size": 3}]'


async def _one(conn: Conn, sql: str, *args: Any) -> dict[str, Any]:
    row = await (await conn.execute(sql.encode(), args)).fetchone()
    assert row is not None
    return dict(row)


async def _job(conn: Conn) -> uuid.UUID:
    return uuid.UUID(str((await _one(conn, "SELECT callwarden.create_job('u1', 10) AS id"))
                         ["id"]))


async def _start(conn: Conn, job: uuid.UUID, task: bool) -> None:
    await conn.execute("SELECT * FROM callwarden.start_call(%s, 'kie-standard', 'node:old')",
                       (job,))
    if task:
        await conn.execute("SELECT * FROM callwarden.task_created(%s, %s, 'node:old')",
                           (job, f"t-{job}"))


async def test_calls_in_flight_under_0016_finish_under_0017(empty_db_url: str) -> None:
    async with await connect(empty_db_url) as conn:
        await migrate(conn, upto=16)
        assert max(await applied_versions(conn)) == 16
        created, polling, failing, ended, repeated = [await _job(conn) for _ in range(5)]
        await _start(conn, created, task=False)
        for job in (polling, failing, ended, repeated):
            await _start(conn, job, task=True)
        # the host ends one in its own SQL; another's outcome is recorded, its reply lost
        await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (ended,))
        first = await _one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:old', "
                                 "%s::jsonb, NULL, 4)", repeated, MEDIA)

        applied = await migrate(conn)
        assert [m.version for m in applied] == [m.version for m in available()
                                                if m.version > 16]

        await conn.execute("SELECT * FROM callwarden.task_created(%s, %s, 'node:new')",
                           (created, f"t-{created}"))
        outcomes = {
            created: await _one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:new', "
                                      "%s::jsonb, 'hi', 2.5)", created, MEDIA),
            polling: await _one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:new')",
                                polling),
            failing: await _one(conn, "SELECT * FROM callwarden.failed(%s, 'node:new', "
                                      "'boom')", failing),
            repeated: await _one(conn, "SELECT * FROM callwarden.succeeded(%s, 'node:old', "
                                       "%s::jsonb, NULL, 4)", repeated, MEDIA),
        }
        again = await _one(conn, "SELECT * FROM callwarden.start_call(%s, 'kie-standard', "
                                 "'node:new')", ended)
        assert again["action"] == "done"
        assert {j: (o["ok"], o["state"], o["settlement"]) for j, o in outcomes.items()} == {
            created: (True, "completed", "settled"), polling: (True, "completed", "settled"),
            failing: (True, "failed", "settled"),
            repeated: (True, "completed", first["settlement"])}

        expected = {created: ("committed", Decimal("2.5")),
                    polling: ("committed", Decimal(10)), failing: ("refunded", Decimal(0)),
                    ended: ("refunded", Decimal(0)), repeated: ("committed", Decimal(4))}
        for job, (status, charged) in expected.items():
            cur = await conn.execute(
                "SELECT status, credits_charged FROM usage_logs WHERE job_id = %s", (job,))
            assert [(r["status"], r["credits_charged"]) for r in await cur.fetchall()] == [
                (status, charged)], job
            completions = await _one(conn, "SELECT count(*) AS n FROM callwarden.call_events "
                                           "WHERE job_id = %s AND type = 'Completed'", job)
            assert completions["n"] == (1 if status == "committed" else 0), job
            assert await verify_job(conn, job) == [], job
