"""KIE.ai clients: one polled client for the six task families, one sync client for
``kie-llm``, and :func:`kie_client_for` to pick one by ``provider_kind``.

Request builders here and the parsers in :mod:`providers.kie_parse` are pure; the client
classes only send.

Kinds and families: ``kie-standard``, ``kie-kling3``, ``kie-lip-sync`` use the market API
(``jobs/createTask`` + ``jobs/recordInfo``); ``kie-veo``, ``kie-suno``, ``kie-kontext``,
``kie-luma``, ``kie-runway`` their own endpoints; ``kie-llm`` is a single round trip.

**The "recordInfo is null" grace window.** KIE briefly answers "no such task" right after a
task is created (reference §2). :class:`KieTaskClient` keeps, per task id it created or
polled, the time it first saw it (``now()``: unix seconds, injectable), and for the first
``null_grace_s`` seconds (default 60) reports a not-found answer (``422 recordInfo is
null``, in-body 404, Suno's ``data: null``) as ``Running(raw_state="record_pending")``;
after that it is :class:`NotFound`. A task resumed after a restart is "first seen" at its
first poll, so a vanished task costs one extra grace window, unless the caller passes the
persisted creation time to :meth:`KieTaskClient.remember`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal
from urllib.parse import quote

import aiohttp
import msgspec

from providers.anthropic import judged, message_text, message_usage
from providers.base import AsyncKindClient, Endpoint, SyncKindClient
from providers.errors import BadRequest, MalformedResponse, UnknownProviderKind
from providers.kie_parse import (
    PROVIDER,
    classify_kie,
    classify_kie_poll,
    parse_poll,
    parse_task_id,
)
from providers.kinds import KINDS
from providers.llm_stop import CHAT_FINISH, StopPolicy
from providers.outcomes import (
    Failed,
    NotFound,
    PollOutcome,
    Running,
    Succeeded,
    Usage,
    reported_cost,
    reported_number,
)
from providers.raw import RawResponse
from providers.transport import DEFAULT_POLICY, Classify, RetryPolicy, Sleep, send

__all__ = [
    "CREATE_PATHS",
    "NULL_GRACE_S",
    "POLL_PATHS",
    "RECORD_PENDING",
    "KieLlmClient",
    "KieTaskClient",
    "Request",
    "auth_headers",
    "build_create_request",
    "build_llm_request",
    "build_poll_request",
    "kie_client_for",
    "parse_llm",
]

NULL_GRACE_S: Final = 60.0
RECORD_PENDING: Final = "record_pending"

CREATE_PATHS: Final[Mapping[str, str]] = {
    "market": "/api/v1/jobs/createTask",
    "veo": "/api/v1/veo/generate",
    "suno": "/api/v1/generate",
    "kontext": "/api/v1/flux/kontext/generate",
    "luma": "/api/v1/modify/generate",
    "runway": "/api/v1/runway/generate",
}
POLL_PATHS: Final[Mapping[str, str]] = {
    "market": "/api/v1/jobs/recordInfo",
    "veo": "/api/v1/veo/record-info",
    "suno": "/api/v1/generate/record-info",
    "kontext": "/api/v1/flux/kontext/record-info",
    "luma": "/api/v1/modify/record-info",
    "runway": "/api/v1/runway/record-detail",
}



class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One HTTP request to send, relative to the endpoint's base URL."""

    method: Literal["GET", "POST"]
    path: str
    headers: dict[str, str]
    params: dict[str, str] | None = None
    json: dict[str, Any] | None = None


# -- requests (pure) -------------------------------------------------------------------------------


def auth_headers(api_key: str) -> dict[str, str]:
    """KIE auth: ``Authorization: Bearer <key>``."""
    return {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}


def _family(family: str) -> str:
    if family not in CREATE_PATHS:
        raise ValueError(f"unknown KIE family {family!r}")
    return family


def build_create_request(
    family: str, request: Mapping[str, Any], *, api_key: str, callback_url: str | None = None,
) -> Request:
    """The create request: ``request`` is the provider body as documented (market:
    ``{"model", "input"}``); ``callback_url`` becomes ``callBackUrl``. Suno refuses a
    request without one, so we refuse it first (:class:`BadRequest`)."""
    body = dict(request)
    if callback_url:
        body["callBackUrl"] = callback_url
    if _family(family) == "suno" and not body.get("callBackUrl"):
        raise BadRequest("kie-suno requires a callBackUrl (pass callback_url or configure "
                         "a default)", provider=PROVIDER)
    return Request(method="POST", path=CREATE_PATHS[family], headers=auth_headers(api_key),
                   json=body)


def build_poll_request(family: str, task_id: str, *, api_key: str) -> Request:
    """The status request for ``task_id``; never creates anything."""
    return Request(method="GET", path=POLL_PATHS[_family(family)],
                   headers=auth_headers(api_key), params={"taskId": task_id})


# -- clients ---------------------------------------------------------------------------------



async def _send(
    session: aiohttp.ClientSession, endpoint: Endpoint, req: Request, *, classify: Classify,
    policy: RetryPolicy, sleep: Sleep, idempotent: bool,
) -> RawResponse:
    return await send(
        session, req.method, endpoint.base_url.rstrip("/") + req.path, provider=PROVIDER,
        classify=classify, policy=policy, idempotent=idempotent, sleep=sleep,
        headers=req.headers, params=req.params, json=req.json,
    )


class KieTaskClient:
    """A polled KIE task of one kind (market, Veo, Suno, Kontext, Luma or Runway family).

    ``callback_url`` is the default ``callBackUrl`` for creates (mandatory for Suno).
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        endpoint: Endpoint,
        kind: str,
        policy: RetryPolicy = DEFAULT_POLICY,
        sleep: Sleep = asyncio.sleep,
        *,
        callback_url: str | None = None,
        null_grace_s: float = NULL_GRACE_S,
        now: Callable[[], float] = time.time,
    ) -> None:
        spec = KINDS.get(kind)
        if spec is None or spec.provider != PROVIDER or not spec.is_async:
            raise UnknownProviderKind(f"not a polled KIE kind: {kind!r}", provider=PROVIDER)
        self.kind = kind
        self.family = spec.family
        self._session, self._endpoint = session, endpoint
        self._policy, self._sleep = policy, sleep
        self._callback_url = callback_url
        self._grace, self._now = null_grace_s, now
        self._first_seen: dict[str, float] = {}

    def remember(self, task_id: str, first_seen: float | None = None) -> None:
        """Start (or move back) the grace window of ``task_id``; ``first_seen`` is on the
        ``now`` clock (unix seconds by default; default value: now)."""
        at = self._now() if first_seen is None else first_seen
        self._first_seen[task_id] = min(at, self._first_seen.get(task_id, at))

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        req = build_create_request(self.family, request, api_key=self._endpoint.api_key,
                                   callback_url=callback_url or self._callback_url)
        raw = await _send(self._session, self._endpoint, req, classify=classify_kie,
                          policy=self._policy, sleep=self._sleep, idempotent=False)
        task_id = parse_task_id(raw)
        self.remember(task_id)
        return task_id

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        self.remember(task_id, created_at)
        req = build_poll_request(self.family, task_id, api_key=self._endpoint.api_key)
        raw = await _send(self._session, self._endpoint, req, classify=classify_kie_poll,
                          policy=self._policy, sleep=self._sleep, idempotent=True)
        outcome = parse_poll(self.family, raw)
        if isinstance(outcome, NotFound) and self._in_grace(task_id):
            return Running(raw_state=RECORD_PENDING)
        return outcome

    def _in_grace(self, task_id: str) -> bool:
        return self._now() - self._first_seen[task_id] < self._grace


# -- kie-llm ---------------------------------------------------------------------------------


def build_llm_request(request: Mapping[str, Any], *, api_key: str) -> Request:
    """``/claude/v1/messages`` (Anthropic shape), or ``/{model}/v1/chat/completions`` when
    ``request["api"] == "chat"``. ``stream`` is always forced to false (KIE defaults it to
    true)."""
    body = {k: v for k, v in request.items() if k != "api"}
    body["stream"] = False
    if request.get("api") != "chat":
        return Request(method="POST", path="/claude/v1/messages", headers=auth_headers(api_key),
                       json=body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("kie-llm chat request without a model", provider=PROVIDER)
    return Request(method="POST", path=f"/{quote(model, safe='')}/v1/chat/completions",
                   headers=auth_headers(api_key), json=body)


def _chat_answer(body: dict[str, Any]) -> tuple[str, str | None] | None:
    """(text, stop reason) of a ``chat.completion``, or ``None`` if it is not one."""
    choices = body.get("choices")
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return None
    message, finish = choices[0].get("message"), choices[0].get("finish_reason")
    message = message if isinstance(message, dict) else {}
    text = message.get("content")
    if not (isinstance(text, str) and text):
        calls = message.get("tool_calls")
        text = msgspec.json.encode(calls).decode() if isinstance(calls, list) and calls \
            else ""
    stop = CHAT_FINISH.get(finish, finish) if isinstance(finish, str) else None
    return text, stop


def _chat_usage(body: dict[str, Any]) -> Usage:
    usage: Usage = {}
    reported = body.get("usage")
    if isinstance(reported, dict):
        for ours, theirs in (("input_tokens", "prompt_tokens"),
                             ("output_tokens", "completion_tokens")):
            number = reported_number(reported.get(theirs))
            if number is not None:
                usage[ours] = number
    if isinstance(body.get("model"), str) and body["model"]:
        usage["model"] = body["model"]
    return usage


def parse_llm(raw: RawResponse, stop_policy: StopPolicy | None = None) -> Succeeded | Failed:
    """An Anthropic message (``/claude/v1/messages``) or a ``chat.completion``: its text,
    judged by its stop reason (:mod:`providers.llm_stop`); ``cost`` is KIE's top-level
    ``credits_consumed`` (KIE credits), also in ``usage["provider_credits"]``."""
    err = classify_kie(raw)
    if err is not None:
        raise err
    body = raw.json(PROVIDER)
    if not isinstance(body, dict):
        raise MalformedResponse(f"kie-llm answer is not an object: {raw.body[:200]!r}",
                                provider=PROVIDER, status=raw.status)
    cost = reported_cost(body.get("credits_consumed"))
    if isinstance(body.get("content"), list):
        text = message_text(body["content"], raw)
        usage = message_usage(body)
    elif (chat := _chat_answer(body)) is not None:
        text, stop = chat
        body = {**body, "stop_reason": stop}
        usage = _chat_usage(body)
    else:
        raise MalformedResponse(f"kie-llm answer has neither content nor choices: "
                                f"{raw.body[:200]!r}", provider=PROVIDER, status=raw.status)
    if cost is not None:
        usage["provider_credits"] = cost
    outcome = judged(body, text, stop_policy, usage)
    return msgspec.structs.replace(outcome, cost=cost) if isinstance(outcome, Succeeded) \
        else outcome


class KieLlmClient:
    """``kie-llm``: one synchronous call, nothing to poll or resume."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        endpoint: Endpoint,
        kind: str = "kie-llm",
        policy: RetryPolicy = DEFAULT_POLICY,
        sleep: Sleep = asyncio.sleep,
        *,
        stop_policy: StopPolicy | None = None,
    ) -> None:
        if kind != "kie-llm":
            raise UnknownProviderKind(f"not kie-llm: {kind!r}", provider=PROVIDER)
        self.kind = kind
        self._session, self._endpoint = session, endpoint
        self._policy, self._sleep = policy, sleep
        self._stop_policy = stop_policy

    async def call(self, request: Mapping[str, Any]) -> Succeeded | Failed:
        req = build_llm_request(request, api_key=self._endpoint.api_key)
        raw = await _send(self._session, self._endpoint, req, classify=classify_kie,
                          policy=self._policy, sleep=self._sleep, idempotent=False)
        return parse_llm(raw, self._stop_policy)


def kie_client_for(
    kind: str,
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    policy: RetryPolicy = DEFAULT_POLICY,
    sleep: Sleep = asyncio.sleep,
    callback_url: str | None = None,
    stop_policy: StopPolicy | None = None,
) -> AsyncKindClient | SyncKindClient:
    """The client for a ``kie-*`` kind; :class:`UnknownProviderKind` for any other kind."""
    spec = KINDS.get(kind)
    if spec is None or spec.provider != PROVIDER:
        raise UnknownProviderKind(f"not a KIE kind: {kind!r}", provider=PROVIDER)
    if not spec.is_async:
        return KieLlmClient(session, endpoint, kind, policy, sleep, stop_policy=stop_policy)
    return KieTaskClient(session, endpoint, kind, policy, sleep, callback_url=callback_url)
