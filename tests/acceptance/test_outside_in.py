"""Issue 11 checked from outside: a fresh database set up by ``callwarden migrate``, every
row written with plain SQL the way a host's own code writes them (seed columns, statuses,
settlements, even a worker's events), and ``callwarden reconcile --once --config FILE``
as a real process against the provider simulator. Every pass exits 0; afterwards each row
is what the issue says it must be."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from callwarden.database.db import Conn, connect
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.replay.verify import verify_job
from tests.support.processes import cli, environment, host_job, seed_call

CONFIG = """
[reconcile]
scan_interval_s = 1
legacy_cutoff = "{cutoff}"
"""


async def kie_task(http: aiohttp.ClientSession, sim: RunningSimulator,
                   **script: Any) -> str:
    async with http.post(sim.url("kie", "/api/v1/jobs/createTask"), json={
            "model": "nano-banana-pro",
            "input": {"prompt": "x", "_sim": {"steps": [], "end": "succeeded", **script}}},
            headers={"Authorization": f"Bearer {sim.sim.api_key}"}) as resp:
        return str((await resp.json())["data"]["taskId"])


async def worker_events(conn: Conn, job: uuid.UUID, task: str) -> None:
    """A callwarden worker's CallStarted + TaskCreated, as rows (then it died)."""
    events: list[dict[str, Any]] = [
              {"type": "CallStarted", "at": "2026-01-01T00:00:00Z", "actor": "worker:x",
               "kind": "kie-standard", "sync": False},
              {"type": "TaskCreated", "at": "2026-01-01T00:00:01Z", "actor": "worker:x",
               "task_id": task}]
    for seq, event in enumerate(events, start=1):
        await conn.execute(
            "INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor) "
            "VALUES (%s, %s, %s, 1, %s::jsonb, 'worker:x')",
            (job, seq, event["type"], msgspec.json.encode(event).decode()))
    await conn.execute(
        "UPDATE jobs SET call_state = 'polling', call_version = 2, provider_kind = "
        "'kie-standard', provider_task_id = %s, provider_call_started_at = "
        "'2026-01-01T00:00:00Z' WHERE id = %s", (task, job))


async def state(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.status, j.call_state, j.output_data, u.status AS credits, u.credits_charged "
        "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s", (job,))).fetchone()
    assert row is not None
    return dict(row)


async def test_hostile_host_rows_are_recovered_by_the_reconciler_cli(
        empty_db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    env = environment(empty_db_url, sim, tmp_path / "media")
    code, _, err = await cli(["migrate"], env)
    assert code == 0, err
    async with await connect(empty_db_url) as conn, aiohttp.ClientSession() as http:
        cutoff = (await (await conn.execute(
            "SELECT now() - interval '3 hours' AS t")).fetchone() or {})["t"]
        host_media = msgspec.json.encode({"media": ["https://cdn/x.png"], "k": 1}).decode()
        jobs = {
            "host_json": await seed_call(conn, "kie-standard", await kie_task(http, sim),
                                         output_data=host_media),
            "host_done": await seed_call(conn, "kie-standard", await kie_task(http, sim),
                                         status="completed"),
            "wrapper": await host_job(conn, age="2 hours", job_type="pipeline"),
            "legacy": await host_job(conn, age="4 hours"),
            "foreign": await seed_call(conn, "kie-standard", await kie_task(
                http, sim, result_urls=["http://169.254.169.254/latest/meta-data/"])),
            "sync_route": await seed_call(conn, "anthropic-sync", None, age="6 minutes",
                                          status="pending"),
            "garbage": await host_job(conn),
            "corrupt": await host_job(conn),
        }
        await conn.execute("UPDATE usage_logs SET status = 'committed', credits_charged = 4 "
                           "WHERE job_id = %s", (jobs["host_done"],))
        await worker_events(conn, jobs["garbage"], await kie_task(http, sim))
        await conn.execute("UPDATE jobs SET upstream_result = '\"host garbage\"'::jsonb "
                           "WHERE id = %s", (jobs["garbage"],))
        await worker_events(conn, jobs["corrupt"], "t-corrupt")
        await conn.execute("UPDATE callwarden.call_events SET payload = '{\"oops\": 1}' "
                           "WHERE job_id = %s AND seq = 2", (jobs["corrupt"],))
        await conn.execute("UPDATE jobs SET upstream_result = '[0]'::jsonb WHERE id = %s",
                           (jobs["corrupt"],))
        config = tmp_path / "reconcile.toml"
        config.write_text(CONFIG.format(cutoff=cutoff.isoformat()))
        passes = []
        for _ in range(2):
            code, out, err = await cli(["reconcile", "--once", "--json", "--config",
                                        str(config)], env)
            assert code == 0, err
            passes.append(json.loads(out))
        assert passes[0]["unreadable"] == 1
        assert passes[0]["pass_failed"] is False
        s = {name: await state(conn, job) for name, job in jobs.items()}
        assert (s["host_json"]["status"], s["host_json"]["credits"]) == (
            "completed", "committed")
        assert s["host_json"]["output_data"]["k"] == 1  # the host's own key survived
        # a job the host ran and ended itself: recorded (HostEnded), its commit untouched
        assert (s["host_done"]["status"], s["host_done"]["credits"],
                s["host_done"]["credits_charged"], s["host_done"]["call_state"]) == (
            "completed", "committed", 4, "completed")
        assert (s["wrapper"]["call_state"], s["wrapper"]["credits"]) == (None, "reserved")
        assert (s["legacy"]["status"], s["legacy"]["credits"]) == ("failed", "refunded")
        assert (s["foreign"]["status"], s["foreign"]["credits"]) == ("failed", "refunded")
        assert (s["sync_route"]["status"], s["sync_route"]["credits"]) == (
            "failed", "refunded")
        assert (s["garbage"]["status"], s["garbage"]["credits"]) == ("completed", "committed")
        assert (s["corrupt"]["call_state"], s["corrupt"]["credits"]) == ("polling", "reserved")
        for name in ("host_json", "host_done", "legacy", "foreign", "sync_route", "garbage"):
            assert await verify_job(conn, jobs[name]) == [], name
