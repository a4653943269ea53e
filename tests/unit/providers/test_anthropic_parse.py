"""Anthropic Messages builder, parser and error table (no I/O)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from callwarden.providers.anthropic.client import AnthropicClient, anthropic_client_for
from callwarden.providers.anthropic.wire import (
    ANTHROPIC_VERSION,
    build_messages_request,
    classify_anthropic,
    parse_message,
)
from callwarden.providers.base import Endpoint
from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    ProviderError,
    RateLimited,
    TransientError,
    UnknownProviderKind,
    is_transient,
)
from callwarden.providers.outcomes import Failed, Succeeded
from callwarden.providers.raw import RawResponse

REQUEST = {"model": "claude-sonnet-4-5", "max_tokens": 64,
           "messages": [{"role": "user", "content": "Hi"}], "system": "be brief"}


def resp(body: Any, status: int = 200, **headers: str) -> RawResponse:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return RawResponse(status=status, headers={k.replace("_", "-"): v
                                               for k, v in headers.items()}, body=data)


def message(*blocks: dict[str, Any], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": list(blocks), "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 6,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def error(status: int, etype: str, msg: str = "m", **headers: str) -> RawResponse:
    return resp({"type": "error", "error": {"type": etype, "message": msg},
                 "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}, status, **headers)


def test_request_passes_the_body_through_with_version_header() -> None:
    req = build_messages_request(REQUEST)
    assert (req.path, req.body) == ("/v1/messages", REQUEST)
    assert req.headers["anthropic-version"] == ANTHROPIC_VERSION == "2023-06-01"


@pytest.mark.parametrize("missing", ["model", "max_tokens", "messages"])
def test_request_without_a_required_field_is_refused(missing: str) -> None:
    with pytest.raises(BadRequest, match=missing):
        build_messages_request({k: v for k, v in REQUEST.items() if k != missing})


def test_streaming_is_refused_by_the_sync_client() -> None:
    with pytest.raises(BadRequest, match="stream"):
        build_messages_request({**REQUEST, "stream": True})


def test_text_blocks_are_concatenated_and_usage_kept() -> None:
    body = message({"type": "text", "text": "Hello"},
                   {"type": "tool_use", "id": "t", "name": "f", "input": {}},
                   {"type": "text", "text": ", world"})
    out = parse_message(resp(body))
    assert isinstance(out, Succeeded)
    assert (out.text, out.cost) == ("Hello, world", None)
    assert out.raw["usage"]["output_tokens"] == 6


def test_usage_for_pricing_has_tokens_cache_tokens_and_the_model() -> None:
    body = message({"type": "text", "text": "hi"})
    body["usage"].update(cache_creation_input_tokens=30, cache_read_input_tokens=400,
                         service_tier="standard")
    out = parse_message(resp(body))
    assert isinstance(out, Succeeded)
    assert out.usage == {"input_tokens": 12, "output_tokens": 6,
                         "cache_creation_input_tokens": 30, "cache_read_input_tokens": 400,
                         "model": "claude-sonnet-4-5"}


def test_refusal_is_a_failure() -> None:
    out = parse_message(resp(message({"type": "text", "text": "no"}, stop_reason="refusal")))
    assert isinstance(out, Failed)
    assert (out.code, out.error) == ("refusal", "the model stopped (refusal): no")


@pytest.mark.parametrize("body", [
    b'{"id": "msg_1", "type": "mess',
    b"[]",
    msgspec.json.encode({"type": "message", "content": "text"}),
    msgspec.json.encode(message({"type": "text"})),
    msgspec.json.encode(message({"text": "x"})),
    msgspec.json.encode({"id": "x", "type": "completion"}),
])
def test_bad_message_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedResponse):
        parse_message(resp(body))


def test_error_envelope_inside_a_2xx_is_raised_typed() -> None:
    with pytest.raises(TransientError, match="overloaded"):
        parse_message(error(200, "overloaded_error", "Overloaded"))


@pytest.mark.parametrize(("status", "etype", "cls"), [
    (400, "invalid_request_error", BadRequest),
    (401, "authentication_error", AuthenticationError),
    (402, "billing_error", InsufficientCredits),
    (403, "permission_error", AuthenticationError),
    (404, "not_found_error", BadRequest),
    (413, "request_too_large", BadRequest),
    (429, "rate_limit_error", RateLimited),
    (500, "api_error", TransientError),
    (504, "timeout_error", TransientError),
    (529, "overloaded_error", TransientError),
])
def test_http_status_maps_to_error_class(status: int, etype: str, cls: type[Exception]) -> None:
    err = classify_anthropic(error(status, etype, "details here"))
    assert type(err) is cls
    assert err is not None
    assert err.code == etype
    assert err.status == status
    assert "details here" in err.message
    assert "req_011CSHoEeqs5C35K2UUqR7Fy" in err.message


def test_request_id_header_is_used_when_body_is_not_json() -> None:
    err = classify_anthropic(resp(b"<html>413 Request Entity Too Large</html>", 413,
                                  request_id="req_hdr"))
    assert isinstance(err, BadRequest)
    assert "req_hdr" in err.message


def test_retry_after_ms_wins_over_retry_after() -> None:
    err = classify_anthropic(error(429, "rate_limit_error", retry_after_ms="1500",
                                   retry_after="9"))
    assert isinstance(err, RateLimited)
    assert err.retry_after == 1.5


def test_retry_after_seconds_when_no_ms_header() -> None:
    err = classify_anthropic(error(429, "rate_limit_error", retry_after="9"))
    assert isinstance(err, RateLimited)
    assert err.retry_after == 9.0


def test_should_retry_false_makes_a_5xx_terminal() -> None:
    err = classify_anthropic(error(529, "overloaded_error", x_should_retry="false"))
    assert isinstance(err, ProviderError)
    assert not is_transient(err)


def test_should_retry_true_makes_a_4xx_transient() -> None:
    err = classify_anthropic(error(409, "conflict", x_should_retry="true"))
    assert err is not None
    assert is_transient(err)


def test_success_is_not_an_error() -> None:
    assert classify_anthropic(resp(message(), 200)) is None


def test_client_for_only_knows_anthropic_sync() -> None:
    ep = Endpoint(base_url="https://api.anthropic.com", api_key="k")
    session: Any = object()
    assert isinstance(anthropic_client_for("anthropic-sync", session, ep), AnthropicClient)
    with pytest.raises(UnknownProviderKind):
        anthropic_client_for("kie-llm", session, ep)
