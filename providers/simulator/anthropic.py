"""Simulated Anthropic Messages API: ``POST /v1/messages`` (route ``call``).

Faithful where a client can tell: ``x-api-key`` must equal the simulator's key and
``anthropic-version`` must be present; errors use the envelope
``{"type": "error", "error": {"type", "message"}, "request_id"}`` with the documented
HTTP -> ``error.type`` table; every response carries a ``request-id`` header; 429 and 529
carry ``retry-after`` (and ``retry-after-ms``).

The script (``_sim`` in the body, else queued, else default) drives the answer:
``hang_s`` delays it; ``end="failed"`` answers an error whose status comes from
``error_code`` (an ``error.type`` such as ``overloaded_error``; default ``api_error``) and
whose message is ``error``, except ``error_code="refusal"`` which answers a message with
``stop_reason: "refusal"``; ``end="vanished"`` answers ``404 not_found_error``;
``end="stuck"`` never answers (until the simulator's hang cap).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
from aiohttp import web

from providers.simulator.core import MAX_HANG_S, Script, Simulator

__all__ = ["ERROR_TYPES", "NAME", "render_error", "routes"]

NAME = "anthropic"
MAX_BODY = 32 * 1024 * 1024
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
    429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error",
}
STATUS_OF_TYPE = {etype: status for status, etype in ERROR_TYPES.items()}


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex[:24]}"


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False) -> web.Response:
    """The Anthropic error envelope for ``status``. ``in_body`` sends it under HTTP 200
    (as a stream would deliver a late ``overloaded_error``)."""
    etype = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    rid = _request_id()
    headers = {"request-id": rid}
    if status in (429, 529):
        wait = 1.0 if retry_after is None else retry_after
        headers |= {"retry-after": str(max(0, round(wait))),
                    "retry-after-ms": str(int(wait * 1000))}
    body = {"type": "error", "error": {"type": etype, "message": message}, "request_id": rid}
    return web.json_response(body, status=200 if in_body else status, headers=headers)


def _check_headers(request: web.Request, sim: Simulator) -> web.Response | None:
    if request.headers.get("x-api-key") != sim.api_key:
        return render_error(401, "invalid x-api-key")
    if not request.headers.get("anthropic-version"):
        return render_error(400, "anthropic-version: header is required")
    return None


def _validate(body: Any) -> str | None:
    """What is wrong with a Messages body, or ``None``."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "model: Field required"
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return "max_tokens: Field required (a positive integer)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    return None


def _last_user_text(messages: list[Any]) -> str:
    for msg in reversed(messages):
        if isinstance(msg, dict) and msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def _message(sim: Simulator, body: dict[str, Any], stop_reason: str) -> dict[str, Any]:
    prompt = _last_user_text(body["messages"])
    text = ("I can't help with that." if stop_reason == "refusal"
            else f"Simulated reply to: {prompt[:200]}")
    ident = "".join(sim.rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789",
                                    k=24))
    return {
        "id": f"msg_01{ident}", "type": "message", "role": "assistant", "model": body["model"],
        "content": [{"type": "text", "text": text}], "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": max(1, len(msgspec.json.encode(body["messages"])) // 4),
                  "output_tokens": max(1, len(text) // 4),
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


async def _scripted(sim: Simulator, body: dict[str, Any], script: Script) -> web.Response:
    if script.hang_s:
        await asyncio.sleep(min(script.hang_s, MAX_HANG_S))
    if script.end == "stuck":
        await asyncio.sleep(MAX_HANG_S)
    if script.end == "vanished":
        return render_error(404, f"model: {body['model']}")
    if script.end == "failed" and script.error_code != "refusal":
        status = STATUS_OF_TYPE.get(script.error_code or "api_error", 500)
        return render_error(status, script.error)
    stop = "refusal" if script.end == "failed" else "end_turn"
    return web.json_response(_message(sim, body, stop), headers={"request-id": _request_id()})


def routes(sim: Simulator) -> list[web.RouteDef]:
    """``POST /v1/messages`` as route ``call``."""

    async def call(request: web.Request) -> web.Response:
        refused = _check_headers(request, sim)
        if refused is not None:
            return refused
        raw = await request.read()
        if len(raw) > MAX_BODY:
            return render_error(413, "Request exceeds the maximum allowed number of bytes.")
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            return render_error(400, f"invalid JSON body: {exc}")
        problem = _validate(body)
        if problem is not None:
            return render_error(400, problem)
        try:
            script = sim.script_for(NAME, body)
        except web.HTTPBadRequest as exc:
            return render_error(400, exc.text or "invalid _sim script")
        return await _scripted(sim, body, script)

    return [web.post("/v1/messages", call, name="call")]
