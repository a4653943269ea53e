"""The pricing hook from outside (issue 12 item 3): a real ``callwarden worker`` given a
price list in ``CALLWARDEN_PRICING_FILE`` commits what the list charges for the call and
releases the rest of the reservation, in ``usage_logs`` as the host reads it; a price
list that cannot be read stops the worker at start (exit 2) before it claims anything,
so no event is written and no credit moves."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.queue.claims import input_data
from callwarden.replay.verify import verify_job
from tests.acceptance.conftest import Workers

SCRIPT = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded"}
REQUEST = {"model": "nano-banana-pro", "input": {"prompt": "a cat", "_sim": SCRIPT}}
PRICES = """
[[rates]]
kind = "kie-standard"
unit = "call"
credits = 3.5
"""
ARGS = ["--concurrency", "1", "--poll-empty", "0.05", "--poll-interval", "0.05",
        "--grace", "5"]


async def _row(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.call_state, j.queue_acked_at IS NOT NULL AS acked, u.status, "
        "u.credits_reserved::float8 AS reserved, u.credits_charged::float8 AS charged, "
        "(SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id) AS events "
        "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s",
        (job,))).fetchone()
    assert row is not None
    return dict(row)


async def test_a_worker_charges_what_the_price_list_says(
        conn: Conn, workers: Workers, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES, encoding="utf-8")
    job = await create_job(conn, credits=10, input_data=input_data("kie-standard", REQUEST))
    worker = await workers.start([*ARGS, "--media-dir", str(tmp_path / "media")],
                                 env={"CALLWARDEN_PRICING_FILE": str(prices)})
    deadline = time.monotonic() + 30
    while not (await _row(conn, job))["acked"]:
        assert time.monotonic() < deadline, worker.logs()
        await asyncio.sleep(0.05)  # polling the database for the outcome
    assert await worker.terminate() == 0, worker.logs()
    row = await _row(conn, job)
    assert (row["call_state"], row["status"], row["reserved"], row["charged"]) == (
        "completed", "committed", 10.0, 3.5)
    assert await verify_job(conn, job) == []


async def test_an_unreadable_price_list_stops_the_worker_before_it_claims(
        conn: Conn, workers: Workers, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text('[[rates]]\nkind = "kie-nonesuch"\nunit = "call"\ncredits = 1\n',
                      encoding="utf-8")
    job = await create_job(conn, credits=10, input_data=input_data("kie-standard", REQUEST))
    worker = await workers.start([*ARGS, "--media-dir", str(tmp_path / "media")],
                                 env={"CALLWARDEN_PRICING_FILE": str(prices)})
    assert await worker.exited(30) == 2
    assert "kie-nonesuch" in worker.logs()
    row = await _row(conn, job)
    assert (row["call_state"], row["status"], row["events"], row["acked"]) == (
        None, "reserved", 0, False)
