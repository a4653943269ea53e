"""The Anthropic simulator against the recorded shapes, field by field, over HTTP.

Each Anthropic fixture (``tests/fixtures/providers/anthropic/``) is classified in
:data:`FIXTURE_USE`: compared (by which test, driven how) or not comparable (why). A
simulated message is compared with its stop reason's recordings merged with
:data:`ENVELOPE`, the recorded ``end_turn`` bodies of both serializer generations (older
bodies lack ``stop_details``, ``inference_geo`` and ``output_tokens_details``; the simulator
sends the newer one), and must also carry every key its own recordings always carry.
Content blocks are compared with the recorded blocks of the same ``type``. Then the real
client turns each simulated stop reason into the outcome the stop-reason policy prescribes
(``providers/llm_stop.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from callwarden.providers.anthropic.client import AnthropicClient, anthropic_client_for
from callwarden.providers.errors import InsufficientCredits
from callwarden.providers.outcomes import Failed, Succeeded
from callwarden.providers.simulator.anthropic import REFUSAL_CATEGORIES
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.transport import RetryPolicy
from tests.recorded import FIXTURES, load
from tests.shapes import diff, shape_of

PROVIDER = "anthropic"
ENVELOPE = ("message_end_turn", "message_end_turn_live_headers", "message_end_turn_thinking")
MISSING = "missing (in every recording)"
BASE58 = "[1-9A-HJ-NP-Za-km-z]"
ID_FORMATS = {  # notes row 7: base58-like, 24 characters after the prefix
    "msg": re.compile(f"^msg_01{BASE58}{{22}}$"),
    "req": re.compile(f"^req_011C{BASE58}{{20}}$"),
    "toolu": re.compile(f"^toolu_01{BASE58}{{22}}$"),
    "srvtoolu": re.compile(f"^srvtoolu_01{BASE58}{{22}}$"),
}
RFC3339_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
REQUEST: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 64,
                           "messages": [{"role": "user",
                                         "content": "What is the capital of France?"}]}
THINKING: dict[str, Any] = {"max_tokens": 2048,
                            "thinking": {"type": "enabled", "budget_tokens": 1024}}
TOOLS: dict[str, Any] = {
    "tools": [{"name": "get_user_country", "description": "The user's country.",
               "input_schema": {"type": "object", "properties": {}}}],
    "tool_choice": {"type": "any"}}
WEB_SEARCH: dict[str, Any] = {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
POLICY = RetryPolicy(timeout_s=5.0, base_delay_s=0.01)


# --- what is compared ----------------------------------------------------------------------

@dataclass(frozen=True)
class MessageCase:
    """A 200 answer: the fixtures it is compared with, the request and the script, and the
    outcome the policy prescribes (``"success"`` or the failure code)."""

    fixtures: tuple[str, ...]
    outcome: str
    request: Mapping[str, Any] = field(default_factory=dict)
    script: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {**REQUEST, **self.request, "_sim": dict(self.script)}


@dataclass(frozen=True)
class ErrorCase:
    """An error answer: its fixture and how the simulator is made to send it."""

    fixture: str
    script: Mapping[str, Any] | None = None
    fault: Fault | None = None
    api_key: str | None = None
    without: str | None = None  # a required request field left out

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {**REQUEST}
        if self.script is not None:
            body["_sim"] = dict(self.script)
        if self.without:
            del body[self.without]
        return body


MESSAGE_CASES: dict[str, MessageCase] = {
    "plain_answer_ends_its_turn": MessageCase(
        ("message_end_turn", "message_end_turn_live_headers"), "success"),
    "thinking_answer_ends_its_turn": MessageCase(
        ("message_end_turn_thinking",), "success", THINKING),
    "text_is_cut_at_max_tokens": MessageCase(
        ("message_max_tokens",), "truncated:max_tokens", script={"stop_reason": "max_tokens"}),
    "thinking_is_cut_at_max_tokens": MessageCase(
        ("message_max_tokens_thinking_only",), "truncated:max_tokens", THINKING,
        {"stop_reason": "max_tokens"}),
    "text_stops_before_a_stop_sequence": MessageCase(
        ("message_stop_sequence",), "success", {"stop_sequences": ["Paris"]},
        {"stop_reason": "stop_sequence", "output": "The beautiful city of Paris."}),
    "tool_call_comes_without_text": MessageCase(
        ("message_tool_use",), "success", TOOLS, {"stop_reason": "tool_use"}),
    "search_loop_pauses_on_an_unanswered_call": MessageCase(
        ("message_pause_turn",), "unfinished:pause_turn", WEB_SEARCH,
        {"stop_reason": "pause_turn"}),
    "refusal_has_empty_content": MessageCase(
        ("message_refusal",), "refusal", script={"stop_reason": "refusal"}),
    "failed_refusal_script_has_empty_content": MessageCase(
        ("message_refusal",), "refusal", script={"end": "failed", "error_code": "refusal"}),
    "context_window_fills_up": MessageCase(
        ("message_context_window_exceeded",), "truncated:context_window",
        script={"stop_reason": "model_context_window_exceeded"}),
}

ERROR_CASES: dict[str, ErrorCase] = {
    "missing_field_is_an_invalid_request": ErrorCase("error_400", without="max_tokens"),
    "wrong_key_is_an_authentication_error": ErrorCase("error_401", api_key="wrong"),
    "payment_problem_is_a_billing_error": ErrorCase(
        "error_402", {"end": "failed", "error_code": "billing_error", "error": "Billing error"}),
    "unknown_model_is_not_found": ErrorCase("error_404", {"end": "vanished"}),
    "rate_limit_says_when_to_retry": ErrorCase(
        "error_429", fault=Fault(kind="rate_limit", retry_after=18)),
    "spend_cap_gives_no_retry_after": ErrorCase(
        "error_429_spend_limit", {"end": "failed", "error_code": "enforced_spend_limit_reached"}),
    "server_fault_is_an_api_error": ErrorCase("error_500", fault=Fault(kind="http_status")),
    "slow_request_is_a_timeout_error": ErrorCase(
        "error_504", {"end": "failed", "error_code": "timeout_error", "error": "Request timeout"}),
    "overload_gives_no_retry_after": ErrorCase(
        "error_529", fault=Fault(kind="http_status", status=529)),
}


@dataclass(frozen=True)
class Compared:
    """Compared by ``test``; ``unsimulated_headers`` are recorded headers it leaves out."""

    test: str
    unsimulated_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NotComparable:
    reason: str


SHAPE_TEST = "test_message_has_the_recorded_shape_of_its_stop_reason"
ERROR_TEST = "test_error_has_the_recorded_envelope_and_headers"
CLOUDFLARE = "sent by Cloudflare/Envoy in front of the API, not by the API itself"
FIXTURE_USE: dict[str, Compared | NotComparable] = {
    "message_end_turn": Compared(SHAPE_TEST),
    "message_end_turn_live_headers": Compared(SHAPE_TEST, {
        "cf-cache-status": CLOUDFLARE, "server": CLOUDFLARE,
        "strict-transport-security": CLOUDFLARE, "x-envoy-upstream-service-time": CLOUDFLARE,
        "retry-after": "seen on an HTTP 200 in one recorded stream only; no client may read "
                       "it there, so the simulator sends it on 429s alone"}),
    "message_end_turn_thinking": Compared(SHAPE_TEST),
    "message_max_tokens": Compared(SHAPE_TEST),
    "message_max_tokens_thinking_only": Compared(SHAPE_TEST),
    "message_stop_sequence": Compared(SHAPE_TEST),
    "message_tool_use": Compared(SHAPE_TEST),
    "message_pause_turn": Compared(SHAPE_TEST),
    "message_refusal": Compared(SHAPE_TEST),
    "message_context_window_exceeded": Compared(SHAPE_TEST),
    "error_400": Compared(ERROR_TEST),
    "error_401": Compared(ERROR_TEST),
    "error_402": Compared(ERROR_TEST),
    "error_404": Compared(ERROR_TEST),  # recorded on count_tokens: the same envelope
    "error_429": Compared(ERROR_TEST),
    "error_429_spend_limit": Compared(ERROR_TEST),
    "error_500": Compared(ERROR_TEST),
    "error_504": Compared(ERROR_TEST),
    "error_529": Compared(ERROR_TEST),
}


# --- driving the simulator -----------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


async def post(rs: RunningSimulator, http: aiohttp.ClientSession, body: Mapping[str, Any],
               *, api_key: str | None = None) -> Answer:
    headers = {"x-api-key": api_key or rs.sim.api_key, "anthropic-version": "2023-06-01"}
    async with http.post(rs.url(PROVIDER, "/v1/messages"), json=body,
                         headers=headers) as resp:
        return Answer(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                      await resp.json(content_type=None))


def client(rs: RunningSimulator, http: aiohttp.ClientSession) -> AnthropicClient:
    async def no_sleep(delay: float) -> None:
        del delay

    return anthropic_client_for("anthropic-sync", http, rs.settings.anthropic,
                                policy=POLICY, sleep=no_sleep)


def bodies(*names: str) -> list[Any]:
    return [load(PROVIDER, name).body for name in names]


def opaque_inputs(message: dict[str, Any], root: str = "$") -> list[str]:
    """A client tool's ``input`` follows the caller's schema: type-checked only."""
    return [f"{root}.content[{i}].input" for i, block in enumerate(message["content"])
            if block.get("type") == "tool_use"]


def recorded_blocks(block_type: str) -> list[Any]:
    """Every recorded content block of ``block_type``, over all message fixtures."""
    names = [n for n in FIXTURE_USE if n.startswith("message_")]
    return [b for body in bodies(*names) for b in body["content"] if b["type"] == block_type]


def texts(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in message["content"] if b["type"] == "text"]


async def message(rs: RunningSimulator, http: aiohttp.ClientSession,
                  case: MessageCase) -> dict[str, Any]:
    answer = await post(rs, http, case.body())
    assert answer.status == 200, answer.body
    result: dict[str, Any] = answer.body
    return result


# --- the inventory -------------------------------------------------------------------------

def test_every_anthropic_fixture_is_classified_and_its_test_exists() -> None:
    on_disk = {p.stem for p in (FIXTURES / PROVIDER).glob("*.json")} - {"signature_vectors"}
    assert set(FIXTURE_USE) == on_disk
    cases = {SHAPE_TEST: {n for c in MESSAGE_CASES.values() for n in c.fixtures},
             ERROR_TEST: {c.fixture for c in ERROR_CASES.values()}}
    for name, use in FIXTURE_USE.items():
        if isinstance(use, Compared):
            assert callable(globals().get(use.test)), use.test
            assert name in cases[use.test], f"{name}: no case of {use.test} drives it"
            assert set(use.unsimulated_headers) <= set(load(PROVIDER, name).headers)
        else:
            assert use.reason


# --- messages ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", MESSAGE_CASES.values(), ids=MESSAGE_CASES.keys())
async def test_message_has_the_recorded_shape_of_its_stop_reason(
        sim: RunningSimulator, http: aiohttp.ClientSession, case: MessageCase) -> None:
    body = await message(sim, http, case)
    own = bodies(*case.fixtures)
    assert {b["stop_reason"] for b in own} == {body["stop_reason"]}
    opaque = opaque_inputs(body)
    assert diff(shape_of(*own, *bodies(*ENVELOPE)), body, opaque=opaque) == []
    assert [d for d in diff(shape_of(*own), body, opaque=opaque) if d.endswith(MISSING)] == []
    for i, block in enumerate(body["content"]):
        recorded = recorded_blocks(block["type"])
        assert recorded, f"content[{i}]: block type {block['type']} is in no recording"
        block_opaque = ["$.input"] if block["type"] == "tool_use" else []
        assert diff(shape_of(*recorded), block, opaque=block_opaque) == []


@pytest.mark.parametrize("case", MESSAGE_CASES.values(), ids=MESSAGE_CASES.keys())
async def test_message_carries_the_recorded_headers(
        sim: RunningSimulator, http: aiohttp.ClientSession, case: MessageCase) -> None:
    answer = await post(sim, http, case.body())
    for name in case.fixtures:
        recorded = load(PROVIDER, name).headers
        use = FIXTURE_USE[name]
        skipped = set(use.unsimulated_headers) if isinstance(use, Compared) else set()
        assert set(recorded) - skipped <= set(answer.headers), name
        assert answer.headers["content-type"] == recorded["content-type"]
    assert ID_FORMATS["req"].match(answer.headers["request-id"])
    assert "retry-after" not in answer.headers
    assert "retry-after-ms" not in answer.headers


async def test_ratelimit_headers_count_what_the_answer_used(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    answer = await post(sim, http, REQUEST)
    usage = answer.body["usage"]
    used = {"input-tokens": usage["input_tokens"], "output-tokens": usage["output_tokens"],
            "tokens": usage["input_tokens"] + usage["output_tokens"]}
    recorded = load(PROVIDER, "message_end_turn_live_headers").headers
    for family, spent in used.items():
        prefix = f"anthropic-ratelimit-{family}"
        limit = int(answer.headers[f"{prefix}-limit"])
        assert int(answer.headers[f"{prefix}-remaining"]) == limit - spent
        assert RFC3339_Z.match(answer.headers[f"{prefix}-reset"])
        assert RFC3339_Z.match(recorded[f"{prefix}-reset"])


async def test_ids_have_the_recorded_formats(sim: RunningSimulator,
                                             http: aiohttp.ClientSession) -> None:
    recorded = [load(PROVIDER, n) for n in FIXTURE_USE]
    for fixture in recorded:
        assert ID_FORMATS["req"].match(fixture.headers["request-id"]), fixture.name
        if fixture.name.startswith("message_"):
            assert ID_FORMATS["msg"].match(fixture.body["id"]), fixture.name
    paused = await message(sim, http, MESSAGE_CASES["search_loop_pauses_on_an_unanswered_call"])
    tool = await message(sim, http, MESSAGE_CASES["tool_call_comes_without_text"])
    for body in (paused, tool):
        assert ID_FORMATS["msg"].match(body["id"])
    assert ID_FORMATS["toolu"].match(tool["content"][0]["id"])
    servers = [b["id"] for b in paused["content"] if b["type"] == "server_tool_use"]
    assert servers
    assert all(ID_FORMATS["srvtoolu"].match(i) for i in servers)


async def test_stop_sequence_cuts_the_text_before_it_as_recorded(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    case = MESSAGE_CASES["text_stops_before_a_stop_sequence"]
    body = await message(sim, http, case)
    (recorded,) = bodies(*case.fixtures)
    assert texts(body) == texts(recorded) == ["The beautiful city of "]
    assert body["stop_sequence"] == recorded["stop_sequence"] == "Paris"


async def test_a_requested_stop_sequence_in_the_reply_ends_the_answer_there(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    body = (await post(sim, http, {**REQUEST, "stop_sequences": ["zzz", "capital"]})).body
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "capital")
    assert texts(body) == ["Simulated reply to: What is the "]


async def test_max_tokens_cuts_the_text_and_spends_the_whole_budget(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    full = texts((await post(sim, http, REQUEST)).body)[0]
    body = await message(sim, http, MESSAGE_CASES["text_is_cut_at_max_tokens"])
    (cut,) = texts(body)
    assert full.startswith(cut)
    assert len(cut) < len(full)
    assert body["usage"]["output_tokens"] == REQUEST["max_tokens"]


async def test_max_tokens_with_thinking_ends_inside_the_thinking_block(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    body = await message(sim, http, MESSAGE_CASES["thinking_is_cut_at_max_tokens"])
    assert [b["type"] for b in body["content"]] == ["thinking"]
    usage = body["usage"]
    assert usage["output_tokens"] == THINKING["max_tokens"]
    assert 0 < usage["output_tokens_details"]["thinking_tokens"] <= usage["output_tokens"]


async def test_tool_use_answers_only_with_calls_to_the_requested_tool(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    forced = {**TOOLS, "tools": [*TOOLS["tools"], {"name": "lookup", "input_schema": {}}],
              "tool_choice": {"type": "tool", "name": "lookup"}}
    case = MessageCase(("message_tool_use",), "success", forced,
                       {"stop_reason": "tool_use", "output": {"city": "Paris"}})
    body = await message(sim, http, case)
    assert [(b["type"], b["name"], b["input"]) for b in body["content"]] == [
        ("tool_use", "lookup", {"city": "Paris"})]


async def test_pause_turn_ends_on_a_server_tool_call_without_result(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    body = await message(sim, http, MESSAGE_CASES["search_loop_pauses_on_an_unanswered_call"])
    last = body["content"][-1]
    answered = {b["tool_use_id"] for b in body["content"]
                if b["type"] == "web_search_tool_result"}
    assert last["type"] == "server_tool_use"
    assert last["id"] not in answered
    assert body["usage"]["server_tool_use"] == {"web_search_requests": len(answered)}


@pytest.mark.parametrize("case_id", ["refusal_has_empty_content",
                                     "failed_refusal_script_has_empty_content"])
async def test_refusal_has_no_content_no_output_and_says_why(
        sim: RunningSimulator, http: aiohttp.ClientSession, case_id: str) -> None:
    body = await message(sim, http, MESSAGE_CASES[case_id])
    (recorded,) = bodies("message_refusal")
    assert body["content"] == recorded["content"] == []
    assert body["usage"]["output_tokens"] == recorded["usage"]["output_tokens"] == 0
    assert body["usage"]["input_tokens"] > 0
    details = body["stop_details"]
    assert details["type"] == "refusal"
    assert details["category"] in REFUSAL_CATEGORIES
    assert recorded["stop_details"]["category"] in REFUSAL_CATEGORIES
    assert details["explanation"]


async def test_refusal_category_can_be_scripted(sim: RunningSimulator,
                                                http: aiohttp.ClientSession) -> None:
    case = MessageCase(("message_refusal",), "refusal",
                       script={"stop_reason": "refusal", "error_code": "cyber"})
    assert (await message(sim, http, case))["stop_details"]["category"] == "cyber"


async def test_context_window_answer_fills_the_window(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    body = await message(sim, http, MESSAGE_CASES["context_window_fills_up"])
    (recorded,) = bodies("message_context_window_exceeded")
    window = recorded["usage"]["input_tokens"] + recorded["usage"]["output_tokens"]
    assert body["usage"]["input_tokens"] + body["usage"]["output_tokens"] == window
    assert body["usage"]["output_tokens"] < REQUEST["max_tokens"]


async def test_every_other_message_has_stop_details_null(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    for case_id, case in MESSAGE_CASES.items():
        body = await message(sim, http, case)
        if body["stop_reason"] != "refusal":
            assert body["stop_details"] is None, case_id


@pytest.mark.parametrize(("request_fields", "script"), [
    ({}, {"stop_reason": "stop_sequence"}),
    ({}, {"stop_reason": "tool_use"}),
    (WEB_SEARCH, {"stop_reason": "tool_use"}),
    (TOOLS, {"stop_reason": "pause_turn"}),
], ids=["stop_sequence_without_sequences", "tool_use_without_tools",
        "tool_use_with_only_server_tools", "pause_turn_without_web_search"])
async def test_a_script_the_request_cannot_support_is_refused(
        sim: RunningSimulator, http: aiohttp.ClientSession, request_fields: dict[str, Any],
        script: dict[str, Any]) -> None:
    answer = await post(sim, http, {**REQUEST, **request_fields, "_sim": script})
    assert answer.status == 400
    assert answer.body["error"]["type"] == "invalid_request_error"
    assert answer.body["error"]["message"].startswith("invalid _sim script")


# --- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ERROR_CASES.values(), ids=ERROR_CASES.keys())
async def test_error_has_the_recorded_envelope_and_headers(
        sim: RunningSimulator, http: aiohttp.ClientSession, case: ErrorCase) -> None:
    if case.fault is not None:
        sim.sim.faults.arm(PROVIDER, "call", case.fault)
    answer = await post(sim, http, case.body(), api_key=case.api_key)
    recorded = load(PROVIDER, case.fixture)
    assert answer.status == recorded.status
    assert diff(shape_of(recorded.body), answer.body) == []
    assert answer.body["error"]["type"] == recorded.body["error"]["type"]
    assert answer.body["error"].get("details") == recorded.body["error"].get("details")
    assert set(recorded.headers) <= set(answer.headers)
    assert answer.headers["content-type"] == recorded.headers["content-type"]
    assert answer.headers["request-id"] == answer.body["request_id"]
    assert ID_FORMATS["req"].match(answer.body["request_id"])
    assert ("retry-after" in answer.headers) == ("retry-after" in recorded.headers)
    assert "retry-after-ms" not in answer.headers


async def test_rate_limit_retry_after_is_whole_seconds_rounded_up(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    sim.sim.faults.arm(PROVIDER, "call", Fault(kind="rate_limit", retry_after=2.2))
    answer = await post(sim, http, REQUEST)
    assert answer.status == 429
    assert answer.headers["retry-after"] == str(math.ceil(2.2))
    assert answer.headers["anthropic-ratelimit-input-tokens-remaining"] == "0"


async def test_rate_limit_fault_in_body_is_still_an_http_429(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    """A non-streaming call never gets an error under HTTP 200 (docs: only SSE streams)."""
    sim.sim.faults.arm(PROVIDER, "call", Fault(kind="rate_limit_in_body"))
    answer = await post(sim, http, REQUEST)
    assert (answer.status, answer.body["error"]["type"]) == (429, "rate_limit_error")


@pytest.mark.parametrize("how", ["script", "fault"])
async def test_conflict_is_a_409_conflict_error(sim: RunningSimulator,
                                                http: aiohttp.ClientSession, how: str) -> None:
    body: dict[str, Any] = {**REQUEST}
    if how == "fault":
        sim.sim.faults.arm(PROVIDER, "call", Fault(kind="http_status", status=409))
    else:
        body["_sim"] = {"end": "failed", "error_code": "conflict_error"}
    answer = await post(sim, http, body)
    envelope = shape_of(*bodies("error_400", "error_500", "error_529"))
    assert answer.status == 409
    assert answer.body["error"]["type"] == "conflict_error"
    assert diff(envelope, answer.body) == []
    assert "retry-after" not in answer.headers


# --- the client over the simulator ---------------------------------------------------------

@pytest.mark.parametrize("case", MESSAGE_CASES.values(), ids=MESSAGE_CASES.keys())
async def test_client_turns_each_stop_reason_into_the_policy_outcome(
        sim: RunningSimulator, http: aiohttp.ClientSession, case: MessageCase) -> None:
    outcome = await client(sim, http).call(case.body())
    stop = bodies(*case.fixtures)[0]["stop_reason"]
    if case.outcome == "success":
        assert isinstance(outcome, Succeeded)
        assert outcome.stop_reason == stop
        assert outcome.text
    else:
        assert isinstance(outcome, Failed)
        assert outcome.code == case.outcome
        assert outcome.raw["stop_reason"] == stop


async def test_client_fails_closed_on_a_stop_reason_the_api_may_add_later(
        sim: RunningSimulator, http: aiohttp.ClientSession) -> None:
    outcome = await client(sim, http).call(
        {**REQUEST, "_sim": {"stop_reason": "compaction_required"}})
    assert isinstance(outcome, Failed)
    assert outcome.code == "stop_reason:compaction_required"


async def test_client_does_not_retry_the_spend_cap(sim: RunningSimulator,
                                                   http: aiohttp.ClientSession) -> None:
    case = ERROR_CASES["spend_cap_gives_no_retry_after"]
    with pytest.raises(InsufficientCredits):
        await client(sim, http).call(case.body())
    assert sim.sim.journal.count(PROVIDER, "call") == 1
