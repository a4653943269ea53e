"""The real Anthropic client against the simulator: success, refusal, upstream errors,
rate limit then success, 5xx, malformed JSON, timeout, and the header checks."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from callwarden.providers.anthropic.client import AnthropicClient, anthropic_client_for
from callwarden.providers.base import Endpoint
from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    MalformedResponse,
    ProviderTimeout,
    RateLimited,
    TransientError,
)
from callwarden.providers.outcomes import Failed, Succeeded
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.transport import RetryPolicy

POLICY = RetryPolicy(timeout_s=5.0, base_delay_s=0.01)
REQUEST: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 64,
                           "system": "Be brief.",
                           "messages": [{"role": "user", "content": "Say hello"}]}


class FakeSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def client(rs: RunningSimulator, http: aiohttp.ClientSession, *,
           sleep: FakeSleep | None = None, policy: RetryPolicy = POLICY,
           api_key: str | None = None) -> AnthropicClient:
    ep = rs.settings.anthropic
    if api_key is not None:
        ep = Endpoint(base_url=ep.base_url, api_key=api_key)
    return anthropic_client_for("anthropic-sync", http, ep, policy=policy,
                                sleep=sleep or FakeSleep())


async def test_message_text_and_usage(sim: RunningSimulator,
                                      http: aiohttp.ClientSession) -> None:
    outcome = await client(sim, http).call(REQUEST)
    assert isinstance(outcome, Succeeded)
    assert outcome.text == "Simulated reply to: Say hello"
    assert outcome.raw["usage"]["output_tokens"] > 0
    (entry,) = sim.sim.journal.entries("anthropic", "call")
    assert entry.headers["anthropic-version"] == "2023-06-01"
    assert entry.json() == REQUEST


async def test_refusal_is_failed(sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    outcome = await client(sim, http).call(
        {**REQUEST, "_sim": {"end": "failed", "error_code": "refusal"}})
    assert isinstance(outcome, Failed)
    assert outcome.code == "refusal"


async def test_overloaded_is_transient_with_request_id(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    with pytest.raises(TransientError) as info:
        await client(sim, http).call({**REQUEST, "_sim": {
            "end": "failed", "error_code": "overloaded_error", "error": "Overloaded"}})
    assert (info.value.status, info.value.code) == (529, "overloaded_error")
    assert "Overloaded" in info.value.message
    assert "req_" in info.value.message
    assert sim.sim.journal.count("anthropic", "call") == 1


async def test_unknown_model_is_a_bad_request_not_a_task(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    with pytest.raises(BadRequest) as info:
        await client(sim, http).call({**REQUEST, "_sim": {"end": "vanished"}})
    assert (info.value.status, info.value.code) == (404, "not_found_error")


async def test_rate_limited_then_succeeds_after_retry_after(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    # The API sends ``retry-after`` in seconds on a 429; ``retry-after-ms`` is read by the
    # SDK but was never seen from the API, so the simulator does not send it.
    sim.sim.faults.arm("anthropic", "call", Fault(kind="rate_limit", retry_after=3))
    sleep = FakeSleep()
    outcome = await client(sim, http, sleep=sleep).call(REQUEST)
    assert isinstance(outcome, Succeeded)
    assert sleep.delays == [3.0]
    assert sim.sim.journal.count("anthropic", "call") == 2


async def test_rate_limit_exhausted_is_rate_limited(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("anthropic", "call", Fault(kind="rate_limit", times=10))
    with pytest.raises(RateLimited) as info:
        await client(sim, http).call(REQUEST)
    assert info.value.code == "rate_limit_error"
    assert info.value.retry_after is not None


@pytest.mark.parametrize(("status", "etype"), [(500, "api_error"), (504, "timeout_error")])
async def test_5xx_is_transient_and_not_resent(sim: RunningSimulator,
                                               http: aiohttp.ClientSession,
                                               status: int, etype: str) -> None:
    sim.sim.faults.arm("anthropic", "call", Fault(kind="http_status", status=status))
    with pytest.raises(TransientError) as info:
        await client(sim, http).call(REQUEST)
    assert info.value.code == etype
    assert sim.sim.journal.count("anthropic", "call") == 1


async def test_malformed_json_is_a_typed_error(sim: RunningSimulator,
                                               http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm("anthropic", "call", Fault(kind="malformed_json"))
    with pytest.raises(MalformedResponse):
        await client(sim, http).call(REQUEST)


async def test_hang_times_out(sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    policy = RetryPolicy(timeout_s=0.2, max_attempts=1)
    with pytest.raises(ProviderTimeout):
        await client(sim, http, policy=policy).call({**REQUEST, "_sim": {"hang_s": 5}})


async def test_wrong_key_is_an_authentication_error(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    with pytest.raises(AuthenticationError) as info:
        await client(sim, http, api_key="wrong").call(REQUEST)
    assert info.value.code == "authentication_error"


async def test_missing_version_header_is_refused_with_the_envelope(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    url = sim.url("anthropic", "/v1/messages")
    async with http.post(url, json=REQUEST, headers={"x-api-key": sim.sim.api_key}) as resp:
        body = await resp.json()
        assert resp.status == 400
        assert resp.headers["request-id"] == body["request_id"]
        assert body["error"]["type"] == "invalid_request_error"
