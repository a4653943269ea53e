"""The real Replicate clients against the simulator: outcomes, errors, retries, expiry,
webhooks, and the duplicate-billing guard read from the journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from callwarden.providers.base import Endpoint
from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    MalformedResponse,
    MediaExpired,
    ProviderTimeout,
    TransientError,
)
from callwarden.providers.outcomes import Failed, NotFound, Running, Succeeded
from callwarden.providers.replicate.client import ReplicatePredictionClient, ReplicateTrainingClient
from callwarden.providers.replicate.webhook import verify_replicate
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.transport import RetryPolicy
from tests.support import poll_until_done

VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
POLICY = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05, timeout_s=5)


class FakeSleep:
    """Records requested delays; never really sleeps."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def sleep() -> FakeSleep:
    return FakeSleep()


def _endpoint(sim: RunningSimulator, key: str | None = None) -> Endpoint:
    ep = sim.settings.replicate
    return ep if key is None else Endpoint(base_url=ep.base_url, api_key=key)


@pytest.fixture
def predictions(sim: RunningSimulator, http: aiohttp.ClientSession,
                sleep: FakeSleep) -> ReplicatePredictionClient:
    return ReplicatePredictionClient(http, _endpoint(sim), "replicate-prediction", POLICY,
                                     sleep)


@pytest.fixture
def trainings(sim: RunningSimulator, http: aiohttp.ClientSession,
              sleep: FakeSleep) -> ReplicateTrainingClient:
    return ReplicateTrainingClient(http, _endpoint(sim), "replicate-training", POLICY, sleep)


def _request(**sim_script: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {"prompt": "a lighthouse"}
    if sim_script:
        inputs["_sim"] = sim_script
    return {"version": VERSION, "input": inputs}


async def _run(client: ReplicatePredictionClient | ReplicateTrainingClient,
               task_id: str) -> Any:
    return await poll_until_done(client.poll, task_id, interval_s=2, budget_s=60)


async def test_prediction_succeeds_with_fetchable_output(
    sim: RunningSimulator, http: aiohttp.ClientSession, predictions: ReplicatePredictionClient,
) -> None:
    task_id = await predictions.create(_request(media_count=2))
    seen: list[str] = []

    async def on_poll(outcome: Any) -> None:
        seen.append(getattr(outcome, "raw_state", type(outcome).__name__))

    outcome = await poll_until_done(predictions.poll, task_id, interval_s=2, budget_s=60,
                                    on_poll=on_poll)
    assert isinstance(outcome, Succeeded)
    assert seen == ["starting", "processing", "processing", "Succeeded"]
    assert len(outcome.media_urls) == 2
    assert outcome.raw["status"] == "succeeded"
    assert outcome.raw["completed_at"]
    async with http.get(outcome.media_urls[0]) as resp:
        assert resp.status == 200
        assert (await resp.read()).startswith(b"\x89PNG")


async def test_official_model_route_creates_a_prediction(
    sim: RunningSimulator, predictions: ReplicatePredictionClient,
) -> None:
    task_id = await predictions.create({"model": "black-forest-labs/flux-schnell",
                                        "input": {"prompt": "x"}})
    entry = sim.sim.journal.entries("replicate", "create")[0]
    assert entry.path == "/replicate/v1/models/black-forest-labs/flux-schnell/predictions"
    assert isinstance(await _run(predictions, task_id), Succeeded)


async def test_upstream_failure_keeps_the_error(predictions: ReplicatePredictionClient) -> None:
    task_id = await predictions.create(_request(end="failed", error="NSFW content detected"))
    outcome = await _run(predictions, task_id)
    assert isinstance(outcome, Failed)
    assert (outcome.error, outcome.code) == ("NSFW content detected", "failed")


async def test_unknown_and_vanished_ids_are_not_found(
    predictions: ReplicatePredictionClient,
) -> None:
    assert isinstance(await predictions.poll("zzzzzzzzzzzzzzzzzzzzzzzzzz"), NotFound)
    task_id = await predictions.create(_request(steps=[], end="vanished"))
    assert isinstance(await predictions.poll(task_id), NotFound)


async def test_rate_limited_poll_honours_retry_after_then_succeeds(
    sim: RunningSimulator, predictions: ReplicatePredictionClient, sleep: FakeSleep,
) -> None:
    task_id = await predictions.create(_request())
    sim.sim.faults.arm("replicate", "poll", Fault(kind="rate_limit", retry_after=3))
    outcome = await predictions.poll(task_id)
    assert outcome == Running(raw_state="starting")
    assert sleep.calls
    assert sleep.calls[0] >= 3
    assert sim.sim.journal.count("replicate", "poll") == 2


async def test_rate_limited_create_is_retried_once_and_creates_one_task(
    sim: RunningSimulator, predictions: ReplicatePredictionClient,
) -> None:
    sim.sim.faults.arm("replicate", "create", Fault(kind="rate_limit", retry_after=1))
    await predictions.create(_request())
    assert sim.sim.journal.count("replicate", "create") == 2
    assert len(sim.sim.tasks.all("replicate")) == 1


async def test_5xx_poll_is_retried_but_5xx_create_is_not(
    sim: RunningSimulator, predictions: ReplicatePredictionClient,
) -> None:
    task_id = await predictions.create(_request())
    sim.sim.faults.arm("replicate", "poll", Fault(kind="http_status", status=503))
    assert isinstance(await predictions.poll(task_id), Running)
    sim.sim.faults.arm("replicate", "create", Fault(kind="http_status", status=500))
    with pytest.raises(TransientError, match="HTTP 500"):
        await predictions.create(_request())
    assert sim.sim.journal.count("replicate", "create") == 2


async def test_malformed_json_is_a_typed_error(
    sim: RunningSimulator, predictions: ReplicatePredictionClient,
) -> None:
    task_id = await predictions.create(_request())
    sim.sim.faults.arm("replicate", "poll", Fault(kind="malformed_json"))
    with pytest.raises(MalformedResponse, match="invalid JSON"):
        await predictions.poll(task_id)


async def test_hanging_poll_times_out(
    sim: RunningSimulator, http: aiohttp.ClientSession, sleep: FakeSleep,
) -> None:
    policy = RetryPolicy(max_attempts=1, timeout_s=0.2)
    client = ReplicatePredictionClient(http, _endpoint(sim), "replicate-prediction", policy,
                                       sleep)
    task_id = await client.create(_request())
    sim.sim.faults.arm("replicate", "poll", Fault(kind="hang", hang_s=3))
    with pytest.raises(ProviderTimeout):
        await client.poll(task_id)


async def test_output_is_removed_after_one_hour_of_sim_time(
    sim: RunningSimulator, http: aiohttp.ClientSession, predictions: ReplicatePredictionClient,
) -> None:
    task_id = await predictions.create(_request())
    outcome = await _run(predictions, task_id)
    assert isinstance(outcome, Succeeded)
    sim.sim.clock.advance(3601)
    with pytest.raises(MediaExpired):
        await predictions.poll(task_id)
    async with http.get(outcome.media_urls[0]) as resp:
        assert resp.status == 404


async def test_resume_after_crash_never_posts_a_create(
    sim: RunningSimulator, http: aiohttp.ClientSession, sleep: FakeSleep,
) -> None:
    first = ReplicatePredictionClient(http, _endpoint(sim), "replicate-prediction", POLICY,
                                      sleep)
    task_id = await first.create(_request())
    await first.poll(task_id)
    fresh = ReplicatePredictionClient(http, _endpoint(sim), "replicate-prediction", POLICY,
                                      sleep)
    assert isinstance(await _run(fresh, task_id), Succeeded)
    methods = {(e.method, e.route) for e in sim.sim.journal.entries("replicate")}
    assert sim.sim.journal.count("replicate", "create") == 1
    assert methods == {("POST", "create"), ("GET", "poll")}


async def test_wrong_token_is_unauthenticated(
    sim: RunningSimulator, http: aiohttp.ClientSession,
) -> None:
    client = ReplicatePredictionClient(http, _endpoint(sim, "wrong"), "replicate-prediction",
                                       POLICY)
    with pytest.raises(AuthenticationError) as info:
        await client.create(_request())
    assert info.value.message == "You did not pass a valid authentication token"
    assert sim.sim.tasks.all("replicate") == []


async def test_training_succeeds_with_weights_and_quirky_create_urls(
    sim: RunningSimulator, trainings: ReplicateTrainingClient,
) -> None:
    request = {"model": "ostris/flux-dev-lora-trainer", "version": VERSION,
               "destination": "me/my-lora", "input": {"steps": 100}}
    task_id = await trainings.create(request)
    outcome = await _run(trainings, task_id)
    assert isinstance(outcome, Succeeded)
    assert outcome.media_urls == (outcome.raw["output"]["weights"],)
    assert outcome.raw["output"]["version"].startswith("me/my-lora:")
    assert outcome.raw["urls"]["get"].endswith(f"/v1/trainings/{task_id}")
    created = sim.sim.journal.entries("replicate", "create_training")
    assert len(created) == 1


async def test_training_to_missing_destination_is_a_bad_request(
    trainings: ReplicateTrainingClient,
) -> None:
    request = {"model": "o/n", "version": VERSION, "destination": "me/nonexistent-model",
               "input": {}}
    with pytest.raises(BadRequest, match="The specified training destination does not exist"):
        await trainings.create(request)


async def test_prefer_wait_returns_the_finished_output_still_processing(
    sim: RunningSimulator, http: aiohttp.ClientSession, predictions: ReplicatePredictionClient,
) -> None:
    """Live sync answers say ``processing`` with the output complete (files as data: URIs);
    the prediction itself has succeeded, as the next GET shows."""
    headers = {"Authorization": "Bearer sim-key", "Prefer": "wait=5"}
    async with http.post(sim.url("replicate", "/v1/predictions"), headers=headers,
                         json=_request()) as resp:
        body = await resp.json()
        assert resp.status == 201
        assert resp.headers["Preference-Applied"] == "wait=5"
    assert body["status"] == "processing"
    assert body["output"].startswith("data:image/png;base64,")
    assert body["urls"]["get"].endswith(f"/v1/predictions/{body['id']}")
    assert isinstance(await predictions.poll(body["id"]), Succeeded)


# --- webhooks ------------------------------------------------------------------------------

@pytest.fixture
async def hook() -> AsyncIterator[tuple[str, list[web.Request], list[int]]]:
    """A receiver URL, the (read) requests it got, and statuses to answer (then 200)."""
    got: list[web.Request] = []
    statuses: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        got.append(request)
        return web.Response(status=statuses.pop(0) if statuses else 200)

    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/hook", got, statuses
    await runner.cleanup()


async def _secret(sim: RunningSimulator, http: aiohttp.ClientSession) -> str:
    async with http.get(sim.url("replicate", "/v1/webhooks/default/secret"),
                        headers={"Authorization": "Bearer sim-key"}) as resp:
        key: str = (await resp.json())["key"]
    return key


async def test_signed_webhooks_honour_filter_and_retry_only_terminal(
    sim: RunningSimulator, http: aiohttp.ClientSession, predictions: ReplicatePredictionClient,
    hook: tuple[str, list[web.Request], list[int]],
) -> None:
    url, got, statuses = hook
    statuses.extend([500, 500, 500])  # start is lost (never retried); completed retried twice
    request = {**_request(), "webhook_events_filter": ["start", "completed"]}
    await predictions.create(request, callback_url=url)
    for attempts, delay in ((2, 5), (3, 15)):  # retries wait on the sim clock (5 s, 15 s)
        await sim.sim.webhooks.wait_for(attempts, outcome="rejected")
        sim.sim.clock.advance(delay)
    await sim.sim.webhooks.wait_for(1, outcome="delivered")
    await sim.sim.webhooks.drain()
    secret = await _secret(sim, http)
    bodies = [await r.json() for r in got]
    assert [b["status"] for b in bodies] == ["starting", "succeeded", "succeeded", "succeeded"]
    terminal_ids = {r.headers["webhook-id"] for r in got[1:]}
    assert len(terminal_ids) == 1
    assert got[0].headers["webhook-id"] not in terminal_ids
    now = sim.sim.clock.now()
    for r in got:
        verify_replicate(secret, r.headers, await r.read(), now=now)
    assert sim.sim.journal.count("replicate", "create") == 1


async def test_default_filter_skips_start_and_sends_completion(
    sim: RunningSimulator, predictions: ReplicatePredictionClient,
    hook: tuple[str, list[web.Request], list[int]],
) -> None:
    url, got, _ = hook
    await predictions.create(_request(end="failed", error="boom"), callback_url=url)
    await sim.sim.webhooks.wait_for(1, outcome="delivered")
    await sim.sim.webhooks.drain()
    assert [(await r.json())["status"] for r in got] == ["failed"]
