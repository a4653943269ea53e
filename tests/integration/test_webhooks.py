"""Webhook receivers against the simulator's real signed deliveries: the service app runs
on 127.0.0.1 (AppRunner, port 0), the simulator calls back the URL given at create time.

A script's ``webhook.drop`` makes the simulator record a delivery (real body, real
signature) without sending it, so a test can send it itself: tampered, late, twice.
Tasks progress by simulated time (``Step.seconds``) and the receiver checks signatures on
the simulator's clock, so ``sim.clock.advance`` moves a task on without making it stale.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.calls.callbacks import CallbackUrls, callback_url_for, ensure_callback_token
from callwarden.calls.finalize import Finalizer
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import cancel, load, load_events
from callwarden.providers.elevenlabs.webhook import elevenlabs_sign
from callwarden.providers.kie.webhook import kie_sign
from callwarden.providers.replicate.webhook import replicate_sign
from callwarden.providers.simulator.core import Delivery, RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.replay.verify import verify_job
from callwarden.service.app import RedactingAccessLogger, ServiceConfig, build_webhook_app
from tests.support.webhooks import (
    AUTH,
    KIE_FAMILIES,
    QUEUED,
    Service,
    event_types,
    kie_task,
    post,
    replicate_task,
    serving,
    start_call,
    state,
    stt_body,
    task_created,
    terminal_delivery,
)

TERMINAL_MARKERS = (b'"callbackType":"complete"', b'"callbackType":"error"')


async def suno_terminal_delivery(sim: RunningSimulator) -> Delivery:
    """Suno calls back per stage (text, first, then complete or error): wait, on the
    deliveries' condition, for the terminal one."""
    sim.sim.clock.advance(60)
    count = 1
    while True:
        seen = await sim.sim.webhooks.wait_for(count, outcome="delivered")
        for d in seen:
            if any(marker in d.body for marker in TERMINAL_MARKERS):
                return d
        count = len(seen) + 1


# -- Replicate -------------------------------------------------------------------------------

async def test_replicate_signed_delivery_completes_the_job_once(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    job = await replicate_task(conn, sim, http, service, events=["start", "completed"])
    deliveries = await terminal_delivery(sim, count=2)
    await service.drain()
    assert {d.status for d in deliveries} == {200}
    assert await state(conn, job) == ("completed", "committed")
    assert (await event_types(conn, job))[-3:] == [
        "UpstreamSucceeded", "FinalizeClaimed", "Completed"]
    assert await verify_job(conn, job) == []


async def test_replicate_tampered_stale_and_replayed_deliveries_change_nothing(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    job = await replicate_task(conn, sim, http, service, webhook={"drop": True})
    [d] = await terminal_delivery(sim, outcome="dropped")
    assert await post(http, d, body=d.body.replace(b'"succeeded"', b'"failed"')) == 401
    unsigned = msgspec.structs.replace(d, headers={"Content-Type": "application/json"})
    assert await post(http, unsigned) == 401
    service.offset[0] = 400.0  # the delivery is now older than the 300 s tolerance
    assert await post(http, d) == 401
    assert await state(conn, job) == ("polling", "reserved")
    service.offset[0] = 0.0
    assert await post(http, d) == 200
    assert await post(http, d) == 200  # same webhook-id: acknowledged, changes nothing
    await service.drain()
    assert await state(conn, job) == ("completed", "committed")
    assert (await event_types(conn, job)).count("UpstreamSucceeded") == 1


async def test_replicate_duplicated_delivery_is_acknowledged_and_changes_nothing(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    """Replicate retries on any 4xx: a duplicate answered 409 would become a retry storm."""
    job = await replicate_task(conn, sim, http, service, webhook={"duplicates": 2})
    await terminal_delivery(sim)
    await sim.sim.webhooks.drain()
    await service.drain()
    assert sorted(d.status or 0 for d in sim.sim.webhooks.deliveries) == [200, 200, 200]
    assert await state(conn, job) == ("completed", "committed")
    assert (await event_types(conn, job)).count("Completed") == 1


async def test_replicate_out_of_order_start_after_completion_is_acknowledged_only(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    job = await replicate_task(conn, sim, http, service, events=["start", "completed"],
                               webhook={"drop": True})
    start, completed = await terminal_delivery(sim, outcome="dropped", count=2)
    assert await post(http, completed) == 200
    await service.drain()
    before = await event_types(conn, job)
    assert await post(http, start) == 200  # intermediate: no transition
    assert await event_types(conn, job) == before
    assert await state(conn, job) == ("completed", "committed")


async def test_replicate_failure_after_cancel_is_a_noop(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    job = await replicate_task(conn, sim, http, service, webhook={"drop": True})
    [d] = await terminal_delivery(sim, outcome="dropped")
    await cancel(conn, job, by="user:1", now=datetime.now(UTC))
    assert await post(http, d) == 200
    await service.drain()
    assert await state(conn, job) == ("cancelled", "refunded")
    assert "UpstreamSucceeded" not in await event_types(conn, job)


async def test_authentic_delivery_for_a_task_not_yet_recorded_is_acknowledged_only(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    """Only bad signatures, stale timestamps and malformed bodies get 4xx (a provider
    retries on 4xx): a task not (yet) a call of ours is acknowledged with 202 and changes
    nothing, and a later delivery of it (the provider's retry) is not taken for a replay."""
    job = await start_call(conn, "replicate-prediction")  # task id not recorded yet
    async with http.post(sim.url("replicate", "/v1/predictions"), headers=AUTH, json={
            "version": "owner/model",
            "input": {"_sim": {"steps": QUEUED, "webhook": {"drop": True}}},
            "webhook": f"{service.url}/webhooks/replicate"}) as resp:
        task_id = (await resp.json())["id"]
    [d] = await terminal_delivery(sim, outcome="dropped")
    assert await post(http, d) == 202
    assert await state(conn, job) == ("created", "reserved")
    await task_created(conn, job, task_id)
    assert await post(http, d) == 200  # the acknowledged attempt was not recorded as seen
    await service.drain()
    assert await state(conn, job) == ("completed", "committed")


async def test_oversized_and_malformed_bodies_are_refused(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    url = f"{service.url}/webhooks/replicate"
    async with http.post(url, data=b"x" * (2**20 + 1)) as resp:
        assert resp.status == 413
    secret = sim.sim.webhook_secrets["replicate"]
    ts = int(sim.sim.clock.now())
    body = b"not json"
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(ts),
               "webhook-signature": replicate_sign(secret, "msg_1", ts, body)}
    async with http.post(url, data=body, headers=headers) as resp:
        assert resp.status == 400
    count = await (await conn.execute("SELECT count(*) AS n FROM "
                                      "callwarden.webhook_deliveries")).fetchone()
    assert count == {"n": 0}


# -- KIE -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "path", "request_body"), KIE_FAMILIES,
                         ids=[k for k, _, _ in KIE_FAMILIES])
async def test_kie_callback_of_every_family_completes_the_job(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession, service: Service,
        kind: str, path: str, request_body: dict[str, Any]) -> None:
    job = await kie_task(conn, sim, http, service, kind, path, request_body)
    if kind == "kie-suno":  # "text", then "first": acknowledged, no transition
        sim.sim.clock.advance(31)
        [text] = await sim.sim.webhooks.wait_for(1, outcome="delivered")
        assert b'"callbackType":"text"' in text.body
        assert await state(conn, job) == ("polling", "reserved")
    if kind == "kie-suno":
        await suno_terminal_delivery(sim)
    else:
        await terminal_delivery(sim)
    await service.drain()
    assert await state(conn, job) == ("completed", "committed")
    assert await verify_job(conn, job) == []


@pytest.mark.parametrize("kind", ["kie-standard", "kie-veo", "kie-suno", "kie-runway"])
async def test_kie_failure_callback_fails_and_refunds(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession, service: Service,
        kind: str) -> None:
    _, path, request_body = next(f for f in KIE_FAMILIES if f[0] == kind)
    job = await kie_task(conn, sim, http, service, kind, path, request_body, end="failed")
    if kind == "kie-suno":
        await suno_terminal_delivery(sim)
    else:
        await terminal_delivery(sim)
    assert await state(conn, job) == ("failed", "refunded")


async def test_kie_wrong_token_is_refused(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    kind, path, request_body = KIE_FAMILIES[0]
    job = await kie_task(conn, sim, http, service, kind, path, request_body,
                         webhook={"drop": True})
    [d] = await terminal_delivery(sim, outcome="dropped")
    forged = d.url.rsplit("/", 1)[0] + "/not-the-token"
    assert await post(http, d, url=forged) == 401
    assert await state(conn, job) == ("polling", "reserved")
    assert await post(http, d) == 200
    assert await post(http, d) == 200  # token mode has no timestamp: a duplicate no-op
    await service.drain()
    assert (await event_types(conn, job)).count("UpstreamSucceeded") == 1


async def test_kie_hmac_mode_rejects_bad_stale_and_replayed_callbacks(
        pool: Pool, conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    async with serving(pool, sim, http, tmp_path,
                       kie_hmac_key=sim.sim.webhook_secrets["kie"]) as hmac_service:
        kind, path, request_body = KIE_FAMILIES[0]
        job = await kie_task(conn, sim, http, hmac_service, kind, path, request_body,
                             webhook={"drop": True})
        [d] = await terminal_delivery(sim, outcome="dropped")
        bad = {**d.headers, "X-Webhook-Signature": "AAAA" + d.headers["X-Webhook-Signature"]}
        async with http.post(d.url, data=d.body, headers=bad) as resp:
            assert resp.status == 401
        hmac_service.offset[0] = 400.0
        assert await post(http, d) == 401
        hmac_service.offset[0] = 0.0
        assert await post(http, d) == 200
        polls = sim.sim.journal.count("kie", "poll")
        assert await post(http, d) == 200  # a replay: acknowledged, no second poll
        assert sim.sim.journal.count("kie", "poll") == polls
        await hmac_service.drain()
        assert await state(conn, job) == ("completed", "committed")


async def test_authentic_kie_callbacks_about_nothing_tracked_are_acknowledged(
        pool: Pool, conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """KIE retries any 4xx: an authentic callback about a task the job no longer runs (a
    task replaced under "recreate"), or about a job this database does not have, is
    acknowledged and changes nothing; only a bad signature is refused."""
    key = sim.sim.webhook_secrets["kie"]
    async with serving(pool, sim, http, tmp_path, kie_hmac_key=key) as hmac_service:
        kind, path, request_body = KIE_FAMILIES[0]
        job = await kie_task(conn, sim, http, hmac_service, kind, path, request_body,
                             webhook={"drop": True})
        [d] = await terminal_delivery(sim, outcome="dropped")
        await conn.execute("UPDATE jobs SET provider_task_id = 'the-replacing-task' "
                           "WHERE id = %s", (job,))
        before = await event_types(conn, job)
        assert await post(http, d) == 200
        assert await event_types(conn, job) == before
        elsewhere = d.url.replace(str(job), str(uuid.uuid4()))
        assert await post(http, d, url=elsewhere) == 202
        ts = int(sim.sim.clock.now())
        forged = {**d.headers, "X-Webhook-Timestamp": str(ts),
                  "X-Webhook-Signature": kie_sign("not-the-key", "t", ts)}
        async with http.post(elsewhere, data=d.body, headers=forged) as resp:
            assert resp.status == 401


# -- ElevenLabs ------------------------------------------------------------------------------


async def test_elevenlabs_signed_transcription_webhook_completes_the_job(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    job = await start_call(conn, "elevenlabs-async")
    await task_created(conn, job, "req-stt-1")
    body = stt_body("req-stt-1")
    secret, ts = sim.sim.webhook_secrets["elevenlabs"], int(sim.sim.clock.now())
    url = f"{service.url}/webhooks/elevenlabs"

    def sign(b: bytes) -> dict[str, str]:
        return {"ElevenLabs-Signature": elevenlabs_sign(secret, ts, b)}

    async with http.post(url, data=body, headers=sign(body + b" ")) as resp:
        assert resp.status == 401
    for other in (b'{"type": "voice_removal_notice", "data": {}}',
                  # there is no dubbing webhook (the SDK's event types have none): a body
                  # claiming to be one is acknowledged and ignored, the dub is polled
                  b'{"type": "dubbing", "data": {"dubbing_id": "x", "status": "dubbed"}}'):
        async with http.post(url, data=other, headers=sign(other)) as resp:
            assert (resp.status, (await resp.json())["result"]) == (200, "ignored")
    async with http.post(url, data=body, headers=sign(body)) as resp:
        assert resp.status == 200
    async with http.post(url, data=body, headers=sign(body)) as resp:
        assert (resp.status, (await resp.json())["result"]) == (200, "duplicate")
    await service.drain()
    assert await state(conn, job) == ("completed", "committed")
    assert (await load(conn, job)).output_text == "Hello world!"


# -- races -----------------------------------------------------------------------------------

class HookedStore(LocalFolderStore):
    """A media store that runs ``before_first_put`` once, when the first finalizer to
    store media is about to store it: the moment its claim is held."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.before_first_put: Callable[[], Awaitable[None]] | None = None
        self.puts = 0

    async def put(self, key: str, data: bytes, content_type: str) -> Any:
        self.puts += 1
        hook, self.before_first_put = self.before_first_put, None
        if hook is not None:
            await hook()
        return await super().put(key, data, content_type)


ORDERS = ["webhook_first", "worker_first", "webhook_while_worker_finalizes"]


@pytest.mark.parametrize("order", ORDERS)
async def test_webhook_racing_worker_and_finalizer_settles_once(
        pool: Pool, conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service, tmp_path: Path, order: str) -> None:
    """The worker (polling, with a callback URL), the webhook receiver and a third
    finalizer (a reconciler's) race for one KIE call, in each order forced by signals
    (the worker's wait between polls, the simulator's delivery, the moment a finalizer
    holding its claim stores media) rather than by timing: whoever records and
    finalizes first, the call is claimed, completed and committed once."""
    job = await create_job(conn, credits=10)
    urls = CallbackUrls(service.url)
    await urls.prepare(conn, job)
    store = HookedStore(tmp_path / "media")
    other = Finalizer(pool, store, sim.settings, owner="reconciler:test",
                      clock=lambda: datetime.now(UTC))
    dropped = order != "webhook_first"  # the test delivers it itself, at its moment
    request = {"model": "nano-banana-pro", "input": {"prompt": "race", "_sim": {
        "steps": [{"phase": "queued", "seconds": 60}], "webhook": {"drop": dropped}}}}
    others: list[str] = []

    async def deliver_and_finalize() -> None:
        [d] = await sim.sim.webhooks.wait_for(1, outcome="dropped")
        assert await post(http, d) == 200
        await service.drain()
        others.append((await other.finalize(job)).outcome)

    async def between_polls(_: float) -> None:  # the task ends upstream while the worker waits
        if sim.sim.clock.now() < started + 60:
            sim.sim.clock.advance(60)
            if order == "webhook_first":  # the callback arrives, and is finalized, first
                await sim.sim.webhooks.wait_for(1, outcome="delivered")
                await service.drain()
                others.append((await other.finalize(job)).outcome)

    if order == "webhook_while_worker_finalizes":
        store.before_first_put = deliver_and_finalize
    started = sim.sim.clock.now()
    runner = CallRunner(pool, http, sim.settings, store, sleep=between_polls,
                        callback_url=urls)
    outcome = await runner.run(job, "kie-standard", request)
    if order == "worker_first":
        await deliver_and_finalize()
    await service.drain()
    assert outcome.result == "completed"
    assert await state(conn, job) == ("completed", "committed")
    events = await load_events(conn, job)
    types = [type(e).__name__ for e in events]
    assert [types.count(t) for t in ("UpstreamSucceeded", "FinalizeClaimed", "Completed")] == [
        1, 1, 1]
    recorder = next(e.actor for e in events if type(e).__name__ == "UpstreamSucceeded")
    finisher = next(e.actor for e in events if type(e).__name__ == "Completed")
    webhook_won = order == "webhook_first"
    assert recorder.startswith("webhook:" if webhook_won else "worker:")
    assert finisher.startswith("webhook:" if webhook_won else "worker:")
    assert others == ["not_claimable"]  # the third finalizer found nothing to claim
    assert store.puts == (0 if webhook_won else 1)  # (the service stores in its own)
    assets = await (await conn.execute("SELECT count(*) AS n FROM assets WHERE job_id = %s",
                                       (job,))).fetchone()
    assert assets == {"n": 1}  # the media was attached once
    assert await verify_job(conn, job) == []


# -- what a delivery is trusted for (issue 11, item 6) ------------------------------------------

def _forged_success(task_id: str, urls: list[str]) -> bytes:
    data = {"taskId": task_id, "state": "success", "costTime": 1,
            "resultJson": msgspec.json.encode({"resultUrls": urls}).decode(),
            "creditsConsumed": -500}
    return msgspec.json.encode({"code": 200, "msg": "success", "data": data})


async def test_forged_kie_callback_body_is_not_trusted_the_poll_is(
        pool: Pool, conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    """KIE signs only taskId.timestamp: a captured signature can carry any body inside the
    tolerance window. The receiver polls the task instead, and records what the poll says:
    the forged success (attacker URLs, a negative cost) changes nothing while the task runs,
    and the real result is the simulator's, not the attacker's."""
    async with serving(pool, sim, http, tmp_path,
                       kie_hmac_key=sim.sim.webhook_secrets["kie"]) as hmac_service:
        kind, path, request_body = KIE_FAMILIES[0]
        job = await kie_task(conn, sim, http, hmac_service, kind, path, request_body,
                             webhook={"drop": True})
        task_id = str((await load(conn, job)).provider_task_id)
        sim.sim.clock.advance(60)  # the task is done upstream; its callback was dropped
        [genuine] = await sim.sim.webhooks.wait_for(1, outcome="dropped")
        forged = _forged_success(task_id, ["http://169.254.169.254/latest/meta-data"])
        async with http.post(genuine.url, data=forged, headers=genuine.headers) as resp:
            assert resp.status == 200  # authentic signature: acknowledged
        await hmac_service.drain()
        assert await state(conn, job) == ("completed", "committed")
        result = (await load(conn, job)).output_media or ()
        assert [m.url.startswith("file://") for m in result] == [True]
        usage = await (await conn.execute(
            "SELECT credits_charged FROM usage_logs WHERE job_id = %s", (job,))).fetchone()
        assert usage is not None
        assert usage["credits_charged"] >= 0  # the forged -500 was never read


async def test_forged_kie_callback_while_the_task_runs_changes_nothing(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    kind, path, request_body = KIE_FAMILIES[0]
    job = await kie_task(conn, sim, http, service, kind, path, request_body)
    task_id = str((await load(conn, job)).provider_task_id)
    token = (await (await conn.execute(
        "SELECT token FROM callwarden.callback_tokens WHERE job_id = %s", (job,)
    )).fetchone() or {})["token"]
    url = callback_url_for(service.url, job, kind, token)
    assert url is not None
    fail = msgspec.json.encode({"code": 501, "msg": "forged failure",
                                "data": {"taskId": task_id, "state": "fail"}})
    answers = []
    for body in (_forged_success(task_id, ["https://evil.example/x.png"]), fail):
        async with http.post(url, data=body) as resp:
            answers.append((resp.status, (await resp.json())["result"]))
    # polled once (the task runs), then coalesced: within signal_interval_s of that poll
    assert answers == [(200, "intermediate"), (200, "coalesced")]
    assert await state(conn, job) == ("polling", "reserved")
    assert await event_types(conn, job) == ["CallStarted", "TaskCreated"]


async def test_elevenlabs_replay_with_extra_header_parts_is_still_a_duplicate(
        conn: Conn, sim: RunningSimulator, http: aiohttp.ClientSession,
        service: Service) -> None:
    job = await start_call(conn, "elevenlabs-async")
    await task_created(conn, job, "req-stt-2")
    body = stt_body("req-stt-2")
    header = elevenlabs_sign(sim.sim.webhook_secrets["elevenlabs"], int(sim.sim.clock.now()),
                             body)
    url = f"{service.url}/webhooks/elevenlabs"
    results = []
    for variant in (header, header + ",x=1", f"x=2, {header}"):
        async with http.post(url, data=body, headers={"ElevenLabs-Signature": variant}) as r:
            results.append((r.status, (await r.json())["result"]))
    assert results == [(200, "applied"), (200, "duplicate"), (200, "duplicate")]
    await service.drain()
    assert (await event_types(conn, job)).count("UpstreamSucceeded") == 1


async def test_callback_token_in_the_url_never_reaches_the_access_log(
        pool: Pool, conn: Conn, sim: RunningSimulator, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    finalizer = Finalizer(pool, LocalFolderStore(tmp_path), sim.settings, owner="webhook:t")
    runner = web.AppRunner(build_webhook_app(pool, finalizer, ServiceConfig()),
                           access_log_class=RedactingAccessLogger)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    job = await start_call(conn, "kie-standard")
    token = await ensure_callback_token(conn, job)
    assert token is not None
    try:
        with caplog.at_level(logging.INFO, logger="aiohttp.access"):
            async with aiohttp.ClientSession() as client, client.post(
                    f"http://127.0.0.1:{runner.addresses[0][1]}/webhooks/kie/{job}/{token}",
                    data=b"{}") as resp:
                assert resp.status == 400
    finally:
        await runner.cleanup()
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "aiohttp.access")
    assert f"/webhooks/kie/{job}/redacted" in logged
    assert token not in logged
