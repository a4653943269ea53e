"""Simulated KIE.ai (reference §1–§10, §15 items 6–12): the six task families, ``kie-llm``
and the credit endpoint, byte-shape faithful.

- API errors are HTTP 200 with ``{"code", "msg", "data"}``; a wrong or missing
  ``Authorization: Bearer`` answers in-body ``code 401``; no ``User-Agent`` at all gets
  Cloudflare's bare HTTP 403 ``error code: 1010``.
- Unknown ids: ``code 422 "recordInfo is null"`` (Suno: ``code 200, data null``); the same
  answer for a ``vanished`` script end and, transiently, for the first
  ``script.not_found_first_polls`` polls after creation.
- Script phases map to each family's vocabulary (:mod:`providers.simulator.kie_render`).
  ``script.error_code`` picks variants: Luma ``"4"`` on success (CALLBACK_FAILED with URLs),
  Suno ``"CALLBACK_EXCEPTION"`` (with audio on success, without on failure) or another Suno
  failure status, ``"2"`` for successFlag 2; otherwise it is the family's error code.
- Callbacks: a task created with a ``callBackUrl`` is driven in the background (without
  counting polls, so time-based steps progress when nobody polls) and also checked on
  every poll; the terminal callback (Suno: ``text`` stage, then ``complete`` or ``error``)
  is sent once, signed with ``kie_sign`` (``X-Webhook-Timestamp``/``X-Webhook-Signature``),
  through ``sim.webhooks`` with the script's webhook plan.
- ``kie-llm``: ``/claude/v1/messages`` answers an Anthropic message plus
  ``credits_consumed`` (SSE unless ``"stream": false``, KIE's default being true),
  ``/{model}/v1/chat/completions`` a ``chat.completion``; ``script.hang_s`` hangs first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from aiohttp import web

from providers.signing import kie_sign
from providers.simulator.core import MAX_HANG_S, Phase, Script, Simulator, Task
from providers.simulator.kie_render import (
    CREATE_PATHS,
    POLL_PATHS,
    callback_body,
    new_task_id,
    render,
    suno_stage_body,
    suno_status,
)

__all__ = ["NAME", "render_error", "routes"]

NAME: Final = "kie"
JSON: Final = "application/json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "market": ("model",), "veo": ("prompt",), "suno": (), "kontext": ("prompt",),
    "luma": ("prompt", "videoUrl"), "runway": ("prompt",),
}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(data), content_type=JSON,
                        headers=headers)


def envelope(code: int, msg: str, data: Any = None) -> web.Response:
    """KIE's HTTP 200 ``{"code", "msg", "data"}`` answer."""
    return _json({"code": code, "msg": msg, "data": data})


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False) -> web.Response:
    """In-body envelope (HTTP 200), except HTTP 429 and HTTP 5xx when not ``in_body``."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    http = 200 if in_body or not (status == 429 or status >= 500) else status
    return _json({"code": status, "msg": message, "data": None}, http, headers)


def _gate(sim: Simulator, request: web.Request) -> web.Response | None:
    """Cloudflare's User-Agent check, then KIE's in-body 401."""
    if not request.headers.get("User-Agent"):
        return web.Response(status=403, text="error code: 1010")
    if request.headers.get("Authorization") != f"Bearer {sim.api_key}":
        return envelope(401, "You do not have access permissions")
    return None


async def _body(request: web.Request) -> dict[str, Any] | None:
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError:
        return None
    return body if isinstance(body, dict) else None


def _script(sim: Simulator, body: dict[str, Any]) -> Script:
    nested = body.get("input")
    if "_sim" not in body and isinstance(nested, dict) and "_sim" in nested:
        return sim.script_for(NAME, nested)
    return sim.script_for(NAME, body)


def _clean(body: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if k != "_sim"}
    if isinstance(out.get("input"), dict):
        out["input"] = {k: v for k, v in out["input"].items() if k != "_sim"}
    return out


def _problem(family: str, body: dict[str, Any]) -> str | None:
    if family == "suno" and not body.get("callBackUrl"):
        return "Please enter callBackUrl."
    missing = [f for f in _REQUIRED[family] if not body.get(f)]
    return f"{missing[0]} is required" if missing else None


# -- tasks ----------------------------------------------------------------------------------


def _sign_headers(sim: Simulator, task_id: str) -> dict[str, str]:
    headers = {"Content-Type": JSON}
    secret = sim.webhook_secrets.get(NAME)
    if secret:
        ts = int(sim.clock.now())
        headers["X-Webhook-Timestamp"] = str(ts)
        headers["X-Webhook-Signature"] = kie_sign(secret, task_id, ts)
    return headers


def _send_once(sim: Simulator, task: Task, stage: str, body: dict[str, Any]) -> None:
    sent: set[str] = task.extra.setdefault("callbacks_sent", set())
    if stage in sent or not task.callback_url:
        return
    sent.add(stage)
    sim.webhooks.deliver(task.callback_url, msgspec.json.encode(body),
                         _sign_headers(sim, task.id), task.script.webhook)


def _callbacks(sim: Simulator, task: Task, phase: Phase) -> None:
    if task.family == "suno":
        if suno_status(task, phase) == "TEXT_SUCCESS":
            _send_once(sim, task, "text", suno_stage_body(sim, task, phase, "text"))
        if phase.name in ("succeeded", "failed"):
            stage = "complete" if phase.name == "succeeded" else "error"
            _send_once(sim, task, stage, suno_stage_body(sim, task, phase, stage))
        return
    if phase.name in ("succeeded", "failed"):
        _send_once(sim, task, "final", callback_body(sim, task, phase))


def _seen(sim: Simulator, task: Task, phase: Phase) -> None:
    """Bookkeeping for a phase a poll or the background driver saw."""
    if phase.terminal:
        task.extra.setdefault("completed_at", sim.clock.now())
    if phase.name != "vanished":
        _callbacks(sim, task, phase)


def _drive(sim: Simulator, task: Task) -> None:
    async def on_phase(phase: Phase) -> None:
        _seen(sim, task, phase)

    sim.drive(task, on_phase, observe=False)


def _create_handler(sim: Simulator, family: str) -> Handler:
    async def create(request: web.Request) -> web.StreamResponse:
        denied = _gate(sim, request)
        if denied is not None:
            return denied
        body = await _body(request)
        if body is None:
            return envelope(422, "Invalid request body: JSON object expected")
        problem = _problem(family, body)
        if problem is not None:
            return envelope(422, problem)
        task = sim.tasks.create(NAME, family, _clean(body), _script(sim, body),
                                callback_url=body.get("callBackUrl") or None,
                                task_id=new_task_id(sim, family))
        if task.callback_url:
            _drive(sim, task)
        data = {"taskId": task.id}
        return envelope(200, "success", {**data, "recordId": task.id} if family == "market"
                        else data)

    return create


def not_found(family: str) -> web.Response:
    """The family's "no such task" answer."""
    if family == "suno":
        return envelope(200, "success", None)
    return envelope(422, "recordInfo is null")


def _still_unknown(task: Task) -> bool:
    """The transient not-found right after creation (``script.not_found_first_polls``)."""
    seen = task.extra.get("not_found_polls", 0)
    if seen >= task.script.not_found_first_polls:
        return False
    task.extra["not_found_polls"] = seen + 1
    return True


def _poll_handler(sim: Simulator, family: str) -> Handler:
    async def poll(request: web.Request) -> web.StreamResponse:
        denied = _gate(sim, request)
        if denied is not None:
            return denied
        task_id = request.query.get("taskId")
        if not task_id:
            return envelope(400, "taskId parameter is required")
        task = sim.tasks.get(NAME, task_id)
        if task is None or task.family != family or _still_unknown(task):
            return not_found(family)
        phase = task.observe(sim.clock.now())
        if phase.name == "vanished":
            return not_found(family)
        _seen(sim, task, phase)
        return envelope(200, "success", render(sim, task, phase))

    return poll


# -- kie-llm and account --------------------------------------------------------------------


def _llm_error(status: int, kind: str, message: str) -> web.Response:
    return _json({"error": {"type": kind, "message": message}}, status)


def _reply_text(body: dict[str, Any]) -> str:
    messages = body.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    content = last.get("content", "")
    return f"Simulated reply to: {str(content)[:80]}"


def _script_cost(sim: Simulator, body: dict[str, Any], default: float) -> float:
    """The cost the request's ``_sim`` script asks for (a hostile one included)."""
    cost = sim.script_for(NAME, body).cost if "_sim" in body else None
    return default if cost is None else cost


def _anthropic_message(sim: Simulator, body: dict[str, Any]) -> dict[str, Any]:
    text = _reply_text(body)
    return {"id": f"msg_{sim.rng.getrandbits(96):024x}", "type": "message",
            "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 13, "output_tokens": len(text)},
            "credits_consumed": _script_cost(sim, body, 0.02)}


def _chat_completion(sim: Simulator, body: dict[str, Any]) -> dict[str, Any]:
    text = _reply_text(body)
    return {"id": f"chatcmpl-{sim.rng.getrandbits(96):024x}", "object": "chat.completion",
            "created": int(sim.clock.now()), "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 13, "completion_tokens": len(text),
                      "total_tokens": 13 + len(text)}}


async def _sse(request: web.Request, events: list[tuple[str | None, Any]]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event, data in events:
        head = f"event: {event}\n" if event else ""
        payload = data if isinstance(data, str) else msgspec.json.encode(data).decode()
        await resp.write(f"{head}data: {payload}\n\n".encode())
    await resp.write_eof()
    return resp


def _anthropic_events(msg: dict[str, Any]) -> list[tuple[str | None, Any]]:
    text = msg["content"][0]["text"]
    start = {**msg, "content": [], "stop_reason": None}
    return [("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": text}}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "usage": msg["usage"],
                               "delta": {"stop_reason": "end_turn"}}),
            ("message_stop", {"type": "message_stop"})]


def _chat_events(done: dict[str, Any]) -> list[tuple[str | None, Any]]:
    choice = {"index": 0, "delta": done["choices"][0]["message"], "finish_reason": "stop"}
    return [(None, {**done, "object": "chat.completion.chunk", "choices": [choice]}),
            (None, "[DONE]")]


async def _llm_prelude(sim: Simulator, request: web.Request
                       ) -> tuple[dict[str, Any] | None, web.Response | None]:
    """Auth, body, script (hang, scripted failure) and validation of an LLM call."""
    if request.headers.get("Authorization") != f"Bearer {sim.api_key}":
        return None, _llm_error(401, "authentication_error", "invalid x-api-key")
    body = await _body(request)
    if body is None:
        return None, _llm_error(400, "invalid_request_error", "body must be a JSON object")
    script = sim.script_for(NAME, body)
    if script.hang_s:
        await asyncio.sleep(min(script.hang_s, MAX_HANG_S))
    if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
        return None, _llm_error(400, "invalid_request_error", "model and messages are required")
    if script.end == "failed":
        digits = script.error_code or ""
        code = int(digits) if digits.isdigit() else 400
        kind = "invalid_request_error" if code < 500 else "api_error"
        return None, _llm_error(code, kind, script.error)
    return body, None


def _messages_handler(sim: Simulator) -> Handler:
    async def messages(request: web.Request) -> web.StreamResponse:
        body, error = await _llm_prelude(sim, request)
        if body is None:
            assert error is not None
            return error
        msg = _anthropic_message(sim, body)
        if body.get("stream", True) is not False:
            return await _sse(request, _anthropic_events(msg))
        return _json(msg)

    return messages


def _chat_handler(sim: Simulator) -> Handler:
    async def chat(request: web.Request) -> web.StreamResponse:
        body, error = await _llm_prelude(sim, request)
        if body is None:
            assert error is not None
            return error
        done = _chat_completion(sim, {**body, "model": request.match_info["model"]})
        if body.get("stream") is True:
            return await _sse(request, _chat_events(done))
        return _json(done)

    return chat


def _credit_handler(sim: Simulator) -> Handler:
    async def credit(request: web.Request) -> web.StreamResponse:
        return _gate(sim, request) or envelope(200, "success", 5916.25)

    return credit


def routes(sim: Simulator) -> list[web.RouteDef]:
    """Every KIE route: ``create``/``poll`` (suffixed per family), ``call``, ``credit``."""
    defs: list[web.RouteDef] = []
    for family, path in CREATE_PATHS.items():
        suffix = "" if family == "market" else f".{family}"
        defs.append(web.post(path, _create_handler(sim, family), name=f"create{suffix}"))
        defs.append(web.get(POLL_PATHS[family], _poll_handler(sim, family),
                            name=f"poll{suffix}"))
    defs += [
        web.post("/claude/v1/messages", _messages_handler(sim), name="call"),
        web.post("/{model}/v1/chat/completions", _chat_handler(sim), name="call.chat"),
        web.get("/api/v1/chat/credit", _credit_handler(sim), name="credit"),
    ]
    return defs
