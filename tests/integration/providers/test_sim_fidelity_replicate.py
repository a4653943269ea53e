"""The Replicate simulator against the recorded shapes, field by field.

Each test drives the simulator over HTTP into the state of one or more fixtures in
``tests/fixtures/providers/replicate``. It then asserts that the simulated body has a shape
the live API sends: ``diff(shape_of(<the recorded variants>), body) == []``, with
``$.input`` opaque because it echoes the request. :data:`COVERAGE` classifies every fixture
of the folder. A new fixture fails :func:`test_every_fixture_is_classified` until it is
compared here or given a reason why it cannot be.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from callwarden.providers.errors import SignatureError
from callwarden.providers.replicate.webhook import replicate_sign, verify_replicate
from callwarden.providers.simulator.core import Delivery, Fault, RunningSimulator
from callwarden.providers.simulator.replicate import RETRY_SCHEDULE_S
from tests.recorded import FIXTURES, load, vectors
from tests.shapes import Shape, diff, shape_of

PROVIDER = "replicate"
AUTH = {"Authorization": "Bearer sim-key"}
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
OPAQUE = ("$.input",)  # the request's input, echoed
ID = re.compile(r"^[a-z0-9]{26}$")
LONG = 600  # simulated seconds: a step that outlasts the test
TOKENS = ["\n\n", "Fuzzy", ", gentle", " soul\n", ""]

CREATE = ("create_response", "create_response_official_model", "create_response_stream")
SUCCEEDED = ("prediction_succeeded_image", "prediction_succeeded_image_legacy_serializer",
             "prediction_succeeded_string_output", "prediction_succeeded_text_tokens",
             "webhook_completed")  # docs: the webhook body is the object GET returns


# --- the classification of every fixture ---------------------------------------------------

@dataclass(frozen=True)
class Compared:
    """Compared with the simulator's answer by ``test`` (a test in this module)."""

    test: str


@dataclass(frozen=True)
class NotComparable:
    reason: str


COVERAGE: dict[str, Compared | NotComparable] = {
    "create_response": Compared("test_create_answers_carry_only_the_recorded_keys"),
    "create_response_official_model": Compared(
        "test_create_answers_carry_only_the_recorded_keys"),
    # The simulator does not stream: this variant is merged into the create answer's shape
    # (its `stream` / `urls.stream` keys allowed, never required).
    "create_response_stream": Compared("test_create_answers_carry_only_the_recorded_keys"),
    "prediction_starting": Compared("test_a_queued_prediction_reads_as_recorded"),
    "prediction_processing": Compared("test_a_running_prediction_reads_as_recorded"),
    "prediction_succeeded_image": Compared("test_a_succeeded_prediction_reads_as_recorded"),
    "prediction_succeeded_image_legacy_serializer": Compared(
        "test_a_succeeded_prediction_reads_as_recorded"),
    "prediction_succeeded_string_output": Compared(
        "test_a_succeeded_prediction_reads_as_recorded"),
    "prediction_succeeded_text_tokens": Compared(
        "test_a_succeeded_prediction_reads_as_recorded"),
    "prediction_succeeded_image_string": Compared(
        "test_a_single_file_output_is_one_url_string_as_recorded"),
    "prediction_failed": Compared("test_a_failed_prediction_reads_as_recorded"),
    "prediction_canceled": Compared("test_a_canceled_prediction_reads_as_recorded"),
    "prediction_aborted": Compared("test_a_deadline_before_the_start_aborts_the_prediction"),
    "prediction_data_removed": Compared("test_an_output_past_its_hour_is_removed_as_documented"),
    "prediction_sync_data_uri": Compared(
        "test_a_finished_sync_run_reports_processing_with_data_uris"),
    "prediction_sync_text_tokens": Compared(
        "test_a_finished_sync_run_of_a_language_model_reports_its_tokens"),
    "training_create_response": Compared("test_a_training_reads_as_recorded_through_its_life"),
    "training_processing": Compared("test_a_training_reads_as_recorded_through_its_life"),
    "training_succeeded": Compared("test_a_training_reads_as_recorded_through_its_life"),
    "training_canceled": Compared("test_a_canceled_training_reads_as_recorded"),
    "error_401": Compared("test_a_wrong_token_gets_the_recorded_401"),
    "error_402": Compared("test_errors_carry_the_recorded_titles_and_texts"),
    "error_404_training_destination": Compared(
        "test_errors_carry_the_recorded_titles_and_texts"),
    "error_422_invalid_version": Compared("test_errors_carry_the_recorded_titles_and_texts"),
    "error_422_input_validation": Compared(
        "test_an_input_that_is_not_an_object_fails_validation_as_recorded"),
    "error_429": Compared("test_throttling_answers_the_documented_body_without_retry_after"),
    "error_429_low_credit": Compared(
        "test_throttling_in_body_answers_the_live_low_credit_body"),
    "webhook_start": Compared("test_webhook_bodies_are_the_documented_objects"),
    "webhook_completed": Compared("test_webhook_bodies_are_the_documented_objects"),
    "signature_vectors": Compared("test_webhook_signatures_follow_the_official_vectors"),
}


def test_every_fixture_is_classified() -> None:
    files = {p.stem for p in (FIXTURES / PROVIDER).glob("*.json")}
    assert set(COVERAGE) == files
    tests = {name for name, value in globals().items()
             if name.startswith("test_") and callable(value)}
    named = {c.test for c in COVERAGE.values() if isinstance(c, Compared)}
    assert named <= tests, named - tests
    assert all(c.reason for c in COVERAGE.values() if isinstance(c, NotComparable))


# --- helpers -------------------------------------------------------------------------------

def recorded(*names: str) -> Shape:
    return shape_of(*(load(PROVIDER, name).body for name in names))


def departures(names: Sequence[str], body: Any) -> list[str]:
    return diff(recorded(*names), body, opaque=OPAQUE)


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: Any


async def call(http: aiohttp.ClientSession, method: str, url: str, *,
               headers: Mapping[str, str] | None = None,
               json: Mapping[str, Any] | None = None) -> Answer:
    async with http.request(method, url, headers={**AUTH, **(headers or {})},
                            json=json) as resp:
        return Answer(resp.status, resp.headers, await resp.json(content_type=None))


def prediction(script: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {"prompt": "a lighthouse"}
    if script is not None:
        inputs["_sim"] = script
    return {"version": VERSION, "input": inputs, **extra}


def running(**script: Any) -> dict[str, Any]:
    return {"steps": [{"phase": "running", "seconds": LONG}], "end": "stuck", **script}


def queued(**script: Any) -> dict[str, Any]:
    return {"steps": [{"phase": "queued", "seconds": LONG}], **script}


def done(**script: Any) -> dict[str, Any]:
    return {"steps": [], **script}


async def create(sim: RunningSimulator, http: aiohttp.ClientSession,
                 body: Mapping[str, Any], *, path: str = "/v1/predictions",
                 headers: Mapping[str, str] | None = None) -> Answer:
    answer = await call(http, "POST", sim.url(PROVIDER, path), headers=headers, json=body)
    assert answer.status == 201, answer.body
    return answer


async def get(sim: RunningSimulator, http: aiohttp.ClientSession, task_id: str,
              collection: str = "predictions") -> Any:
    answer = await call(http, "GET", sim.url(PROVIDER, f"/v1/{collection}/{task_id}"))
    assert answer.status == 200, answer.body
    return answer.body


async def cancel(sim: RunningSimulator, http: aiohttp.ClientSession, task_id: str,
                 collection: str = "predictions") -> Any:
    answer = await call(http, "POST",
                        sim.url(PROVIDER, f"/v1/{collection}/{task_id}/cancel"))
    assert answer.status == 200, answer.body
    return answer.body


# --- predictions ---------------------------------------------------------------------------

async def test_create_answers_carry_only_the_recorded_keys(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    by_version = await create(sim, http, prediction(done()))
    by_model = await create(sim, http, {"input": {"prompt": "x", "_sim": done()}},
                            path="/v1/models/black-forest-labs/flux-schnell/predictions")
    for answer in (by_version, by_model):
        assert departures(CREATE, answer.body) == []
        assert answer.body["status"] == "starting"  # even when the script is already done
        assert ID.match(answer.body["id"])
        assert answer.headers["Content-Type"].startswith("application/json")
    assert by_model.body["version"] == "hidden"


async def test_a_queued_prediction_reads_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = (await create(sim, http, prediction(queued()))).body["id"]
    body = await get(sim, http, task_id)
    assert body["status"] == "starting"
    assert departures(["prediction_starting"], body) == []


async def test_a_running_prediction_reads_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = (await create(sim, http, prediction(running()))).body["id"]
    body = await get(sim, http, task_id)
    assert body["status"] == "processing"
    assert departures(["prediction_processing"], body) == []


@pytest.mark.parametrize(("script", "expected"), [
    ({"media_count": 2}, None),
    ({"output": "hello Alice"}, "hello Alice"),
    ({"output": TOKENS}, TOKENS),
    ({"output": ["data:text/plain;base64,aGk="]}, ["data:text/plain;base64,aGk="]),
], ids=["media-list", "string", "tokens", "data-uri"])
async def test_a_succeeded_prediction_reads_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession, script: dict[str, Any],
        expected: Any) -> None:
    task_id = (await create(sim, http, prediction(done(**script)))).body["id"]
    body = await get(sim, http, task_id)
    assert body["status"] == "succeeded"
    assert departures(SUCCEEDED, body) == []
    if expected is None:
        assert len(body["output"]) == 2
    else:
        assert body["output"] == expected


async def test_a_single_file_output_is_one_url_string_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """The 2026 quote was cut after ``error``: only the keys it shows are compared."""
    task_id = (await create(sim, http, prediction(done()))).body["id"]
    body = await get(sim, http, task_id)
    shown = load(PROVIDER, "prediction_succeeded_image_string").body
    assert isinstance(body["output"], str)
    assert departures(["prediction_succeeded_image_string"],
                      {k: v for k, v in body.items() if k in shown}) == []


async def test_a_failed_prediction_reads_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    error = "Prediction interrupted; please retry (code: PA)"
    task_id = (await create(sim, http, prediction(done(end="failed", error=error)))).body["id"]
    body = await get(sim, http, task_id)
    assert (body["status"], body["error"]) == ("failed", error)
    assert departures(["prediction_failed"], body) == []


async def test_a_canceled_prediction_reads_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = (await create(sim, http, prediction(running()))).body["id"]
    await get(sim, http, task_id)  # seen running: it has started
    answer = await cancel(sim, http, task_id)
    later = await get(sim, http, task_id)
    for body in (answer, later):
        assert body["status"] == "canceled"
        assert departures(["prediction_canceled"], body) == []


async def test_a_deadline_before_the_start_aborts_the_prediction(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    created = await create(sim, http, prediction(queued()), headers={"Cancel-After": "30s"})
    task_id = created.body["id"]
    assert (await get(sim, http, task_id))["status"] == "starting"
    sim.sim.clock.advance(31)
    body = await get(sim, http, task_id)
    assert body["status"] == "aborted"
    assert body["completed_at"] == body["deadline"]
    assert departures(["prediction_aborted"], body) == []


async def test_a_deadline_while_running_cancels_the_prediction(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    created = await create(sim, http, prediction(running()), headers={"Cancel-After": "1m"})
    task_id = created.body["id"]
    assert (await get(sim, http, task_id))["status"] == "processing"
    sim.sim.clock.advance(61)
    body = await get(sim, http, task_id)
    assert body["status"] == "canceled"
    assert isinstance(body.pop("deadline"), str)  # documented field (changelog, index.d.ts)
    assert departures(["prediction_canceled"], body) == []


async def test_an_output_past_its_hour_is_removed_as_documented(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = (await create(sim, http, prediction(done()))).body["id"]
    assert (await get(sim, http, task_id))["data_removed"] is False
    sim.sim.clock.advance(3601)
    body = await get(sim, http, task_id)
    assert (body["data_removed"], body["output"], body["input"]) == (True, None, {})
    assert departures(["prediction_data_removed"], body) == []


# --- sync mode (Prefer: wait) --------------------------------------------------------------

async def test_a_finished_sync_run_reports_processing_with_data_uris(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await create(sim, http, prediction({"media_count": 2}),
                          headers={"Prefer": "wait=10"})
    body = answer.body
    assert answer.headers["Preference-Applied"] == "wait=10"
    assert body["status"] == "processing"
    assert departures(["prediction_sync_data_uri"], body) == []
    head, _, data = body["output"][0].partition(",")
    assert head == "data:image/png;base64"
    later = await get(sim, http, body["id"])
    assert later["status"] == "succeeded"
    async with http.get(later["output"][0]) as resp:  # the same file, by URL
        assert await resp.read() == base64.b64decode(data)


async def test_a_finished_sync_run_of_a_language_model_reports_its_tokens(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await create(sim, http, {"input": {"prompt": "x", "_sim": {"output": TOKENS}}},
                          path="/v1/models/meta/meta-llama-3-8b-instruct/predictions",
                          headers={"Prefer": "wait"})
    assert answer.headers["Preference-Applied"] == "wait"  # the token, verbatim
    assert (answer.body["status"], answer.body["output"]) == ("processing", TOKENS)
    assert departures(["prediction_sync_text_tokens"], answer.body) == []


async def test_a_sync_wait_that_runs_out_answers_starting(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await create(sim, http, prediction(running()), headers={"Prefer": "wait=1"})
    assert answer.headers["Preference-Applied"] == "wait=1"
    assert (answer.body["status"], answer.body["output"]) == ("starting", None)


# --- trainings -----------------------------------------------------------------------------

def training(script: Mapping[str, Any]) -> dict[str, Any]:
    return {"destination": "me/my-lora", "input": {"steps": 100, "_sim": script}}


TRAINING_PATH = f"/v1/models/ostris/flux-dev-lora-trainer/versions/{VERSION}/trainings"


async def test_a_training_reads_as_recorded_through_its_life(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    steps = [{"phase": "running", "seconds": 60}]
    created = (await create(sim, http, training({"steps": steps}), path=TRAINING_PATH)).body
    assert departures(["training_create_response"], created) == []
    assert created["urls"]["get"].endswith(f"/v1/predictions/{created['id']}")
    running_body = await get(sim, http, created["id"], "trainings")
    assert running_body["status"] == "processing"
    assert departures(["training_processing"], running_body) == []
    sim.sim.clock.advance(61)
    finished = await get(sim, http, created["id"], "trainings")
    assert finished["status"] == "succeeded"
    assert finished["output"]["version"].startswith("me/my-lora:")
    assert departures(["training_succeeded"], finished) == []


async def test_a_canceled_training_reads_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    task_id = (await create(sim, http, training(running()), path=TRAINING_PATH)).body["id"]
    await get(sim, http, task_id, "trainings")
    body = await cancel(sim, http, task_id, "trainings")
    assert body["status"] == "canceled"
    assert body["urls"]["get"].endswith(f"/v1/predictions/{task_id}")  # recorded quirk
    assert departures(["training_canceled"], body) == []


# --- errors --------------------------------------------------------------------------------

async def test_a_wrong_token_gets_the_recorded_401(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await call(http, "POST", sim.url(PROVIDER, "/v1/predictions"),
                        headers={"Authorization": "Bearer wrong"}, json=prediction())
    fixture = load(PROVIDER, "error_401")
    assert (answer.status, answer.body) == (401, fixture.body)
    assert answer.headers["Content-Type"] == fixture.headers["content-type"]


async def test_errors_carry_the_recorded_titles_and_texts(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    url = sim.url(PROVIDER, "/v1/predictions")
    sim.sim.faults.arm(PROVIDER, "create", Fault(kind="http_status", status=402))
    answers = {
        "error_402": await call(http, "POST", url, json=prediction()),
        "error_404_training_destination": await call(
            http, "POST", sim.url(PROVIDER, TRAINING_PATH),
            json={"destination": "me/nonexistent-model", "input": {}}),
        "error_422_invalid_version": await call(
            http, "POST", url, json={"version": "owner/name:latest", "input": {}}),
    }
    for name, answer in answers.items():
        fixture = load(PROVIDER, name)
        assert (answer.status, answer.body) == (fixture.status, fixture.body), name
        assert answer.headers["Content-Type"] == fixture.headers["content-type"], name
        assert "Retry-After" not in answer.headers
    assert sim.sim.tasks.all(PROVIDER) == []


async def test_an_input_that_is_not_an_object_fails_validation_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await call(http, "POST", sim.url(PROVIDER, "/v1/predictions"),
                        json={"version": VERSION, "input": "a lighthouse"})
    assert answer.status == 422
    assert answer.body["title"] == "Input validation failed"
    assert answer.body["detail"].startswith("- input: ")
    assert departures(["error_422_input_validation"], answer.body) == []


async def test_throttling_answers_the_documented_body_without_retry_after(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm(PROVIDER, "poll", Fault(kind="rate_limit", retry_after=3, times=2))
    sim.sim.faults.arm(PROVIDER, "create", Fault(kind="rate_limit"))
    throttled_create = await call(http, "POST", sim.url(PROVIDER, "/v1/predictions"),
                                  json=prediction())
    throttled_poll = await call(http, "GET", sim.url(PROVIDER, "/v1/predictions/anything"))
    assert throttled_create.body == load(PROVIDER, "error_429").body  # "in 1 second."
    assert throttled_poll.body == {
        "detail": "Request was throttled. Expected available in 3 seconds."}
    for answer in (throttled_create, throttled_poll):
        assert answer.status == 429
        assert "Retry-After" not in answer.headers
        assert departures(["error_429"], answer.body) == []


async def test_throttling_in_body_answers_the_live_low_credit_body(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm(PROVIDER, "create", Fault(kind="rate_limit_in_body", retry_after=5))
    answer = await call(http, "POST", sim.url(PROVIDER, "/v1/predictions"), json=prediction())
    assert answer.status == 429
    assert answer.body == load(PROVIDER, "error_429_low_credit").body
    assert "Retry-After" not in answer.headers
    assert departures(["error_429_low_credit"], answer.body) == []


# --- webhooks ------------------------------------------------------------------------------

def secret_of(sim: RunningSimulator) -> str:
    return sim.sim.webhook_secrets[PROVIDER]


def body_of(delivery: Delivery) -> Any:
    return msgspec.json.decode(delivery.body)


async def test_webhook_bodies_are_the_documented_objects(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    script = done(media_count=2, webhook={"drop": True})
    await create(sim, http, prediction(script, webhook="http://127.0.0.1:9/hook",
                                       webhook_events_filter=["start", "completed"]))
    start, completed = await sim.sim.webhooks.wait_for(2, outcome="dropped")
    assert body_of(start)["status"] == "starting"
    assert departures(["webhook_start"], body_of(start)) == []
    assert body_of(completed)["status"] == "succeeded"
    assert departures(["webhook_completed"], body_of(completed)) == []
    now = sim.sim.clock.now()
    for d in (start, completed):
        assert set(load(PROVIDER, "webhook_completed").headers) <= {
            k.lower() for k in d.headers}
        verify_replicate(secret_of(sim), d.headers, d.body, now=now)
    assert start.headers["webhook-id"] != completed.headers["webhook-id"]


@pytest.fixture
async def refusing_receiver() -> AsyncIterator[tuple[str, list[int]]]:
    """A webhook URL that answers 500 to everything, and the count of requests it got."""
    got: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        got.append(1)
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/hook", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/hook", got
    await runner.cleanup()


async def test_a_refused_terminal_webhook_is_retried_on_the_backoff_with_its_id(
        sim: RunningSimulator, http: aiohttp.ClientSession,
        refusing_receiver: tuple[str, list[int]]) -> None:
    url, got = refusing_receiver
    await create(sim, http, prediction(done(), webhook=url,
                                       webhook_events_filter=["start", "completed"]))
    await sim.sim.webhooks.wait_for(2, outcome="rejected")  # start, then completed
    for n, delay in enumerate(RETRY_SCHEDULE_S, start=3):
        sim.sim.clock.advance(delay)
        await sim.sim.webhooks.wait_for(n, outcome="rejected")
    await sim.sim.webhooks.drain()
    start, *terminal = sim.sim.webhooks.deliveries
    assert body_of(start)["status"] == "starting"
    assert start.attempt == 1  # an intermediate event is never retried
    assert [d.attempt for d in terminal] == [1, 2, 3, 4]
    assert len(got) == 5
    assert {d.headers["webhook-id"] for d in terminal} == {terminal[0].headers["webhook-id"]}
    # What the docs say (the schedule above only drives the clock): an exponential backoff,
    # the last retry about a minute after completion, each attempt signed afresh.
    stamps = [int(d.headers["webhook-timestamp"]) for d in terminal]
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    assert all(later > earlier for earlier, later in itertools.pairwise(gaps)), gaps
    assert 45 <= stamps[-1] - stamps[0] <= 120, stamps
    for d in terminal:  # each signed at the moment of its own attempt (the Svix scheme)
        assert svix_signature(secret_of(sim), d) in d.headers["webhook-signature"].split()
        assert abs(int(d.headers["webhook-timestamp"]) - d.at) <= 2
    assert len({d.headers["webhook-signature"] for d in terminal}) == 4


def svix_signature(secret: str, d: Delivery) -> str:
    """``v1,<base64 HMAC-SHA256(base64-decoded secret, "id.timestamp.body")>``, written
    from Replicate's verify-webhook docs, independently of
    ``callwarden.providers.replicate.webhook``."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    message = f"{d.headers['webhook-id']}.{d.headers['webhook-timestamp']}.".encode() + d.body
    return "v1," + base64.b64encode(hmac.new(key, message, hashlib.sha256).digest()).decode()


async def test_a_delivered_webhook_is_signed_as_the_docs_say(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """The simulator's own deliveries verify under an independent Svix implementation
    (itself checked against the official vector below)."""
    await create(sim, http, prediction(done(webhook={"drop": True}),
                                       webhook="http://127.0.0.1:9/hook"))
    [d] = await sim.sim.webhooks.wait_for(1)
    assert svix_signature(secret_of(sim), d) in d.headers["webhook-signature"].split()
    v = vectors(PROVIDER)["vectors"][0]
    official = Delivery(url="", status=None, attempt=1, outcome="dropped",
                        body=v["body"].encode(), at=0.0,
                        headers={"webhook-id": v["id"],
                                 "webhook-timestamp": str(v["timestamp"])})
    assert svix_signature(v["secret"], official) == v["signature"]


def test_webhook_signatures_follow_the_official_vectors() -> None:
    """Our signer reproduces the official vector, rejects the negative one, and verifies
    the documented completed webhook."""
    data = vectors(PROVIDER)
    for v in data["vectors"]:
        ts = int(v["timestamp"])
        assert replicate_sign(v["secret"], v["id"], ts, v["body"].encode()) == v["signature"]
    for v in data["negative_vectors"]:
        headers = {"webhook-id": v["id"], "webhook-timestamp": v["timestamp"],
                   "webhook-signature": v["signature"]}
        with pytest.raises(SignatureError):
            verify_replicate(v["secret"], headers, v["body"].encode(), now=int(v["timestamp"]))
    hook = load(PROVIDER, "webhook_completed")
    raw = json.dumps(hook.body, separators=(",", ":"), ensure_ascii=False).encode()
    verify_replicate(data["vectors"][0]["secret"], hook.headers, raw,
                     now=int(hook.headers["webhook-timestamp"]))
