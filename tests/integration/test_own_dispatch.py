"""``callwarden.queue.own.run_own``, what the Celery and arq own-call tasks run: the host's
body is run only when the call's action is the host's to do (create, resume), with the
heartbeat beating; every other action is handled without it, so a queue's redelivery never
runs the host's create twice. The body makes real requests to the simulator; rows are
read back by SQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden import OwnCall, OwnCalls
from callwarden.calls.config import CallConfig
from callwarden.calls.own_sync import SyncCall
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, cancel, load
from callwarden.events.types import CallStarted, TaskCreated, UpstreamResult, UpstreamSucceeded
from callwarden.providers.base import ProviderSettings
from callwarden.providers.errors import UnknownProviderKind
from callwarden.providers.outcomes import Running, Succeeded
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.own import run_own
from callwarden.replay.verify import verify_job
from tests.support.own_kie import KIE_REQ, kie_create, kie_poll

KIND = "kie-standard"






@pytest.fixture
def calls(pool: Pool, sim: RunningSimulator, tmp_path: Path) -> OwnCalls:
    return OwnCalls(pool, media=LocalFolderStore(tmp_path / "media"), settings=sim.settings,
                    config=CallConfig(heartbeat_every_s=0.05))


class Host:
    """The host's own KIE code, counting what it was asked to do."""

    def __init__(self, http: aiohttp.ClientSession, sim: RunningSimulator) -> None:
        self.http, self.sim = http, sim
        self.actions: list[str] = []

    async def create_only(self, call: OwnCall, request: dict[str, Any]) -> None:
        """Creates when told to, then stops (its process "died" before the poll)."""
        self.actions.append(call.action)
        if call.action == "create":
            await call.task_created(await kie_create(self.http, self.sim, request))

    async def run(self, call: OwnCall, request: dict[str, Any]) -> None:
        self.actions.append(call.action)
        if call.action == "create":
            await call.task_created(await kie_create(self.http, self.sim, request))
        data = await kie_poll(self.http, self.sim, str(call.task_id))
        assert data is not None
        await call.report(Succeeded(media_urls=tuple(
            json.loads(data["resultJson"])["resultUrls"])))


@pytest.fixture
async def host(sim: RunningSimulator) -> Any:
    async with aiohttp.ClientSession() as http:
        yield Host(http, sim)


async def _types(conn: Conn, job: uuid.UUID) -> list[str]:
    row = await (await conn.execute(
        "SELECT array_agg(type ORDER BY seq) AS t FROM callwarden.call_events WHERE job_id = %s",
        (job,))).fetchone()
    return list(row["t"] or []) if row else []


async def test_a_redelivery_resumes_the_task_the_first_delivery_created(
        conn: Conn, calls: OwnCalls, host: Host, sim: RunningSimulator) -> None:
    job = await create_job(conn, credits=5)
    first = await run_own(calls, job, KIND, host.create_only, [KIE_REQ])
    assert first.result == "left_for_reconciler"
    assert "left for the reconciler" in (first.detail or "")
    done = await run_own(calls, job, KIND, host.run, [KIE_REQ])  # the queue's redelivery
    assert done.result == "completed"
    assert host.actions == ["create", "resume"]
    assert sim.sim.journal.count("kie", "create") == 1
    again = await run_own(calls, job, KIND, host.run, [KIE_REQ])  # and once more
    assert (again.result, again.detail) == ("completed", "already terminal")
    assert host.actions == ["create", "resume"]  # the body did not run for a done call
    assert await verify_job(conn, job) == []


async def test_an_ambiguous_start_does_not_run_the_body(
        conn: Conn, calls: OwnCalls, host: Host, sim: RunningSimulator) -> None:
    """The first delivery died after CallStarted, before the create answered: its task
    may exist, so the body (which would create) is not run; the reconciler sweeps."""
    job = await create_job(conn)
    await calls.start(job, KIND)  # what the dead delivery recorded
    out = await run_own(calls, job, KIND, host.run, [KIE_REQ])
    assert out.result == "left_for_reconciler"
    assert "ambiguous" in (out.detail or "")
    assert host.actions == []
    assert sim.sim.journal.count("kie", "create") == 0


async def test_a_job_the_host_ended_is_not_started(conn: Conn, calls: OwnCalls,
                                                   host: Host) -> None:
    job = await create_job(conn)
    await conn.execute("UPDATE jobs SET status = 'failed' WHERE id = %s", (job,))
    out = await run_own(calls, job, KIND, host.run, [KIE_REQ])
    assert out.detail is not None
    assert out.detail.startswith("not started")
    assert host.actions == []
    assert await _types(conn, job) == []


async def test_a_recorded_success_is_finalized_without_the_body(
        conn: Conn, calls: OwnCalls, host: Host) -> None:
    """The delivery died between the success and its finalization (its events appended
    as the dead process wrote them): the next one finalizes it (commits) and never asks
    the host's code."""
    job = await create_job(conn, credits=3)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=utcnow(), actor="celery:dead", kind=KIND))).projection
    p = (await append(conn, job, p, TaskCreated(at=utcnow(), actor="celery:dead",
                                                task_id="t-1"))).projection
    await append(conn, job, p, UpstreamSucceeded(at=utcnow(), actor="celery:dead",
                                                 result=UpstreamResult(text="ok")))
    out = await run_own(calls, job, KIND, host.run, [KIE_REQ])
    assert out.result == "completed"
    assert host.actions == []
    row = await (await conn.execute("SELECT string_agg(status, ',') AS s FROM usage_logs "
                                    "WHERE job_id = %s", (job,))).fetchone()
    assert row is not None
    assert row["s"] == "committed"
    assert await verify_job(conn, job) == []


async def test_a_sync_kind_runs_once_and_a_redelivery_does_not_run_it_again(
        conn: Conn, calls: OwnCalls) -> None:
    job = await create_job(conn, credits=2)
    ran: list[str] = []

    async def answer(call: SyncCall, prompt: str) -> None:
        ran.append(prompt)
        call.succeeded(text=f"echo {prompt}")

    out = await run_own(calls, job, "anthropic-sync", answer, ["hi"])
    assert out.result == "completed"
    again = await run_own(calls, job, "anthropic-sync", answer, ["hi"])
    assert again.result == "completed"
    assert "already has a call" in (again.detail or "")
    assert ran == ["hi"]
    assert await _types(conn, job) == ["CallStarted", "UpstreamSucceeded",
                                       "FinalizeClaimed", "Completed"]


async def test_an_unknown_kind_writes_nothing(conn: Conn, calls: OwnCalls, host: Host) -> None:
    job = await create_job(conn)
    with pytest.raises(UnknownProviderKind):
        await run_own(calls, job, "acme-nothing", host.run, [KIE_REQ])
    assert await _types(conn, job) == []


async def test_a_poll_reported_on_a_call_that_ended_meanwhile_stops_the_host(
        conn: Conn, calls: OwnCalls, host: Host) -> None:
    """The call was cancelled (refunded) while the host's loop polled: its next
    ``report(Running)`` says so (nothing written), so the loop ends instead of polling a
    settled call until the provider answers."""
    job = await create_job(conn, credits=4)
    call = await calls.start(job, KIND)
    await call.task_created(await kie_create(host.http, host.sim, KIE_REQ))
    assert (await call.report(Running(raw_state="rendering"))).result == "still_running"
    await cancel(conn, job, by="host:admin", now=utcnow())
    after = await call.report(Running(raw_state="rendering"))
    assert (after.ok, after.result) == (False, "cancelled")
    assert "no longer polled" in (after.detail or "")
    assert await _types(conn, job) == ["CallStarted", "TaskCreated", "Cancelled"]


async def test_a_body_past_its_bound_is_cancelled_and_left_to_the_reconciler(
        conn: Conn, pool: Pool, sim: RunningSimulator, host: Host) -> None:
    """A body that never returns (a poll loop with no budget of its own) is cancelled after
    the kind's poll budget and its requests, the bound the queue's visibility timeout is
    sized for; the call stays for the reconciler."""
    from callwarden.providers.base import RetryPolicy

    tight = OwnCalls(pool, settings=ProviderSettings(retry=RetryPolicy(
        max_total_s=0.05, timeout_s=0.05)), config=CallConfig(poll_budget_s={KIND: 0.1},
                                                   rate_limited_wait_s=0.1))
    job = await create_job(conn)
    forever = asyncio.Event()

    async def never_returns(call: OwnCall, request: dict[str, Any]) -> None:
        await call.task_created(await kie_create(host.http, host.sim, request))
        await forever.wait()

    out = await run_own(tight, job, KIND, never_returns, [KIE_REQ])
    assert out.result == "left_for_reconciler"
    assert "ran past 0.4 s" in (out.detail or "")  # budget + 2 requests + the 429 wait
    assert await _types(conn, job) == ["CallStarted", "TaskCreated"]


async def test_keyword_arguments_reach_the_body(conn: Conn, calls: OwnCalls) -> None:
    job = await create_job(conn, credits=1)
    seen: dict[str, Any] = {}

    async def answer(call: SyncCall, *, prompt: str) -> None:
        seen["prompt"] = prompt
        call.succeeded(text=prompt)

    out = await run_own(calls, job, "anthropic-sync", answer, (), {"prompt": "hi"})
    assert out.result == "completed"
    assert seen == {"prompt": "hi"}
