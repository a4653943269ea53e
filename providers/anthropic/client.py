"""The Anthropic client (``anthropic-sync``): :mod:`callwarden.providers.anthropic.wire`'s pure
builder and parsers glued to :func:`callwarden.providers.transport.send` (the only I/O)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec

from callwarden.providers.anthropic.wire import (
    KIND,
    PROVIDER,
    build_messages_request,
    classify_anthropic,
    parse_message,
)
from callwarden.providers.base import Endpoint
from callwarden.providers.errors import (
    UnknownProviderKind,
)
from callwarden.providers.llm_stop import StopPolicy
from callwarden.providers.outcomes import Failed, Succeeded
from callwarden.providers.transport import (
    DEFAULT_POLICY,
    RetryPolicy,
    Sleep,
    send,
)

__all__ = ["AnthropicClient", "anthropic_client_for"]


class AnthropicClient:
    """``anthropic-sync``: one Messages call per job; ``stop_policy`` overrides which
    stop reasons are results (:mod:`callwarden.providers.llm_stop`)."""

    def __init__(self, session: aiohttp.ClientSession, endpoint: Endpoint,
                 kind: str = KIND, policy: RetryPolicy = DEFAULT_POLICY,
                 sleep: Sleep = asyncio.sleep, *,
                 stop_policy: StopPolicy | None = None) -> None:
        self.kind = kind
        self._session, self._endpoint = session, endpoint
        self._policy, self._sleep = policy, sleep
        self._stop_policy = stop_policy

    async def call(self, request: Mapping[str, Any]) -> Succeeded | Failed:
        req = build_messages_request(request)
        headers = {"x-api-key": self._endpoint.api_key, **req.headers}
        raw = await send(self._session, "POST", self._endpoint.base_url + req.path,
                         provider=PROVIDER, classify=classify_anthropic, policy=self._policy,
                         idempotent=False, sleep=self._sleep, headers=headers,
                         data=msgspec.json.encode(req.body))
        return parse_message(raw, self._stop_policy)

def anthropic_client_for(
    kind: str, session: aiohttp.ClientSession, endpoint: Endpoint, *,
    policy: RetryPolicy = DEFAULT_POLICY, sleep: Sleep = asyncio.sleep,
    stop_policy: StopPolicy | None = None,
) -> AnthropicClient:
    """The client for ``anthropic-sync``; :class:`UnknownProviderKind` for anything else."""
    if kind != KIND:
        raise UnknownProviderKind(f"no Anthropic client for kind {kind!r}", provider=PROVIDER)
    return AnthropicClient(session, endpoint, kind, policy, sleep, stop_policy=stop_policy)
