"""Replicate clients: the pure builders and parsers of :mod:`callwarden.providers.replicate.wire`
glued to :func:`callwarden.providers.transport.send` (the only I/O)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from callwarden.providers.base import Endpoint
from callwarden.providers.errors import (
    UnknownProviderKind,
)
from callwarden.providers.kinds import KINDS, KindSpec
from callwarden.providers.media_guard import MediaPolicy
from callwarden.providers.outcomes import (
    PollOutcome,
)
from callwarden.providers.raw import RawResponse
from callwarden.providers.replicate.wire import (
    PROVIDER,
    Collection,
    IsMedia,
    Request,
    build_get_request,
    build_prediction_request,
    build_training_request,
    classify_replicate,
    classify_replicate_poll,
    parse_created,
    parse_prediction,
)
from callwarden.providers.transport import (
    DEFAULT_POLICY,
    Classify,
    RetryPolicy,
    Sleep,
    send,
)

__all__ = ["ReplicatePredictionClient", "ReplicateTrainingClient", "replicate_client_for"]


def _on_media_hosts(spec: KindSpec, endpoint: Endpoint) -> IsMedia:
    urls = (u for u in (endpoint.base_url, endpoint.media_base_url) if u)
    return MediaPolicy.build(spec.media_hosts, urls).allows_url


class _ReplicateClient:
    collection: Collection
    family: str

    def __init__(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, kind: str,
        policy: RetryPolicy = DEFAULT_POLICY, sleep: Sleep = asyncio.sleep, *,
        now: Callable[[], float] = time.monotonic, is_media: IsMedia | None = None,
    ) -> None:
        """``is_media``: which URLs in an output are files (default: those on the kind's
        media hosts or on ``endpoint``'s host and port); every other URL is text."""
        spec = KINDS.get(kind)
        if spec is None or spec.provider != PROVIDER or spec.family != self.family:
            raise UnknownProviderKind(f"not a Replicate {self.family} kind: {kind!r}",
                                      provider=PROVIDER)
        self.kind = kind
        self._session, self._endpoint = session, endpoint
        self._policy, self._sleep, self._now = policy, sleep, now
        self._is_media = is_media if is_media is not None else _on_media_hosts(spec, endpoint)

    async def _send(self, req: Request, *, classify: Classify, idempotent: bool) -> RawResponse:
        url = self._endpoint.base_url.rstrip("/") + req.path
        return await send(self._session, req.method, url, provider=PROVIDER,
                          classify=classify, policy=self._policy, idempotent=idempotent,
                          sleep=self._sleep, headers=req.headers, json=req.json)

    def _build_create(self, request: Mapping[str, Any], callback_url: str | None) -> Request:
        raise NotImplementedError

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        req = self._build_create(request, callback_url)
        raw = await self._send(req, classify=classify_replicate, idempotent=False)
        return parse_created(raw)

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        req = build_get_request(self.collection, task_id, api_key=self._endpoint.api_key)
        raw = await self._send(req, classify=classify_replicate_poll, idempotent=True)
        return parse_prediction(raw, is_media=self._is_media)

class ReplicatePredictionClient(_ReplicateClient):
    """``replicate-prediction``: ``request`` = ``{"version" | "model", "input"}``."""

    collection: Collection = "predictions"
    family = "prediction"

    def _build_create(self, request: Mapping[str, Any], callback_url: str | None) -> Request:
        return build_prediction_request(request, api_key=self._endpoint.api_key,
                                        callback_url=callback_url)

class ReplicateTrainingClient(_ReplicateClient):
    """``replicate-training``: ``request`` = ``{"model", "version", "destination",
    "input"}``."""

    collection: Collection = "trainings"
    family = "training"

    def _build_create(self, request: Mapping[str, Any], callback_url: str | None) -> Request:
        return build_training_request(request, api_key=self._endpoint.api_key,
                                      callback_url=callback_url)

def replicate_client_for(
    kind: str, session: aiohttp.ClientSession, endpoint: Endpoint, *,
    policy: RetryPolicy = DEFAULT_POLICY, sleep: Sleep = asyncio.sleep,
    is_media: IsMedia | None = None,
) -> ReplicatePredictionClient | ReplicateTrainingClient:
    """The client for a ``replicate-*`` kind (``is_media``: which output URLs are files;
    default: those on the kind's media hosts or the endpoint's host)."""
    classes: Sequence[type[ReplicatePredictionClient | ReplicateTrainingClient]] = (
        ReplicatePredictionClient, ReplicateTrainingClient)
    for cls in classes:
        if KINDS.get(kind) is not None and KINDS[kind].family == cls.family:
            return cls(session, endpoint, kind, policy, sleep, is_media=is_media)
    raise UnknownProviderKind(f"not a Replicate kind: {kind!r}", provider=PROVIDER)
