"""ElevenLabs clients (dubbing, and the one-round-trip operations): the pure builders and
parsers of :mod:`callwarden.providers.elevenlabs.operations` glued to
:func:`callwarden.providers.transport.send` (the only I/O)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from typing import Any

import aiohttp

from callwarden.providers.base import Endpoint
from callwarden.providers.elevenlabs.operations import (
    FILE_OPERATIONS,
    SYNC_OPERATIONS,
    _operation,
    build_dubbing_create_request,
    build_dubbing_poll_request,
    build_sync_request,
    parse_dubbing_created,
    parse_dubbing_status,
    parse_sync,
)
from callwarden.providers.elevenlabs.wire import (
    PROVIDER,
    Request,
    classify_elevenlabs,
    encode_multipart,
)
from callwarden.providers.errors import TaskNotFound, UnknownProviderKind
from callwarden.providers.media import DEFAULT_MAX_BYTES as MEDIA_MAX_BYTES
from callwarden.providers.outcomes import (
    Failed,
    NotFound,
    PollOutcome,
    Succeeded,
)
from callwarden.providers.raw import RawResponse
from callwarden.providers.transport import DEFAULT_POLICY, RetryPolicy, Sleep, send

__all__ = ["ElevenLabsDubbingClient", "ElevenLabsSyncClient", "elevenlabs_client_for"]


class _Base:
    def __init__(self, session: aiohttp.ClientSession, endpoint: Endpoint, kind: str,
                 policy: RetryPolicy = DEFAULT_POLICY, sleep: Sleep = asyncio.sleep) -> None:
        self.kind = kind
        self._session, self._endpoint = session, endpoint
        self._policy, self._sleep = policy, sleep

    async def _send(self, req: Request, *, idempotent: bool,
                    max_bytes: int | None = None) -> RawResponse:
        headers = {"xi-api-key": self._endpoint.api_key, "accept": "*/*"}
        kwargs: dict[str, Any] = {"params": req.params or None}
        if req.form is not None:
            body, content_type = encode_multipart(req.form, secrets.token_hex(16))
            kwargs["data"] = body
            headers["content-type"] = content_type
        elif req.json_body is not None:
            kwargs["json"] = req.json_body
        return await send(self._session, req.method, self._endpoint.base_url + req.path,
                          provider=PROVIDER, classify=classify_elevenlabs, policy=self._policy,
                          idempotent=idempotent, sleep=self._sleep, max_bytes=max_bytes,
                          headers=headers, **kwargs)

class ElevenLabsDubbingClient(_Base):
    """``elevenlabs-async`` dubbing: create, poll and resume a ``dubbing_id``."""

    async def create(self, request: Mapping[str, Any], *, callback_url: str | None = None) -> str:
        """Start a dub (ElevenLabs takes no per-request callback URL; it is ignored)."""
        raw = await self._send(build_dubbing_create_request(request), idempotent=False)
        return parse_dubbing_created(raw)

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        try:
            raw = await self._send(build_dubbing_poll_request(task_id), idempotent=True)
        except TaskNotFound as exc:
            return NotFound(message=exc.message)
        return parse_dubbing_status(raw, base_url=self._endpoint.base_url)

class ElevenLabsSyncClient(_Base):
    """One-round-trip ElevenLabs operations (TTS, SFX, STT, voice clone, voice design,
    forced alignment), selected by ``request["operation"]``."""

    async def call(self, request: Mapping[str, Any]) -> Succeeded | Failed:
        """The operation's outcome. An audio answer (TTS, SFX) is the file itself: it may
        be as large as a media download (200 MiB, or the policy's answer limit if larger);
        the stored file's own limit (``CallConfig.media_max_bytes``) applies after."""
        operation = _operation(request)
        limit = (max(self._policy.max_answer_bytes, MEDIA_MAX_BYTES)
                 if operation in FILE_OPERATIONS else None)
        raw = await self._send(build_sync_request(request), idempotent=False, max_bytes=limit)
        return parse_sync(operation, raw)

def elevenlabs_client_for(
    kind: str, session: aiohttp.ClientSession, endpoint: Endpoint,
    operation: str | None = None, *, policy: RetryPolicy = DEFAULT_POLICY,
    sleep: Sleep = asyncio.sleep,
) -> ElevenLabsDubbingClient | ElevenLabsSyncClient:
    """The client for ``kind`` (and, under ``elevenlabs-async``, ``operation``)."""
    if kind == "elevenlabs-async" and operation in (None, "dubbing"):
        return ElevenLabsDubbingClient(session, endpoint, kind, policy, sleep)
    if kind in ("elevenlabs-async", "elevenlabs-sync") and (
            operation is None or operation in SYNC_OPERATIONS):
        return ElevenLabsSyncClient(session, endpoint, kind, policy, sleep)
    raise UnknownProviderKind(f"no ElevenLabs client for kind {kind!r} operation {operation!r}",
                              provider=PROVIDER)
