"""The worker API in process: real Postgres, the provider simulator over HTTP, a real
local media store. (Crashes with SIGKILL are in tests/acceptance.)"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.calls.runner import CallRunner
from engine.replay.verify import verify_job
from engine.store.db import Conn, Pool, connect
from engine.store.jobs import create_job
from engine.store.write import append, load
from events.states import CallState
from events.types import CallStarted, TaskCreated
from providers.simulator.core import RunningSimulator
from providers.storage import LocalFolderStore
from tests.support import no_sleep

KIE_REQ: dict[str, Any] = {"model": "nano-banana-pro", "input": {"prompt": "a cat"}}



async def _row(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.status, j.call_state, j.progress, j.error_message, u.status AS credits, "
        "u.credits_charged, (SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j LEFT JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s", (job,)
    )).fetchone()
    assert row is not None
    return dict(row)


async def test_async_call_completes_with_stored_media_and_commits(
        conn: Conn, make_runner: Any, sim: RunningSimulator, tmp_path: Path) -> None:
    job = await create_job(conn, credits=10)
    out = await make_runner().run(job, "kie-standard", KIE_REQ)
    assert out.result == "completed"
    row = await _row(conn, job)
    assert (row["status"], row["call_state"], row["progress"], row["credits"]) == (
        "completed", "completed", 100, "committed")
    assert row["assets"] == 1
    stored = list((tmp_path / "media" / "media" / str(job)).glob("0.*"))
    assert len(stored) == 1
    assert stored[0].read_bytes()
    assert sim.sim.journal.count("kie", "create") == 1
    assert await verify_job(conn, job) == []


async def test_redelivered_job_resumes_the_task_and_never_creates(
        conn: Conn, make_runner: Any, sim: RunningSimulator, http: aiohttp.ClientSession
) -> None:
    job = await create_job(conn)
    runner = make_runner()
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=datetime.now(UTC), actor="dead-worker", kind="kie-standard"))).projection
    async with http.post(sim.url("kie", "/api/v1/jobs/createTask"), json=KIE_REQ,
                         headers={"Authorization": "Bearer sim-key"}) as resp:
        task_id = (await resp.json())["data"]["taskId"]
    await append(conn, job, p, TaskCreated(at=datetime.now(UTC), actor="dead-worker",
                                           task_id=task_id))
    out = await runner.run(job, "kie-standard", KIE_REQ)
    assert out.result == "completed"
    assert sim.sim.journal.count("kie", "create") == 1  # only the dead worker's


async def test_ambiguous_create_is_left_for_the_reconciler_by_default(
        conn: Conn, make_runner: Any, sim: RunningSimulator) -> None:
    job = await create_job(conn)
    await append(conn, job, await load(conn, job), CallStarted(
        at=datetime.now(UTC), actor="dead-worker", kind="kie-standard"))
    out = await make_runner().run(job, "kie-standard", KIE_REQ)
    assert out.result == "left_for_reconciler"
    assert out.projection.state is CallState.CREATED
    assert sim.sim.journal.count("kie", "create") == 0
    recreated = await make_runner(ambiguous_create="recreate").run(job, "kie-standard", KIE_REQ)
    assert recreated.result == "completed"
    assert sim.sim.journal.count("kie", "create") == 1


async def test_terminal_call_returns_without_touching_the_provider(
        conn: Conn, make_runner: Any, sim: RunningSimulator) -> None:
    job = await create_job(conn)
    await make_runner().run(job, "kie-standard", KIE_REQ)
    before = sim.sim.journal.count()
    again = await make_runner().run(job, "kie-standard", KIE_REQ)
    assert again.result == "completed"
    assert sim.sim.journal.count() == before


@pytest.mark.parametrize(("kind", "script", "result", "error"), [
    ("kie-standard", {"end": "failed", "error": "nsfw content"}, "failed", "nsfw"),
    ("replicate-prediction", {"end": "failed", "error": "CUDA OOM"}, "failed", "CUDA OOM"),
    ("replicate-prediction", {"end": "vanished"}, "swept", "upstream_task_not_found"),
])
async def test_upstream_failure_and_vanished_tasks_refund(
        conn: Conn, make_runner: Any, kind: str, script: dict[str, Any], result: str,
        error: str) -> None:
    job = await create_job(conn)
    if kind == "kie-standard":
        req: dict[str, Any] = {**KIE_REQ, "input": {**KIE_REQ["input"], "_sim": script}}
    else:
        req = {"version": "owner/model", "input": {"prompt": "x", "_sim": script}}
    out = await make_runner().run(job, kind, req)
    assert out.result == result
    row = await _row(conn, job)
    assert row["credits"] == "refunded"
    assert error in (row["error_message"] or "")


async def test_sync_llm_call_completes_with_text(conn: Conn, make_runner: Any) -> None:
    job = await create_job(conn, credits=3)
    out = await make_runner().run(job, "anthropic-sync", {
        "model": "claude-sonnet-4-6", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]})
    assert out.result == "completed"
    assert out.projection.upstream_result is not None
    assert out.projection.upstream_result.text
    assert (await _row(conn, job))["credits"] == "committed"


async def test_sync_tts_bytes_are_stored_before_the_outcome_is_recorded(
        conn: Conn, make_runner: Any, tmp_path: Path) -> None:
    job = await create_job(conn)
    out = await make_runner().run(job, "elevenlabs-sync", {
        "operation": "tts", "voice_id": "v1", "text": "hello"}, operation="tts")
    assert out.result == "completed"
    assert (await _row(conn, job))["assets"] == 1
    assert any((tmp_path / "media" / "media" / str(job)).glob("0.*"))


async def test_unknown_kind_writes_nothing(conn: Conn, make_runner: Any) -> None:
    from providers.errors import UnknownProviderKind

    job = await create_job(conn)
    with pytest.raises(UnknownProviderKind):
        await make_runner().run(job, "midjourney", {})
    assert (await load(conn, job)).version == 0


async def _workflow(conn: Conn, status: str, failed: list[str]) -> uuid.UUID:
    wf = uuid.uuid4()
    await conn.execute("INSERT INTO workflow_executions (id, status, failed_nodes) "
                       "VALUES (%s, %s, %s)", (wf, status, failed))
    return wf


@pytest.mark.parametrize(("status", "failed", "expected"), [
    ("failed", ["node-1"], "completed"),            # sole cause: reopened
    ("failed", ["node-1", "node-2"], "failed"),     # multi-cause: stays failed
    ("cancelled", ["node-1"], "cancelled"),         # a user's cancel is never overwritten
])
async def test_workflow_reopens_only_when_this_node_was_the_sole_failure(
        conn: Conn, make_runner: Any, status: str, failed: list[str], expected: str) -> None:
    wf = await _workflow(conn, status, failed)
    job = await create_job(conn, workflow_execution_id=wf, node_id="node-1")
    assert (await make_runner().run(job, "kie-standard", KIE_REQ)).result == "completed"
    row = await (await conn.execute(
        "SELECT status FROM workflow_executions WHERE id = %s", (wf,))).fetchone()
    assert row == {"status": expected}


async def test_storage_failure_is_retriable_never_half_completed(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    job = await create_job(conn)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the media root should be")
    runner = CallRunner(pool, http, sim.settings, LocalFolderStore(blocked), sleep=no_sleep)
    out = await runner.run(job, "kie-standard", KIE_REQ)
    assert out.projection.state is CallState.UPSTREAM_SUCCEEDED
    assert (await _row(conn, job))["credits"] == "reserved"
    good = CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path / "ok"),
                      sleep=no_sleep)
    assert (await good.run(job, "kie-standard", KIE_REQ)).result == "completed"
    assert await verify_job(conn, job) == []


async def test_host_cancel_during_finalization_refunds(
        db_url: str, conn: Conn, pool: Pool, sim: RunningSimulator,
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    job = await create_job(conn, credits=6)

    class CancellingStore(LocalFolderStore):
        async def put(self, key: str, data: bytes, content_type: str) -> Any:
            async with await connect(db_url) as c:  # the host cancels mid-upload
                await c.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (job,))
            return await super().put(key, data, content_type)

    runner = CallRunner(pool, http, sim.settings, CancellingStore(tmp_path / "m"),
                        sleep=no_sleep)
    out = await runner.run(job, "kie-standard", KIE_REQ)
    assert out.result == "cancelled"
    row = await _row(conn, job)
    assert (row["credits"], row["assets"]) == ("refunded", 0)
