"""Simulated KIE.ai: the six task families, ``kie-llm`` and the credit endpoint, in the
shapes of ``tests/fixtures/providers/kie`` (bodies:
:mod:`callwarden.providers.simulator.kie_render`;
sources and evidence: each fixture and the research notes, ``/work/notes/kie.md``).

- API errors are HTTP 200 with ``{"code", "msg"[, "data"]}`` as the recordInfo OpenAPI
  examples give them [C]: a wrong or missing ``Authorization: Bearer`` is
  ``{"code": 401, "msg": "Unauthorized"}``, a poll without ``taskId`` is
  ``{"code": 400, "msg": "taskId parameter is required"}``, an in-body rate limit
  ``{"code": 429, "msg": "Rate limit exceeded"}`` (no ``data`` key in these three), a
  server error ``{"code": 500, "msg": "Server Error - ...", "data": null}``. No
  ``User-Agent`` at all gets Cloudflare's bare HTTP 403 ``error code: 1010``. Envelopes are
  sent as ``application/json;charset=UTF-8``, as recorded live [O].
- Unknown ids: ``code 422 "recordInfo is null"`` [C] (Suno: ``code 200, data null`` [O]);
  the same answer for a ``vanished`` script end and, transiently, for the first
  ``script.not_found_first_polls`` polls after creation.
- Script phases map to each family's vocabulary (:mod:`callwarden.providers.simulator.kie_render`).
  ``script.error_code`` picks variants: Luma ``"4"`` on success (CALLBACK_FAILED with URLs),
  Suno ``"CALLBACK_EXCEPTION"`` (with audio on success, without on failure) or another Suno
  failure status, ``"2"`` for successFlag 2; otherwise it is the family's error code.
- Callbacks: a task created with a ``callBackUrl`` is driven in the background (without
  counting polls, so time-based steps progress when nobody polls) and also checked on
  every poll. Each callback is sent once: the terminal one, and for Suno every stage the
  task reaches (``text``, ``first``, ``complete``) or ``error``. Delivery follows KIE's
  schedule through ``sim.webhooks``: a failed attempt is retried after 1, 5 and 15 minutes
  of simulated time (:data:`RETRY_SCHEDULE_S`), then given up ("after 3 consecutive failed
  retries the system stops sending" [C]). The intervals are what the issue and
  providers.md:24 state for KIE; the research could not find them in any reachable copy of
  KIE's callback pages (only the 3 retries and the 15 s answer deadline are documented), so
  they are unverified. Every attempt is signed afresh with its own
  ``X-Webhook-Timestamp`` and ``X-Webhook-Signature`` = base64(HMAC-SHA256(key,
  ``taskId.timestamp``)) [C: docs.kie.ai/common-api/webhook-verification]; whether KIE
  re-signs a retry is not documented. The 15 s answer deadline is not applied per
  delivery: ``Webhooks`` has one client timeout for every provider.
- Account limits (off unless set: ``sim.accounts["kie"].limits``, ``POST /_sim/limits``;
  :mod:`callwarden.providers.simulator.limits`): "at most 20 new generation requests per
  10 s per account; the rest are rejected with HTTP 429, unqueued" [C][3P] is
  ``create_rate=(20, 10)``, and ``max_in_flight`` caps the tasks created but not yet in a
  terminal phase. They apply to the task families' creates that pass the key check and
  validation (not to polls, ``kie-llm`` or the credit endpoint); a refused create is the
  HTTP 429 ``{"code": 429, "msg": "Rate limit exceeded"}`` of :func:`render_error`, with
  no ``Retry-After`` (none is documented), and creates no task.
- ``kie-llm``: ``/claude/v1/messages`` answers an Anthropic message plus
  ``credits_consumed`` [O] without ``stop_sequence`` (SSE unless ``"stream": false``, KIE's
  default being true [C]); ``/{model}/v1/chat/completions`` a ``chat.completion`` with a
  top-level ``credits_consumed`` [C]; errors are real HTTP statuses with
  ``{"error": {"message", "type"}}`` [C]; ``script.hang_s`` hangs first. (The live Claude
  answer had no ``Content-Type`` at all; aiohttp always sends one, so it stays JSON.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from aiohttp import web

from callwarden.providers.kie.webhook import kie_sign
from callwarden.providers.simulator.core import (
    MAX_HANG_S,
    Account,
    Phase,
    Script,
    Simulator,
    Task,
)
from callwarden.providers.simulator.kie_render import (
    ACCOUNT_CREDITS,
    CREATE_PATHS,
    POLL_PATHS,
    callback_body,
    new_task_id,
    render,
    suno_stage_body,
    suno_stages_reached,
)
from callwarden.providers.simulator.webhooks import Sign

__all__ = ["NAME", "RETRY_SCHEDULE_S", "render_error", "routes", "signer"]

NAME: Final = "kie"
JSON: Final = "application/json"
ENVELOPE_TYPE: Final = "application/json;charset=UTF-8"  # as recorded live [O]
RETRY_SCHEDULE_S: Final = (60.0, 300.0, 900.0)  # unverified, see the module docstring
CALLBACK_TIMEOUT_S: Final = 15.0  # "answer HTTP 200 within 15 s" [C]
SERVER_ERROR: Final = "Server Error - An unexpected error occurred while processing the request"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "market": ("model",), "veo": ("prompt",), "suno": (), "kontext": ("prompt",),
    "luma": ("prompt", "videoUrl"), "runway": ("prompt",),
}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None, *,
          content_type: str = JSON) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(data),
                        headers={**(headers or {}), "Content-Type": content_type})


def _send_envelope(body: dict[str, Any], status: int = 200,
                   headers: dict[str, str] | None = None) -> web.Response:
    return _json(body, status, headers, content_type=ENVELOPE_TYPE)


def envelope(code: int, msg: str, data: Any = None) -> web.Response:
    """KIE's HTTP 200 ``{"code", "msg", "data"}`` answer."""
    return _send_envelope({"code": code, "msg": msg, "data": data})


def _bare(code: int, msg: str) -> web.Response:
    """A documented error example without a ``data`` key (400, 401, 429)."""
    return _send_envelope({"code": code, "msg": msg})


def error_body(code: int, message: str) -> dict[str, Any]:
    """The documented body of an error ``code`` (429 and 500 have their own texts)."""
    if code == 429:
        return {"code": 429, "msg": "Rate limit exceeded"}
    if code == 500:
        return {"code": 500, "msg": SERVER_ERROR, "data": None}
    return {"code": code, "msg": message, "data": None}


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False) -> web.Response:
    """In-body envelope (HTTP 200), except HTTP 429 and HTTP 5xx when not ``in_body``."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else None
    http = 200 if in_body or not (status == 429 or status >= 500) else status
    return _send_envelope(error_body(status, message), http, headers)


def _gate(sim: Simulator, request: web.Request) -> web.Response | None:
    """Cloudflare's User-Agent check, then KIE's in-body 401."""
    if not request.headers.get("User-Agent"):
        return web.Response(status=403, text="error code: 1010")
    if request.headers.get("Authorization") != f"Bearer {sim.api_key}":
        return _bare(401, "Unauthorized")
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


def signer(secret: str | None, task_id: str) -> Sign:
    """The headers of one callback attempt at unix second ``ts``: JSON, and with a webhook
    HMAC key KIE's ``X-Webhook-Timestamp``/``X-Webhook-Signature`` for that second."""
    def sign(ts: int) -> dict[str, str]:
        headers = {"Content-Type": JSON}
        if secret:
            headers["X-Webhook-Timestamp"] = str(ts)
            headers["X-Webhook-Signature"] = kie_sign(secret, task_id, ts)
        return headers
    return sign


def _send_once(sim: Simulator, task: Task, stage: str, body: dict[str, Any]) -> None:
    sent: set[str] = task.extra.setdefault("callbacks_sent", set())
    if stage in sent or not task.callback_url:
        return
    sent.add(stage)
    sim.webhooks.deliver(task.callback_url, msgspec.json.encode(body),
                         signer(sim.webhook_secrets.get(NAME), task.id), task.script.webhook,
                         schedule=RETRY_SCHEDULE_S, timeout_s=CALLBACK_TIMEOUT_S)


def _callbacks(sim: Simulator, task: Task, phase: Phase) -> None:
    if task.family == "suno":
        for stage in suno_stages_reached(task, phase):
            _send_once(sim, task, stage, suno_stage_body(sim, task, stage))
        if phase.name == "failed":
            _send_once(sim, task, "error", suno_stage_body(sim, task, "error"))
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


def _in_flight_until_terminal(sim: Simulator, task: Task) -> Callable[[], bool]:
    """Whether ``task`` has reached a terminal phase (by polls or on the simulator's
    clock), without counting a poll."""
    return lambda: task.peek(sim.clock.now()).terminal


def _create_handler(sim: Simulator, account: Account, family: str) -> Handler:
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
        refused = sim.refusal(account, request)
        if refused is not None:
            return render_error(429, f"account limit: {refused}")
        task = sim.tasks.create(NAME, family, _clean(body), _script(sim, body),
                                callback_url=body.get("callBackUrl") or None,
                                task_id=new_task_id(sim, family))
        account.accept(_in_flight_until_terminal(sim, task))
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
            return _bare(400, "taskId parameter is required")
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

CLAUDE_CREDITS: Final = 0.02  # the recorded live answer's credits_consumed [O]
CHAT_CREDITS: Final = 0.05


class _LlmCall(msgspec.Struct, frozen=True, kw_only=True):
    body: dict[str, Any]
    script: Script

    def credits(self, default: float) -> float:
        """The cost the script asks for (a hostile one included), else ``default``."""
        return default if self.script.cost is None else self.script.cost


def _llm_error(status: int, kind: str, message: str) -> web.Response:
    return _json({"error": {"message": message, "type": kind}}, status)


def _reply_text(body: dict[str, Any]) -> str:
    messages = body.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    content = last.get("content", "")
    return f"Simulated reply to: {str(content)[:80]}"


def _anthropic_message(sim: Simulator, call: _LlmCall) -> dict[str, Any]:
    """The live shape: no ``stop_sequence``, usage with only the two token counts, an id
    ``msg_<uuid>``, and ``credits_consumed`` [O]."""
    text = _reply_text(call.body)
    msg_id = uuid.UUID(int=sim.rng.getrandbits(128), version=4)
    return {"id": f"msg_{msg_id}", "type": "message",
            "role": "assistant", "model": call.body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 13, "output_tokens": len(text)},
            "credits_consumed": call.credits(CLAUDE_CREDITS)}


def _chat_completion(sim: Simulator, call: _LlmCall, model: str) -> dict[str, Any]:
    """The documented gemini-3.1-pro chat answer: a ``chat.completion`` plus a top-level
    ``credits_consumed`` and ``usage.completion_tokens_details`` [C]."""
    text = _reply_text(call.body)
    details = {"audio_tokens": 0, "text_tokens": len(text), "reasoning_tokens": 0}
    return {"id": f"chatcmpl-{sim.rng.getrandbits(96):024x}", "object": "chat.completion",
            "created": int(sim.clock.now()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 13, "completion_tokens": len(text),
                      "completion_tokens_details": details, "total_tokens": 13 + len(text)},
            "credits_consumed": call.credits(CHAT_CREDITS)}


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


async def _llm_prelude(sim: Simulator, request: web.Request) -> _LlmCall | web.Response:
    """Auth, body, script (hang, scripted failure) and validation of an LLM call."""
    if request.headers.get("Authorization") != f"Bearer {sim.api_key}":
        return _llm_error(401, "authentication_error", "Invalid or missing API key")
    body = await _body(request)
    if body is None:
        return _llm_error(400, "invalid_request_error", "body must be a JSON object")
    script = sim.script_for(NAME, body)
    if script.hang_s:
        await asyncio.sleep(min(script.hang_s, MAX_HANG_S))
    if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
        return _llm_error(400, "invalid_request_error", "model and messages are required")
    if script.end == "failed":
        digits = script.error_code or ""
        code = int(digits) if digits.isdigit() else 400
        kind = "invalid_request_error" if code < 500 else "api_error"
        return _llm_error(code, kind, script.error)
    return _LlmCall(body=body, script=script)


def _messages_handler(sim: Simulator) -> Handler:
    async def messages(request: web.Request) -> web.StreamResponse:
        call = await _llm_prelude(sim, request)
        if isinstance(call, web.Response):
            return call
        msg = _anthropic_message(sim, call)
        if call.body.get("stream", True) is not False:
            return await _sse(request, _anthropic_events(msg))
        return _json(msg)

    return messages


def _chat_handler(sim: Simulator) -> Handler:
    async def chat(request: web.Request) -> web.StreamResponse:
        call = await _llm_prelude(sim, request)
        if isinstance(call, web.Response):
            return call
        done = _chat_completion(sim, call, request.match_info["model"])
        if call.body.get("stream") is True:
            return await _sse(request, _chat_events(done))
        return _json(done)

    return chat


def _credit_handler(sim: Simulator) -> Handler:
    async def credit(request: web.Request) -> web.StreamResponse:
        return _gate(sim, request) or envelope(200, "success", ACCOUNT_CREDITS)

    return credit


def routes(sim: Simulator) -> list[web.RouteDef]:
    """Every KIE route: ``create``/``poll`` (suffixed per family), ``call``, ``credit``;
    the creates share the account's limits."""
    account = sim.accounts.enrol(NAME)
    defs: list[web.RouteDef] = []
    for family, path in CREATE_PATHS.items():
        suffix = "" if family == "market" else f".{family}"
        defs.append(web.post(path, _create_handler(sim, account, family),
                             name=f"create{suffix}"))
        defs.append(web.get(POLL_PATHS[family], _poll_handler(sim, family),
                            name=f"poll{suffix}"))
    defs += [
        web.post("/claude/v1/messages", _messages_handler(sim), name="call"),
        web.post("/{model}/v1/chat/completions", _chat_handler(sim), name="call.chat"),
        web.get("/api/v1/chat/credit", _credit_handler(sim), name="credit"),
    ]
    return defs
