"""The worker API in process: real Postgres, the provider simulator over HTTP, a real
local media store. (Crashes with SIGKILL are in tests/acceptance.)"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events
from callwarden.events.states import CallState
from callwarden.events.types import CallStarted, TaskCreated, UpstreamSucceeded
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.replay.verify import verify_job
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
    stored = list((tmp_path / "media" / str(job)).glob("0.*"))
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


TTS: dict[str, Any] = {"operation": "tts", "voice_id": "v1", "text": "hello"}


class Crash(BaseException):
    """The worker dies (nothing catches a ``BaseException`` but the test)."""


class WatchedStore(LocalFolderStore):
    """A media store that, at each put, reads the job's event log from the database
    (another connection: what any other actor would see at that moment), and stores;
    ``crash_after_put``: the worker then dies before anything else happens."""

    def __init__(self, root: Path, db_url: str, job: uuid.UUID, *,
                 crash_after_put: bool = False) -> None:
        super().__init__(root)
        self.db_url, self.job, self.crash_after_put = db_url, job, crash_after_put
        self.puts: list[tuple[str, list[str]]] = []  # (key, event types when it was put)

    async def put(self, key: str, data: bytes, content_type: str) -> Any:
        async with await connect(self.db_url) as c:
            seen = [type(e).__name__ for e in await load_events(c, self.job)]
        obj = await super().put(key, data, content_type)
        self.puts.append((key, seen))
        if self.crash_after_put:
            raise Crash(key)
        return obj


async def test_sync_tts_bytes_are_stored_before_the_outcome_is_recorded(
        db_url: str, conn: Conn, pool: Pool, sim: RunningSimulator,
        http: aiohttp.ClientSession, tmp_path: Path) -> None:
    """The audio exists only in the answer: it is stored (once) while the log holds only
    ``CallStarted``, and the ``UpstreamSucceeded`` recorded after it names the stored key;
    finalization checks that object and stores nothing again."""
    job = await create_job(conn)
    store = WatchedStore(tmp_path / "media", db_url, job)
    runner = CallRunner(pool, http, sim.settings, store, sleep=no_sleep)
    out = await runner.run(job, "elevenlabs-sync", TTS, operation="tts")
    assert out.result == "completed"
    [(key, seen)] = store.puts
    assert seen == ["CallStarted"]  # no outcome recorded when the bytes were stored
    events = await load_events(conn, job)
    assert [type(e).__name__ for e in events] == [
        "CallStarted", "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    succeeded = events[1]
    assert isinstance(succeeded, UpstreamSucceeded)
    assert succeeded.result.stored_keys == (key,)
    assert await store.exists(key)
    row = await _row(conn, job)
    assert (row["assets"], row["credits"], row["credits_charged"]) == (1, "committed", 10)
    assert await verify_job(conn, job) == []


async def test_a_worker_dying_between_storing_bytes_and_recording_leaves_no_outcome(
        db_url: str, conn: Conn, pool: Pool, sim: RunningSimulator,
        http: aiohttp.ClientSession, tmp_path: Path, make_reconciler: Any) -> None:
    """Died right after the put: the bytes are there, no outcome is recorded. A
    redelivered job calls nothing again (a sync call cannot be resumed), stores nothing
    again, and the reconciler sweeps and refunds it: nothing is charged."""
    job = await create_job(conn)
    store = WatchedStore(tmp_path / "media", db_url, job, crash_after_put=True)
    runner = CallRunner(pool, http, sim.settings, store, sleep=no_sleep)
    with pytest.raises(Crash):
        await runner.run(job, "elevenlabs-sync", TTS, operation="tts")
    [(key, _)] = store.puts
    assert await store.exists(key)
    assert [type(e).__name__ for e in await load_events(conn, job)] == ["CallStarted"]
    calls = sim.sim.journal.count("elevenlabs")
    assert calls == 1
    again = await runner.run(job, "elevenlabs-sync", TTS, operation="tts")
    assert again.result == "left_for_reconciler"
    assert (sim.sim.journal.count("elevenlabs"), len(store.puts)) == (calls, 1)
    counts = await make_reconciler().reconcile_once(utcnow() + timedelta(hours=1))
    assert counts.swept == 1
    row = await _row(conn, job)
    assert (row["call_state"], row["credits"], row["credits_charged"], row["assets"]) == (
        "swept", "refunded", 0, 0)
    assert len(store.puts) == 1
    assert await verify_job(conn, job) == []


async def test_unknown_kind_writes_nothing(conn: Conn, make_runner: Any) -> None:
    from callwarden.providers.errors import UnknownProviderKind

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
