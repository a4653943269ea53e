"""The real ElevenLabs clients against the simulator: dubbing (create/poll/resume and the
result audio) and every sync operation, through success, failure, not-found, rate limit,
5xx, malformed JSON and timeout."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from callwarden.providers.base import Endpoint
from callwarden.providers.elevenlabs.client import (
    ElevenLabsDubbingClient,
    ElevenLabsSyncClient,
    elevenlabs_client_for,
)
from callwarden.providers.elevenlabs.operations import media_auth_headers
from callwarden.providers.elevenlabs.wire import classify_elevenlabs
from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    ProviderTimeout,
    RateLimited,
    TransientError,
)
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome, Running, Succeeded
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.simulator.elevenlabs import CHARACTER_COST
from callwarden.providers.transport import RetryPolicy, send
from tests.support import poll_until_done

POLICY = RetryPolicy(timeout_s=5.0, base_delay_s=0.01)
DUB = {"file": b"\x00\x00\x00\x18ftypmp42video", "target_lang": "es", "name": "clip"}


class FakeSleep:
    """Records requested delays and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def dubbing(rs: RunningSimulator, http: aiohttp.ClientSession, sleep: FakeSleep | None = None,
            api_key: str | None = None) -> ElevenLabsDubbingClient:
    ep = rs.settings.elevenlabs
    if api_key is not None:
        ep = Endpoint(base_url=ep.base_url, api_key=api_key)
    client = elevenlabs_client_for("elevenlabs-async", http, ep, policy=POLICY,
                                   sleep=sleep or FakeSleep())
    assert isinstance(client, ElevenLabsDubbingClient)
    return client


def sync(rs: RunningSimulator, http: aiohttp.ClientSession, sleep: FakeSleep | None = None,
         policy: RetryPolicy = POLICY) -> ElevenLabsSyncClient:
    client = elevenlabs_client_for("elevenlabs-sync", http, rs.settings.elevenlabs,
                                   policy=policy, sleep=sleep or FakeSleep())
    assert isinstance(client, ElevenLabsSyncClient)
    return client


# ------------------------------------------------------------------ dubbing

async def test_dub_progresses_to_dubbed_and_its_audio_downloads_with_the_key(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = dubbing(sim, http)
    dubbing_id = await client.create(DUB)
    seen: list[PollOutcome] = []

    async def on_poll(outcome: PollOutcome) -> None:
        seen.append(outcome)

    outcome = await poll_until_done(client.poll, dubbing_id, interval_s=1, budget_s=60,
                                    on_poll=on_poll)
    assert isinstance(outcome, Succeeded)
    assert [o.raw_state for o in seen if isinstance(o, Running)] == [
        "queued", "preparing", "dubbing"]
    (url,) = outcome.media_urls
    assert url == sim.url("elevenlabs", f"/v1/dubbing/{dubbing_id}/audio/es")
    async with http.get(url, headers=media_auth_headers(sim.settings.elevenlabs)) as resp:
        assert resp.status == 200
        # DUB's file is an MP4 video: the OpenAPI serves such a dub as video/mp4
        assert resp.content_type == "video/mp4"
        assert (await resp.read())[4:8] == b"ftyp"
    async with http.get(url) as resp:
        assert resp.status == 401


async def test_dub_audio_is_not_ready_before_dubbed(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = dubbing(sim, http)
    dubbing_id = await client.create(DUB)
    url = sim.url("elevenlabs", f"/v1/dubbing/{dubbing_id}/audio/es")
    with pytest.raises(TransientError) as info:
        await send(http, "GET", url, provider="elevenlabs", classify=classify_elevenlabs,
                   policy=RetryPolicy(max_attempts=1),
                   headers=media_auth_headers(sim.settings.elevenlabs))
    # the OpenAPI's flat 425 body: {"error": "dubbing_not_dubbed", "message": ...}
    assert (info.value.status, info.value.code) == (425, "dubbing_not_dubbed")


async def test_resume_from_the_journal_never_posts_a_second_dub(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    dubbing_id = await dubbing(sim, http).create(DUB)
    outcome = await poll_until_done(dubbing(sim, http).poll, dubbing_id, interval_s=1,
                                    budget_s=60)
    assert isinstance(outcome, Succeeded)
    assert sim.sim.journal.count("elevenlabs", "create") == 1
    assert sim.sim.journal.count("elevenlabs", "poll") == 4


async def test_resume_of_a_stuck_dub_stops_at_the_budget(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sleep = FakeSleep()
    client = dubbing(sim, http, sleep)
    dubbing_id = await client.create({**DUB, "_sim": {"end": "stuck"}})
    outcome = await poll_until_done(client.poll, dubbing_id, interval_s=5, budget_s=30,
                                    sleep=sleep)
    assert outcome == Running(raw_state="dubbing")
    assert sum(sleep.delays) <= 30


async def test_failed_dub_reports_the_upstream_error(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = dubbing(sim, http)
    dubbing_id = await client.create({**DUB, "_sim": {"end": "failed",
                                                      "error": "no speech detected"}})
    outcome = await poll_until_done(client.poll, dubbing_id, interval_s=1, budget_s=60)
    assert isinstance(outcome, Failed)
    assert outcome.error == "no speech detected"


async def test_unknown_and_vanished_dubs_are_not_found(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = dubbing(sim, http)
    assert isinstance(await client.poll("doesNotExist00000000"), NotFound)
    dubbing_id = await client.create({**DUB, "_sim": {"end": "vanished"}})
    outcome = await poll_until_done(client.poll, dubbing_id, interval_s=1, budget_s=60)
    assert isinstance(outcome, NotFound)


async def test_create_rate_limited_then_succeeds_after_retry_after(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "create", Fault(kind="rate_limit", retry_after=2))
    sleep = FakeSleep()
    dubbing_id = await dubbing(sim, http, sleep).create(DUB)
    assert sim.sim.tasks.get("elevenlabs", dubbing_id) is not None
    assert sleep.delays[:1] == [2.0]
    assert sim.sim.journal.count("elevenlabs", "create") == 2


async def test_create_5xx_is_not_resent(sim: RunningSimulator,
                                        http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "create", Fault(kind="http_status", status=503))
    with pytest.raises(TransientError) as info:
        await dubbing(sim, http).create(DUB)
    assert info.value.status == 503
    assert sim.sim.journal.count("elevenlabs", "create") == 1


async def test_poll_5xx_is_retried(sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = dubbing(sim, http)
    dubbing_id = await client.create(DUB)
    sim.sim.faults.arm("elevenlabs", "poll", Fault(kind="http_status", status=500))
    assert await client.poll(dubbing_id) == Running(raw_state="queued")
    assert sim.sim.journal.count("elevenlabs", "poll") == 2


async def test_poll_malformed_json_is_a_typed_error(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = dubbing(sim, http)
    dubbing_id = await client.create(DUB)
    sim.sim.faults.arm("elevenlabs", "poll", Fault(kind="malformed_json"))
    with pytest.raises(MalformedResponse):
        await client.poll(dubbing_id)


async def test_wrong_key_is_an_authentication_error(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    with pytest.raises(AuthenticationError) as info:
        await dubbing(sim, http, api_key="wrong").create(DUB)
    # live: code "unauthorized", legacy status "invalid_api_key" (fixture error_401)
    assert info.value.code == "unauthorized"


# ------------------------------------------------------------------ sync operations

SYNC_CASES: list[tuple[dict[str, Any], str]] = [
    ({"operation": "tts", "voice_id": "JBFqnCBsd6RMkjVDRZzb", "text": "Hello there"}, "blob"),
    ({"operation": "sfx", "text": "soft ui click", "duration_seconds": 0.5}, "blob"),
    ({"operation": "stt", "model_id": "scribe_v1", "file": b"RIFFaudio"}, "text"),
    ({"operation": "voice-clone", "name": "Me", "files": [b"a", b"b"]}, "voice_id"),
    ({"operation": "voice-design", "voice_description": "a calm narrator"}, "previews"),
    ({"operation": "forced-alignment", "file": b"RIFFaudio", "text": "hello world"}, "words"),
]


@pytest.mark.parametrize(("request_", "expect"), SYNC_CASES)
async def test_sync_operation_succeeds(sim: RunningSimulator, http: aiohttp.ClientSession,
                                       request_: dict[str, Any], expect: str) -> None:
    outcome = await sync(sim, http).call(request_)
    assert isinstance(outcome, Succeeded)
    if expect == "blob":
        assert outcome.blobs[0].content_type == "audio/mpeg"
        # the reported character-cost header, not the text's length
        assert outcome.cost == CHARACTER_COST[request_["operation"]]
    elif expect == "text":
        assert outcome.text
    elif expect == "previews":
        assert len(outcome.blobs) == len(outcome.raw["previews"]) > 0
    else:
        assert outcome.raw[expect]


async def test_sync_call_sends_multipart_files(sim: RunningSimulator,
                                               http: aiohttp.ClientSession) -> None:
    await sync(sim, http).call(SYNC_CASES[3][0])
    (entry,) = sim.sim.journal.entries("elevenlabs", "voice-clone")
    assert entry.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert entry.body.count(b'name="files"; filename=') == 2


async def test_sync_upstream_errors_keep_code_and_type(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    client = sync(sim, http)
    tts = dict(SYNC_CASES[0][0])
    with pytest.raises(InsufficientCredits) as credits:
        await client.call({**tts, "_sim": {"end": "failed", "error_code": "quota_exceeded",
                                           "error": "This request exceeds your quota."}})
    assert (credits.value.status, credits.value.code) == (401, "quota_exceeded")
    with pytest.raises(BadRequest) as bad:
        await client.call({**tts, "_sim": {"end": "failed", "error_code": "voice_not_found",
                                           "error": "A voice with that ID does not exist"}})
    assert "does not exist" in bad.value.message


async def test_sync_fastapi_validation_error_is_a_bad_request(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "tts", Fault(kind="http_status", status=422))
    with pytest.raises(BadRequest) as info:
        await sync(sim, http).call(SYNC_CASES[0][0])
    assert (info.value.status, info.value.code) == (422, "validation_error")
    assert "simulated upstream error" in info.value.message


async def test_sync_rate_limited_then_succeeds(sim: RunningSimulator,
                                               http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "tts", Fault(kind="rate_limit", retry_after=1, times=2))
    sleep = FakeSleep()
    outcome = await sync(sim, http, sleep).call(SYNC_CASES[0][0])
    assert isinstance(outcome, Succeeded)
    assert len(sleep.delays) == 2
    assert min(sleep.delays) >= 1


async def test_sync_rate_limit_exhausted_is_rate_limited(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "sfx", Fault(kind="rate_limit", times=10))
    with pytest.raises(RateLimited) as info:
        await sync(sim, http).call(SYNC_CASES[1][0])
    assert info.value.code == "rate_limit_exceeded"
    assert sim.sim.journal.count("elevenlabs", "sfx") == POLICY.max_attempts


async def test_sync_5xx_is_transient_and_not_resent(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "tts", Fault(kind="http_status", status=500))
    with pytest.raises(TransientError):
        await sync(sim, http).call(SYNC_CASES[0][0])
    assert sim.sim.journal.count("elevenlabs", "tts") == 1


async def test_sync_malformed_json_is_a_typed_error(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("elevenlabs", "stt", Fault(kind="malformed_json"))
    with pytest.raises(MalformedResponse):
        await sync(sim, http).call(SYNC_CASES[2][0])


async def test_sync_hang_times_out(sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    policy = RetryPolicy(timeout_s=0.2, max_attempts=1)
    with pytest.raises(ProviderTimeout):
        await sync(sim, http, policy=policy).call({**SYNC_CASES[0][0],
                                                   "_sim": {"hang_s": 5}})


async def test_responses_carry_concurrency_headers(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    # recorded on speech-to-text (the live sound-generation answer has none)
    url = sim.url("elevenlabs", "/v1/speech-to-text")
    form = aiohttp.FormData({"model_id": "scribe_v1"})
    form.add_field("file", b"RIFFaudio", filename="a.wav")
    async with http.post(url, data=form,
                         headers=media_auth_headers(sim.settings.elevenlabs)) as resp:
        assert resp.status == 200
        assert resp.headers["current-concurrent-requests"] == "1"
        assert int(resp.headers["maximum-concurrent-requests"]) >= 1
