"""KIE.ai clients (the only I/O of :mod:`callwarden.providers.kie`): one polled client for the six
task families, one sync client for ``kie-llm``, and :func:`kie_client_for` to pick one by
``provider_kind``.

Request builders (:mod:`callwarden.providers.kie.requests`) and parsers
(:mod:`callwarden.providers.kie.wire`,
:mod:`callwarden.providers.kie.llm`) are pure; the client classes only send.

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
from typing import Any, Final

import aiohttp

from callwarden.providers.base import AsyncKindClient, Endpoint, SyncKindClient
from callwarden.providers.errors import UnknownProviderKind
from callwarden.providers.kie.llm import parse_llm
from callwarden.providers.kie.requests import (
    Request,
    build_create_request,
    build_llm_request,
    build_poll_request,
)
from callwarden.providers.kie.wire import (
    PROVIDER,
    classify_kie,
    classify_kie_poll,
    parse_poll,
    parse_task_id,
)
from callwarden.providers.kinds import KINDS
from callwarden.providers.llm_stop import StopPolicy
from callwarden.providers.outcomes import (
    Failed,
    NotFound,
    PollOutcome,
    Running,
    Succeeded,
)
from callwarden.providers.raw import RawResponse
from callwarden.providers.transport import DEFAULT_POLICY, Classify, RetryPolicy, Sleep, send

__all__ = ["NULL_GRACE_S", "RECORD_PENDING", "KieLlmClient", "KieTaskClient", "kie_client_for"]


NULL_GRACE_S: Final = 60.0

RECORD_PENDING: Final = "record_pending"

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
