"""Anthropic Messages API client (``anthropic-sync``): one ``POST /v1/messages``.

Sans-I/O: :func:`build_messages_request` makes the request, :func:`parse_message` turns a
2xx body into an outcome, :func:`classify_anthropic` turns an error response into a typed
:mod:`callwarden.providers.errors` error. :class:`AnthropicClient` glues them to the transport.

Errors come as ``{"type": "error", "error": {"type", "message"}, "request_id"}`` (and a
``request-id`` header); the HTTP status decides the class:

====  ======================  =======================
HTTP  ``error.type``          raised
====  ======================  =======================
400   invalid_request_error   BadRequest
401   authentication_error    AuthenticationError
402   billing_error           InsufficientCredits
403   permission_error        AuthenticationError
404   not_found_error         BadRequest (a wrong model or path, not a task)
413   request_too_large       BadRequest
429   rate_limit_error        RateLimited (``retry-after``; ``retry-after-ms`` first, as the
                              SDK reads it, though the API was never seen sending it) — but
                              a spend cap (``error.details.error_code =
                              enforced_spend_limit_reached``, or ``billing_error``) is
                              InsufficientCredits: no retry succeeds before it resets
500   api_error               TransientError
504   timeout_error           TransientError
529   overloaded_error        TransientError (often without ``retry-after``)
====  ======================  =======================

A ``retry-after`` on a 200 (recorded live) is ignored: only error answers are read for it.

``x-should-retry: false`` makes any of them terminal (a plain ``ProviderError`` in place of
a transient one); ``x-should-retry: true`` makes a terminal one transient. The message keeps
the error type and the ``request_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    ProviderError,
    RateLimited,
    TransientError,
)
from callwarden.providers.llm_stop import StopPolicy, failure_code, judge
from callwarden.providers.outcomes import Failed, Succeeded, Usage, reported_number
from callwarden.providers.raw import JSONTooDeep, RawResponse, decode_json

__all__ = ["ANTHROPIC_VERSION", "MessagesRequest", "build_messages_request", "classify_anthropic",
           "judged", "message_usage", "parse_message"]


PROVIDER = "anthropic"

KIND = "anthropic-sync"

ANTHROPIC_VERSION = "2023-06-01"

REQUIRED = ("model", "max_tokens", "messages")

_BY_STATUS: dict[int, type[ProviderError]] = {
    400: BadRequest, 401: AuthenticationError, 402: InsufficientCredits,
    403: AuthenticationError, 404: BadRequest, 413: BadRequest, 429: RateLimited,
    408: TransientError, 409: TransientError,
    500: TransientError, 504: TransientError, 529: TransientError,
}

# For an error envelope under a status the table does not know (or a 2xx).
_BY_TYPE: dict[str, type[ProviderError]] = {
    "invalid_request_error": BadRequest, "authentication_error": AuthenticationError,
    "billing_error": InsufficientCredits, "permission_error": AuthenticationError,
    "not_found_error": BadRequest, "request_too_large": BadRequest,
    "rate_limit_error": RateLimited, "api_error": TransientError,
    "timeout_error": TransientError, "overloaded_error": TransientError,
}

class MessagesRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/messages`` as data (the path is fixed; headers besides the key here)."""

    body: dict[str, Any]
    path: str = "/v1/messages"
    headers: dict[str, str] = msgspec.field(
        default_factory=lambda: {"anthropic-version": ANTHROPIC_VERSION,
                                 "content-type": "application/json"})

def build_messages_request(request: Mapping[str, Any]) -> MessagesRequest:
    """The Messages request: ``{model, max_tokens, messages, system?, ...}`` passed through.

    Streaming is refused (a sync call reads one JSON body)."""
    missing = [k for k in REQUIRED if request.get(k) in (None, "", [])]
    if missing:
        raise BadRequest(f"messages request needs {', '.join(missing)}", provider=PROVIDER)
    if request.get("stream"):
        raise BadRequest("stream=true is not supported by the sync client", provider=PROVIDER)
    return MessagesRequest(body=dict(request))

def _malformed(message: str, raw: RawResponse) -> MalformedResponse:
    return MalformedResponse(message, provider=PROVIDER, status=raw.status)

def _text_of(content: list[Any], raw: RawResponse) -> str:
    parts = []
    for block in content:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _malformed(f"content block is not an object with a type: {block!r}", raw)
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise _malformed("text block without text", raw)
            parts.append(block["text"])
    return "".join(parts)

def _tool_calls(content: list[Any]) -> str | None:
    """The tool calls of an answer that has no text, as JSON (for one call, the output)."""
    calls = [{"name": b.get("name"), "input": b.get("input")} for b in content
             if isinstance(b, dict) and b.get("type") == "tool_use"]
    return msgspec.json.encode(calls).decode() if calls else None

def message_text(content: list[Any], raw: RawResponse) -> str:
    """An Anthropic-shaped message's output: its text blocks joined or, with no text, its
    tool calls as JSON (``""`` when it has neither); a malformed block is refused."""
    return _text_of(content, raw) or _tool_calls(content) or ""

def message_usage(body: dict[str, Any]) -> Usage:
    """Tokens (and the model) an Anthropic-shaped message reports it used: input and
    output, and the prompt-cache writes and reads a price list may charge differently."""
    usage: Usage = {}
    reported = body.get("usage")
    if isinstance(reported, dict):
        for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                    "cache_read_input_tokens"):
            number = reported_number(reported.get(key))
            if number is not None:
                usage[key] = number
    if isinstance(body.get("model"), str) and body["model"]:
        usage["model"] = body["model"]
    return usage

def _failure_text(body: dict[str, Any], stop_reason: str | None, text: str) -> str:
    details = body.get("stop_details")
    if isinstance(details, dict) and isinstance(details.get("explanation"), str):
        return f"{stop_reason}: {details['explanation']}"
    tail = f": {text[:200]}" if text else ""
    return f"the model stopped ({stop_reason or 'no stop_reason'}){tail}"

def judged(body: dict[str, Any], text: str, policy: StopPolicy | None,
           usage: Usage) -> Succeeded | Failed:
    """The outcome of a message that answered ``text``, by its ``stop_reason`` and the
    policy (:mod:`callwarden.providers.llm_stop`); the stop reason is kept either way."""
    stop = body.get("stop_reason")
    stop_reason = stop if isinstance(stop, str) else None
    if judge(stop_reason, policy) == "succeed":
        return Succeeded(text=text, cost=None, raw=body, usage=usage, stop_reason=stop_reason)
    return Failed(error=_failure_text(body, stop_reason, text),
                  code=failure_code(stop_reason), raw=body)

def parse_message(raw: RawResponse, policy: StopPolicy | None = None) -> Succeeded | Failed:
    """A message object as an outcome: ``text`` is the text blocks joined (or, with no
    text, its tool calls as JSON), ``raw`` the whole message (with ``usage``), ``usage``
    its token counts; whether it is a result is the stop-reason ``policy``'s call
    (:mod:`callwarden.providers.llm_stop`: truncated, unfinished, refused or unknown answers
    fail)."""
    body = raw.json(PROVIDER)
    if isinstance(body, dict) and body.get("type") == "error":
        raise _error_from(raw)  # an error envelope with a 2xx status
    if not isinstance(body, dict) or body.get("type") != "message":
        raise _malformed(f"expected a message object, got {raw.body[:200]!r}", raw)
    content = body.get("content")
    if not isinstance(content, list):
        raise _malformed("message without a content list", raw)
    return judged(body, message_text(content, raw), policy, message_usage(body))

def _envelope(raw: RawResponse) -> tuple[str, str, str | None, str | None]:
    """(error type, message, request id, ``error.details.error_code``) of an error
    response, whatever its body."""
    rid = raw.headers.get("request-id")
    try:
        body = decode_json(raw.body)
    except (msgspec.DecodeError, JSONTooDeep):
        text = raw.body[:200].decode("utf-8", "replace").strip() or f"HTTP {raw.status}"
        return "", text, rid, None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", str(body)[:200], rid, None
    rid = body.get("request_id") or rid
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, dict) else None
    return (str(error.get("type") or ""), str(error.get("message") or ""),
            rid if isinstance(rid, str) else None, code if isinstance(code, str) else None)

_SPEND_CAP_CODES = frozenset({"enforced_spend_limit_reached"})

def _error_class(status: int, etype: str, should_retry: str | None,
                 detail_code: str | None = None) -> type[ProviderError]:
    if detail_code in _SPEND_CAP_CODES or etype == "billing_error":
        return InsufficientCredits  # a spend cap: no retry succeeds before the cap resets
    cls = (_BY_STATUS.get(status) or _BY_TYPE.get(etype)
           or (TransientError if status >= 500 else BadRequest))
    if should_retry == "false" and issubclass(cls, TransientError):
        return ProviderError
    if should_retry == "true" and not issubclass(cls, TransientError):
        return TransientError
    return cls

def _retry_after(raw: RawResponse) -> float | None:
    millis = raw.retry_after("retry-after-ms")
    return millis / 1000.0 if millis is not None else raw.retry_after()

def _error_from(raw: RawResponse) -> ProviderError:
    etype, message, rid, detail_code = _envelope(raw)
    text = f"{etype}: {message}" if etype else message
    if rid:
        text += f" (request_id {rid})"
    cls = _error_class(raw.status, etype, raw.headers.get("x-should-retry"), detail_code)
    if cls is RateLimited:
        return RateLimited(text, retry_after=_retry_after(raw), provider=PROVIDER,
                           status=raw.status, code=etype or None)
    return cls(text, provider=PROVIDER, status=raw.status, code=etype or None)

def classify_anthropic(raw: RawResponse) -> ProviderError | None:
    """``None`` for a 2xx response, else the typed error (table in the module doc)."""
    if 200 <= raw.status < 300:
        return None
    return _error_from(raw)
