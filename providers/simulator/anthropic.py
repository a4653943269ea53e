"""Simulated Anthropic Messages API: ``POST /v1/messages`` with ``stream`` off (route ``call``).

Every answer follows the shapes recorded in ``tests/fixtures/providers/anthropic/`` (sources:
the research notes ``anthropic.md``, the official SDK's types, the docs' errors and
"handling stop reasons" pages, pydantic-ai and llm-anthropic cassettes); the fidelity test
``tests/integration/providers/test_sim_fidelity_anthropic.py`` proves it field by field.

Requests: ``x-api-key`` must equal the simulator's key (else 401 ``invalid x-api-key``) and
``anthropic-version`` must be present (else 400 ``anthropic-version: header is required``),
as recorded; ``model``, ``max_tokens`` and ``messages`` are required, ``stop_sequences``
must be a list of strings; a body over 32 MB is a 413.

Messages are the newest recorded serializer: ``id`` (``msg_01`` + 22 base58 characters),
``type``, ``role``, ``model`` (echoed), ``content``, ``stop_reason``, ``stop_sequence``,
``stop_details`` (null, or the refusal object) and ``usage`` with ``input_tokens``,
``cache_creation_input_tokens``, ``cache_read_input_tokens``, ``cache_creation{ephemeral_5m,
ephemeral_1h}``, ``output_tokens``, ``service_tier``, ``inference_geo`` and
``output_tokens_details{thinking_tokens}`` (plus ``server_tool_use`` when a server tool ran).
No cost: the API reports none. A request with ``thinking`` enabled gets a ``thinking`` block
first. Headers: ``request-id`` (``req_011C`` + 20), ``anthropic-organization-id`` and the
recorded ``anthropic-ratelimit-{input-tokens,output-tokens,tokens}-{limit,remaining,reset}``;
``content-type: application/json`` (no charset), as recorded.

The script (``_sim`` in the body, else queued, else default) drives the answer. Its
``stop_reason`` says how the message stops:

* ``None`` / ``end_turn``: the reply (``output`` when it is a string); a requested stop
  sequence that occurs in it cuts it there (``stop_sequence``), as the live API does.
* ``stop_sequence``: the text stops *before* the first requested sequence it contains (or,
  if it contains none, the model is taken to write the first one next); ``stop_sequence``
  holds it. The request must have ``stop_sequences``.
* ``max_tokens``: the text is cut and ``output_tokens == max_tokens``; with thinking on, the
  budget runs out inside the thinking block, so there is no text block at all (row 9).
* ``tool_use``: only ``tool_use`` blocks, no text (row 10), calling ``tool_choice``'s tool or
  the first client tool, with ``output`` (a dict) as its input. The request needs ``tools``.
* ``pause_turn``: a finished web search, then a ``server_tool_use`` with no result yet
  (row 11). The request needs a ``web_search_*`` server tool.
* ``model_context_window_exceeded``: the text is cut; input plus output fill the window.
* ``refusal`` (also ``end="failed"`` with ``error_code="refusal"``): HTTP 200, ``content:
  []``, ``output_tokens: 0``, ``stop_details{type: "refusal", category, explanation}``
  (row 12); ``error_code`` may name the category.
* any other value is sent as is (the SDK says stop reasons may grow).

A script the request cannot support answers 400 ``invalid _sim script: ...``.
``hang_s`` delays the answer; ``end="stuck"`` never answers (until the hang cap);
``end="vanished"`` answers 404 ``model: <name>``; ``end="failed"`` answers the error whose
``error.type`` is ``error_code`` (default ``api_error``; ``conflict_error`` is a 409) with
message ``error``, or, for ``error_code="enforced_spend_limit_reached"``, the usage-tier
spend cap: 429 ``rate_limit_error`` with ``error.details.error_code`` and no ``retry-after``.

Errors: ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with the docs'
HTTP -> ``error.type`` table. ``retry-after`` (whole seconds) only on a 429 (docs), none on
529 (live 529s are reported without one), never ``retry-after-ms`` (read by the SDK, never
seen from the API). ``error.details`` only where recorded (the spend cap).
"""

from __future__ import annotations

import asyncio
import base64
import math
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec
from aiohttp import web

from callwarden.events.errors import CallwardenError
from callwarden.providers.simulator.core import MAX_HANG_S, Script, Simulator

__all__ = ["ERROR_TYPES", "NAME", "REFUSAL_CATEGORIES", "SPEND_CAP_CODE", "render_error",
           "routes"]

NAME = "anthropic"
MAX_BODY = 32 * 1024 * 1024
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
    403: "permission_error", 404: "not_found_error", 409: "conflict_error",
    413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
    504: "timeout_error", 529: "overloaded_error",
}
STATUS_OF_TYPE = {etype: status for status, etype in ERROR_TYPES.items()}
SPEND_CAP_CODE = "enforced_spend_limit_reached"
REFUSAL_CATEGORIES = frozenset(
    {"cyber", "bio", "frontier_llm", "reasoning_extraction", "general_harms"})
CONTEXT_WINDOW = 200_000
ORGANIZATION_ID = "00000000-0000-4000-8000-000000000000"
# Per-minute limits as in the recorded answer headers (llm-anthropic test_async_prompt.yaml).
RATE_LIMITS: dict[str, int] = {"input-tokens": 2_000_000, "output-tokens": 400_000,
                               "tokens": 2_400_000}
DEFAULT_RETRY_AFTER_S = 1.0
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_SYSTEM_RNG = secrets.SystemRandom()


class ScriptError(CallwardenError, ValueError):
    """A ``_sim`` script the request cannot support (answered as a 400)."""


# --- ids and headers -----------------------------------------------------------------------

def _base58(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(_BASE58, k=size))


def _request_id() -> str:
    """``req_011C`` + 20 base58 characters, as in recent recordings."""
    return "req_011C" + _base58(_SYSTEM_RNG, 20)


def _ident(rng: random.Random, prefix: str) -> str:
    """``msg_01…``, ``toolu_01…``, ``srvtoolu_01…``: 24 characters after the prefix."""
    return f"{prefix}_01{_base58(rng, 22)}"


def _opaque_blob(rng: random.Random, size: int) -> str:
    """A base64 ``signature`` / ``encrypted_content`` stand-in."""
    return base64.b64encode(rng.randbytes(size)).decode()


def _reset_at(now: float) -> str:
    """The next minute boundary, RFC 3339 with ``Z``, as the ratelimit headers send it."""
    nxt = datetime.fromtimestamp(math.floor(now / 60 + 1) * 60, tz=UTC)
    return nxt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ratelimit_headers(family: str, remaining: int, now: float) -> dict[str, str]:
    prefix = f"anthropic-ratelimit-{family}"
    return {f"{prefix}-limit": str(RATE_LIMITS[family]),
            f"{prefix}-remaining": str(max(0, remaining)), f"{prefix}-reset": _reset_at(now)}


def _answer_headers(usage: dict[str, Any], now: float) -> dict[str, str]:
    """Headers of a 200: request id, organization id and the ratelimit family."""
    used = {"input-tokens": usage["input_tokens"], "output-tokens": usage["output_tokens"]}
    used["tokens"] = used["input-tokens"] + used["output-tokens"]
    headers = {"request-id": _request_id(), "anthropic-organization-id": ORGANIZATION_ID}
    for family, limit in RATE_LIMITS.items():
        headers |= _ratelimit_headers(family, limit - used[family], now)
    return headers


def _json(body: Any, status: int, headers: dict[str, str]) -> web.Response:
    """A JSON response with ``content-type: application/json`` exactly (no charset)."""
    return web.Response(body=msgspec.json.encode(body), status=status, headers=headers,
                        content_type="application/json")


# --- errors --------------------------------------------------------------------------------

def _error_response(status: int, etype: str, message: str, *, headers: dict[str, str],
                    details: dict[str, Any] | None = None) -> web.Response:
    rid = _request_id()
    error: dict[str, Any] = {"type": etype, "message": message}
    if details is not None:
        error["details"] = details
    return _json({"type": "error", "error": error, "request_id": rid}, status,
                 {"request-id": rid, **headers})


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False) -> web.Response:
    """The Anthropic error envelope for ``status``, with the docs' ``error.type``.

    A 429 carries ``retry-after`` in whole seconds (``retry_after``, default 1 s) and the
    input-tokens ratelimit headers at 0 remaining, as documented; no other status carries
    ``retry-after`` (live 529s come without one). ``in_body`` is ignored: a non-streaming
    call never gets an error under HTTP 200 (the docs put those in SSE streams only)."""
    del in_body
    etype = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    headers: dict[str, str] = {}
    if status == 429:
        wait = DEFAULT_RETRY_AFTER_S if retry_after is None else retry_after
        headers = {"retry-after": str(max(0, math.ceil(wait))),
                   **_ratelimit_headers("input-tokens", 0, time.time())}
    return _error_response(status, etype, message, headers=headers)


def _spend_cap(message: str) -> web.Response:
    """The usage-tier spend cap: 429 ``rate_limit_error`` with ``error.details.error_code``
    and no ``retry-after`` (docs errors, 429 row): no retry succeeds before it resets."""
    return _error_response(429, "rate_limit_error", message, headers={},
                           details={"error_code": SPEND_CAP_CODE})


def _scripted_error(script: Script) -> web.Response:
    code = script.error_code or "api_error"
    if code == SPEND_CAP_CODE:
        return _spend_cap(script.error)
    return render_error(STATUS_OF_TYPE.get(code, 500), script.error)


# --- the request ---------------------------------------------------------------------------

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
    stops = body.get("stop_sequences", [])
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        return "stop_sequences: Input should be a list of non-empty strings"
    if not isinstance(body.get("tools", []), list):
        return "tools: Input should be a valid list"
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


@dataclass(frozen=True)
class _Ask:
    """What an answer is built from: the request, its script and the simulator's rng."""

    body: dict[str, Any]
    script: Script
    rng: random.Random

    @property
    def prompt(self) -> str:
        return _last_user_text(self.body["messages"])

    @property
    def max_tokens(self) -> int:
        return int(self.body["max_tokens"])

    @property
    def thinking(self) -> bool:
        """Extended thinking requested (``thinking.type`` enabled or adaptive)."""
        spec = self.body.get("thinking")
        return isinstance(spec, dict) and spec.get("type") in ("enabled", "adaptive")

    @property
    def stop_sequences(self) -> list[str]:
        return list(self.body.get("stop_sequences") or [])

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [t for t in self.body.get("tools") or [] if isinstance(t, dict)]

    def reply(self) -> str:
        """The text the model writes: the script's ``output`` string, else an echo."""
        out = self.script.output
        return out if isinstance(out, str) else f"Simulated reply to: {self.prompt[:200]}"


# --- the answer ----------------------------------------------------------------------------

@dataclass
class _Answer:
    """A message's content and how it stopped, before ids and usage are added."""

    stop_reason: str
    content: list[dict[str, Any]] = field(default_factory=list)
    stop_sequence: str | None = None
    stop_details: dict[str, Any] | None = None
    thinking_tokens: int = 0
    output_tokens: int | None = None  # None: counted from the content
    input_tokens: int | None = None  # None: counted from the request
    web_search_requests: int | None = None
    inference_geo: str = "global"


def _tokens(text: str) -> int:
    return len(text) // 4 + (1 if text else 0)


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _thinking_block(ask: _Ask, text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": _opaque_blob(ask.rng, 96)}


def _with_thinking(ask: _Ask, answer: _Answer) -> _Answer:
    """Prefix a thinking block when the request enabled thinking."""
    if not ask.thinking:
        return answer
    thought = f"The user asks: {ask.prompt[:120]}. Let me answer directly."
    answer.content.insert(0, _thinking_block(ask, thought))
    answer.thinking_tokens = _tokens(thought)
    if answer.output_tokens is not None:  # a fixed count (a cut answer) includes thinking
        answer.thinking_tokens = min(answer.thinking_tokens, answer.output_tokens)
    return answer


def _first_stop(text: str, sequences: list[str]) -> tuple[int, str] | None:
    """Where the earliest requested stop sequence starts in ``text``, and which one."""
    found = [(text.find(s), s) for s in sequences if s in text]
    return min(found) if found else None


def _natural(ask: _Ask) -> _Answer:
    """``end_turn``, unless a requested stop sequence occurs in the reply."""
    text = ask.reply()
    hit = _first_stop(text, ask.stop_sequences)
    if hit is None:
        return _Answer("end_turn", [_text(text)])
    return _Answer("stop_sequence", [_text(text[:hit[0]])], stop_sequence=hit[1])


def _stop_sequence(ask: _Ask) -> _Answer:
    """Stopped on a requested sequence: the text ends before it (pydantic-ai cassette)."""
    if not ask.stop_sequences:
        raise ScriptError("stop_reason stop_sequence needs stop_sequences in the request")
    text = ask.reply()
    hit = _first_stop(text, ask.stop_sequences) or (len(text), ask.stop_sequences[0])
    return _Answer("stop_sequence", [_text(text[:hit[0]])], stop_sequence=hit[1])


def _cut(text: str, max_tokens: int) -> str:
    """``text`` cut mid-way (never more than ``max_tokens`` worth of it)."""
    return text[: max(1, min(len(text) // 2, max_tokens * 4))]


def _max_tokens(ask: _Ask) -> _Answer:
    """The budget ran out: mid-text, or with thinking on inside the thinking block (no text
    block at all, PiPiMink#45); ``output_tokens`` is the whole ``max_tokens``."""
    if ask.thinking:
        thought = _cut(f"Let me work through this step by step. First, {ask.prompt}",
                       ask.max_tokens)
        return _Answer("max_tokens", [_thinking_block(ask, thought)],
                       thinking_tokens=max(0, ask.max_tokens - 1),
                       output_tokens=ask.max_tokens)
    return _Answer("max_tokens", [_text(_cut(ask.reply(), ask.max_tokens))],
                   output_tokens=ask.max_tokens)


def _context_window(ask: _Ask) -> _Answer:
    """The answer filled the context window: text cut, input + output = the window."""
    output = max(1, ask.max_tokens // 2)
    answer = _Answer("model_context_window_exceeded",
                     [_text(_cut(ask.reply(), ask.max_tokens))], output_tokens=output,
                     input_tokens=CONTEXT_WINDOW - output)
    return _with_thinking(ask, answer)


def _called_tool(ask: _Ask) -> str:
    """``tool_choice``'s tool, else the first client tool (one with no server ``type``)."""
    choice = ask.body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "tool" and choice.get("name"):
        return str(choice["name"])
    for tool in ask.tools:
        if tool.get("type") in (None, "custom") and isinstance(tool.get("name"), str):
            return str(tool["name"])
    raise ScriptError("stop_reason tool_use needs a client tool in the request's tools")


def _tool_use(ask: _Ask) -> _Answer:
    """Only ``tool_use`` blocks, no text (pydantic-ai test_anthropic_tool_output)."""
    tool_input = ask.script.output if isinstance(ask.script.output, dict) else {}
    block = {"type": "tool_use", "id": _ident(ask.rng, "toolu"), "name": _called_tool(ask),
             "input": tool_input}
    return _with_thinking(ask, _Answer("tool_use", [block]))


def _web_search_tool(ask: _Ask) -> str:
    for tool in ask.tools:
        if str(tool.get("type", "")).startswith("web_search_"):
            return str(tool.get("name") or "web_search")
    raise ScriptError("stop_reason pause_turn needs a web_search server tool in the request")


def _search(ask: _Ask, name: str, query: str) -> dict[str, Any]:
    return {"type": "server_tool_use", "id": _ident(ask.rng, "srvtoolu"), "name": name,
            "input": {"query": query}}


def _search_result(ask: _Ask, call: dict[str, Any]) -> dict[str, Any]:
    hit = {"type": "web_search_result", "url": "https://example.com/search-result",
           "title": f"Result for {call['input']['query'][:60]}",
           "encrypted_content": _opaque_blob(ask.rng, 120), "page_age": "5 days ago"}
    return {"type": "web_search_tool_result", "tool_use_id": call["id"], "content": [hit]}


def _pause_turn(ask: _Ask) -> _Answer:
    """A server-tool loop paused: one finished search, then a ``server_tool_use`` with no
    result yet (pydantic-ai test_pause_turn_web_search_vcr)."""
    name = _web_search_tool(ask)
    first = _search(ask, name, ask.prompt[:100] or "search")
    content = [_text("I'll search for that."), first, _search_result(ask, first),
               _text("Let me search once more:"),
               _search(ask, name, f"{ask.prompt[:80]} latest")]
    return _with_thinking(ask, _Answer("pause_turn", content, web_search_requests=1))


def _refusal(ask: _Ask) -> _Answer:
    """HTTP 200 with ``content: []``, no output tokens and ``stop_details`` (llm-anthropic
    test_refusal_raises)."""
    code = ask.script.error_code
    category = code if code in REFUSAL_CATEGORIES else "general_harms"
    details = {"type": "refusal", "category": category,
               "explanation": "This request was blocked as it seems to violate Anthropic's "
                              "Usage Policy. To learn more, visit "
                              "https://www.anthropic.com/legal/aup."}
    return _Answer("refusal", [], stop_details=details, output_tokens=0,
                   inference_geo="not_available")


def _unlisted(ask: _Ask) -> _Answer:
    """A stop reason the API may add later: the reply, stopped for ``stop_reason``."""
    return _Answer(str(ask.script.stop_reason), [_text(ask.reply())])


def _end_turn(ask: _Ask) -> _Answer:
    return _with_thinking(ask, _natural(ask))


def _sequence_hit(ask: _Ask) -> _Answer:
    return _with_thinking(ask, _stop_sequence(ask))


_BUILDERS: dict[str, Callable[[_Ask], _Answer]] = {
    "end_turn": _end_turn, "stop_sequence": _sequence_hit, "max_tokens": _max_tokens,
    "model_context_window_exceeded": _context_window, "tool_use": _tool_use,
    "pause_turn": _pause_turn, "refusal": _refusal,
}


def _answer(ask: _Ask) -> _Answer:
    stop = ask.script.stop_reason or "end_turn"
    if ask.script.end == "failed":  # only error_code="refusal" reaches here
        stop = "refusal"
    build = _BUILDERS.get(stop, _unlisted)
    return build(ask)


def _output_tokens(answer: _Answer) -> int:
    if answer.output_tokens is not None:
        return answer.output_tokens
    texts = [b["text"] for b in answer.content if b["type"] == "text"]
    blocks = sum(1 for b in answer.content if b["type"] not in ("text", "thinking"))
    return answer.thinking_tokens + sum(_tokens(t) for t in texts) + 20 * blocks


def _usage(body: dict[str, Any], answer: _Answer) -> dict[str, Any]:
    """The recorded usage keys (newest serializer); token counts only, no cost."""
    input_tokens = answer.input_tokens
    if input_tokens is None:
        input_tokens = max(1, len(msgspec.json.encode(body["messages"])) // 4)
    usage: dict[str, Any] = {
        "input_tokens": input_tokens, "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": _output_tokens(answer), "service_tier": "standard",
        "inference_geo": answer.inference_geo,
        "output_tokens_details": {"thinking_tokens": answer.thinking_tokens},
    }
    if answer.web_search_requests is not None:
        usage["server_tool_use"] = {"web_search_requests": answer.web_search_requests}
    return usage


def _message(ask: _Ask, answer: _Answer) -> dict[str, Any]:
    return {
        "id": _ident(ask.rng, "msg"), "type": "message", "role": "assistant",
        "model": ask.body["model"], "content": answer.content,
        "stop_reason": answer.stop_reason, "stop_sequence": answer.stop_sequence,
        "stop_details": answer.stop_details, "usage": _usage(ask.body, answer),
    }


async def _scripted(sim: Simulator, body: dict[str, Any], script: Script) -> web.Response:
    if script.hang_s:
        await asyncio.sleep(min(script.hang_s, MAX_HANG_S))
    if script.end == "stuck":
        await asyncio.sleep(MAX_HANG_S)
    if script.end == "vanished":
        return render_error(404, f"model: {body['model']}")
    if script.end == "failed" and script.error_code != "refusal":
        return _scripted_error(script)
    ask = _Ask(body=body, script=script, rng=sim.rng)
    try:
        message = _message(ask, _answer(ask))
    except ScriptError as exc:
        return render_error(400, f"invalid _sim script: {exc}")
    return _json(message, 200, _answer_headers(message["usage"], sim.clock.now()))


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
