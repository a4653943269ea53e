"""``provider_kind`` -> the client that serves it. The one dispatch point by kind.

The engine asks here for a client and gets an :class:`~providers.base.AsyncKindClient` or a
:class:`~providers.base.SyncKindClient`; an unknown kind is
:class:`~providers.errors.UnknownProviderKind` (the reconciler sweeps such calls).
"""

from __future__ import annotations

import asyncio

import aiohttp

from providers.anthropic import anthropic_client_for
from providers.base import AsyncKindClient, ProviderSettings, SyncKindClient
from providers.elevenlabs import elevenlabs_client_for
from providers.kie import kie_client_for
from providers.kinds import get_kind
from providers.replicate import replicate_client_for
from providers.transport import Sleep

__all__ = ["client_for"]


def client_for(
    kind: str,
    session: aiohttp.ClientSession,
    settings: ProviderSettings,
    *,
    operation: str | None = None,
    callback_url: str | None = None,
    sleep: Sleep = asyncio.sleep,
) -> AsyncKindClient | SyncKindClient:
    """The client for one call of ``kind`` (``operation`` selects an ElevenLabs
    operation; ``callback_url`` is passed to KIE, whose Suno API requires one)."""
    spec = get_kind(kind)
    policy = settings.retry
    if spec.provider == "kie":
        return kie_client_for(kind, session, settings.kie, policy=policy, sleep=sleep,
                              callback_url=callback_url)
    if spec.provider == "replicate":
        return replicate_client_for(kind, session, settings.replicate, policy=policy,
                                    sleep=sleep)
    if spec.provider == "elevenlabs":
        return elevenlabs_client_for(kind, session, settings.elevenlabs, operation,
                                     policy=policy, sleep=sleep)
    return anthropic_client_for(kind, session, settings.anthropic, policy=policy, sleep=sleep)
