"""Issue 12 end to end: a worker's real ``CallRunner`` against the simulator answering in
the recorded shapes, on the test's database, jobs and reservations inserted by plain SQL
the way a host writes them. Each test reads back what the host sees (``jobs``,
``usage_logs``, ``assets``) and what the log says (``call_events``).

- A Replicate language model's success (``output`` a list of string tokens, or a plain
  string) completes the job with the joined text: in ``output_data`` and in ``Completed``.
- ``data:`` URI outputs (what ``Prefer: wait`` answers) are decoded and stored like
  downloads, under the same size limit, with nothing fetched.
- An Anthropic answer cut at ``max_tokens`` fails and refunds by default (the stop reason in
  the event's code and the job's error); a kind whose policy accepts truncation completes,
  with the stop reason in the ``Completed`` event and in ``output_data``.
- Runway's ``expireFlag: 1`` fails and refunds at poll time: no media request is made.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from tests.support import no_sleep
from tests.support.rows import host_job, seen_by_host

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 120
DATA_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()
TOKENS = ["Hello", " wor", "ld", "!", ""]


async def terminal_event(conn: Conn, job: uuid.UUID) -> tuple[str, dict[str, Any]]:
    row = await (await conn.execute(
        "SELECT type, payload FROM callwarden.call_events WHERE job_id = %s ORDER BY seq DESC "
        "LIMIT 1",
        (job,))).fetchone()
    assert row is not None
    payload = row["payload"]
    return row["type"], payload if isinstance(payload, dict) else msgspec.json.decode(payload)


def replicate(output: Any) -> dict[str, Any]:
    script = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded",
              "output": output}
    return {"version": "meta/meta-llama-3-8b-instruct", "input": {"prompt": "hi",
                                                                  "_sim": script}}


async def test_replicate_token_list_completes_with_the_joined_text(
        conn: Conn, make_runner: Any) -> None:
    job = await host_job(conn)
    out = await make_runner().run(job, "replicate-prediction", replicate(TOKENS))
    assert out.result == "completed"
    row = await seen_by_host(conn, job)
    assert (row["status"], row["credits"], row["assets"]) == ("completed", "committed", 0)
    assert row["output_data"]["text"] == "Hello world!"
    kind, payload = await terminal_event(conn, job)
    assert (kind, payload["text"]) == ("Completed", "Hello world!")


async def test_replicate_plain_string_output_is_text_not_malformed(
        conn: Conn, make_runner: Any) -> None:
    job = await host_job(conn)
    out = await make_runner().run(job, "replicate-prediction", replicate("hello world"))
    assert out.result == "completed"
    assert (await seen_by_host(conn, job))["output_data"]["text"] == "hello world"


async def test_replicate_data_uri_output_is_decoded_and_stored_without_a_fetch(
        conn: Conn, make_runner: Any, sim: RunningSimulator, tmp_path: Path) -> None:
    job = await host_job(conn)
    out = await make_runner().run(job, "replicate-prediction", replicate([DATA_URI]))
    assert out.result == "completed"
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"]) == ("committed", 1)
    stored = list((tmp_path / "media" / str(job)).glob("0.*"))
    assert [p.read_bytes() for p in stored] == [PNG]
    assert sim.sim.media.requests == []
    assert "base64," not in msgspec.json.encode(row["output_data"]).decode()
    events = await (await conn.execute(
        "SELECT type, payload::text AS payload FROM callwarden.call_events WHERE job_id = %s",
        (job,))).fetchall()
    payload = DATA_URI.split(",", 1)[1][:60]
    assert [e["type"] for e in events if payload in e["payload"]] == []  # stored first
    succeeded = [msgspec.json.decode(e["payload"]) for e in events
                 if e["type"] == "UpstreamSucceeded"]
    assert [len(s["result"]["stored_keys"]) for s in succeeded] == [1]


async def test_a_data_uri_is_stored_by_the_reconciler_that_recovers_the_call(
        conn: Conn, make_reconciler: Any, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    job = await host_job(conn)
    request = replicate([DATA_URI])
    request["input"]["_sim"]["steps"] = []  # done by the time the reconciler polls
    async with http.post(sim.url("replicate", "/v1/predictions"), json=request,
                         headers={"Authorization": f"Bearer {sim.sim.api_key}"}) as resp:
        task = (await resp.json())["id"]
    await dead_workers_events(conn, job, "replicate-prediction", task)
    await make_reconciler(thresholds_s={"replicate-prediction": 1.0}).reconcile_once()
    row = await seen_by_host(conn, job)
    assert (row["call_state"], row["credits"], row["assets"]) == (
        "completed", "committed", 1)
    stored = list((tmp_path / "media" / str(job)).glob("0.*"))
    assert [p.read_bytes() for p in stored] == [PNG]


async def test_a_data_uri_over_the_size_limit_fails_and_refunds(
        conn: Conn, make_runner: Any) -> None:
    job = await host_job(conn)
    out = await make_runner(media_max_bytes=64).run(job, "replicate-prediction",
                                                    replicate([DATA_URI]))
    assert out.result == "failed"
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"]) == ("refunded", 0)
    kind, payload = await terminal_event(conn, job)
    assert (kind, payload["code"]) == ("UpstreamFailed", "media_unusable")
    types = [r["type"] for r in await (await conn.execute(
        "SELECT type FROM callwarden.call_events WHERE job_id = %s ORDER BY "
        "seq", (job,))).fetchall()]
    assert "UpstreamSucceeded" not in types  # refused before anything was recorded


def claude(stop_reason: str) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 16,
            "messages": [{"role": "user", "content": "write a long story"}],
            "_sim": {"steps": [], "end": "succeeded", "stop_reason": stop_reason}}


async def test_an_answer_cut_at_max_tokens_fails_and_refunds_by_default(
        conn: Conn, make_runner: Any) -> None:
    job = await host_job(conn)
    out = await make_runner().run(job, "anthropic-sync", claude("max_tokens"))
    assert out.result == "failed"
    row = await seen_by_host(conn, job)
    assert row["credits"] == "refunded"
    assert "max_tokens" in (row["error_message"] or "")
    kind, payload = await terminal_event(conn, job)
    assert (kind, payload["code"]) == ("UpstreamFailed", "truncated:max_tokens")


async def test_a_policy_that_accepts_truncation_completes_keeping_the_stop_reason(
        conn: Conn, pool: Any, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    settings = msgspec.structs.replace(
        sim.settings, stop_policy={"anthropic-sync": {"max_tokens": "succeed"}})
    runner = CallRunner(pool, http, settings, LocalFolderStore(tmp_path / "media"),
                        config=CallConfig(), sleep=no_sleep)
    job = await host_job(conn)
    out = await runner.run(job, "anthropic-sync", claude("max_tokens"))
    assert out.result == "completed"
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["output_data"]["stop_reason"]) == ("committed", "max_tokens")
    assert row["output_data"]["text"]
    kind, payload = await terminal_event(conn, job)
    assert (kind, payload["stop_reason"]) == ("Completed", "max_tokens")


async def runway_task(sim: RunningSimulator, http: aiohttp.ClientSession) -> str:
    async with http.post(sim.url("kie", "/api/v1/runway/generate"), json={
            "prompt": "a river", "duration": 5, "quality": "720p", "aspectRatio": "16:9",
            "callBackUrl": "http://127.0.0.1:9/cb",
            "_sim": {"steps": [], "end": "succeeded", "webhook": {"drop": True}}},
            headers={"Authorization": f"Bearer {sim.sim.api_key}",
                     "User-Agent": "test"}) as resp:
        return str((await resp.json())["data"]["taskId"])


async def dead_workers_events(conn: Conn, job: uuid.UUID, kind: str, task: str) -> None:
    """What a worker that created the task and died left: CallStarted + TaskCreated."""
    events: list[dict[str, Any]] = [
              {"type": "CallStarted", "at": "2026-01-01T00:00:00Z", "actor": "worker:x",
               "kind": kind, "sync": False},
              {"type": "TaskCreated", "at": "2026-01-01T00:00:01Z", "actor": "worker:x",
               "task_id": task}]
    for seq, event in enumerate(events, start=1):
        await conn.execute(
            "INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor) "
            "VALUES (%s, %s, %s, 1, %s::jsonb, 'worker:x')",
            (job, seq, event["type"], msgspec.json.encode(event).decode()))
    await conn.execute(
        "UPDATE jobs SET call_state = 'polling', call_version = 2, provider_kind = %s, "
        "provider_task_id = %s, provider_call_started_at = '2026-01-01T00:00:00Z', "
        "status = 'processing' WHERE id = %s", (kind, task, job))


async def test_runway_expired_flag_fails_and_refunds_at_poll_without_a_download(
        conn: Conn, make_runner: Any, sim: RunningSimulator,
        http: aiohttp.ClientSession) -> None:
    job = await host_job(conn)
    task = await runway_task(sim, http)
    await dead_workers_events(conn, job, "kie-runway", task)
    sim.sim.clock.advance(15 * 24 * 3600)  # the video outlived Runway's 14 days
    out = await make_runner().run(job, "kie-runway", {"prompt": "a river", "duration": 5,
                                                      "quality": "720p",
                                                      "aspectRatio": "16:9"})
    assert out.result == "failed"
    row = await seen_by_host(conn, job)
    assert (row["credits"], row["assets"]) == ("refunded", 0)
    kind, payload = await terminal_event(conn, job)
    assert (kind, payload["code"]) == ("UpstreamFailed", "result_gone")
    assert sim.sim.media.requests == []
    assert sim.sim.journal.count("kie", "create") == 1  # resumed, never created again
