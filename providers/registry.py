"""``provider_kind`` -> the client that serves it. The one dispatch point by kind.

The engine asks here for a client and gets an :class:`~providers.base.AsyncKindClient` or a
:class:`~providers.base.SyncKindClient`; an unknown kind is
:class:`~providers.errors.UnknownProviderKind` (the reconciler sweeps such calls).
"""

from __future__ import annotations

import asyncio

import aiohttp
import msgspec

from providers.anthropic import anthropic_client_for
from providers.base import AsyncKindClient, ProviderSettings, SyncKindClient
from providers.elevenlabs import elevenlabs_client_for, media_auth_headers
from providers.errors import UnknownProviderKind
from providers.kie import kie_client_for
from providers.kinds import get_kind
from providers.media import DEFAULT_MEDIA_TYPES
from providers.replicate import replicate_client_for
from providers.transport import Sleep

__all__ = ["MediaFetch", "client_for", "media_fetch_for"]


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


class MediaFetch(msgspec.Struct, frozen=True, kw_only=True):
    """How to download a kind's result URLs: extra headers (ElevenLabs serves dubbed
    audio only with the API key) and the content types accepted (``None``: any, for
    Replicate trainings whose output is model weights)."""

    headers: dict[str, str] | None = None
    allowed_types: frozenset[str] | None = DEFAULT_MEDIA_TYPES


def media_fetch_for(kind: str | None, settings: ProviderSettings) -> MediaFetch:
    """The download options for ``kind``'s results (defaults for an unknown kind)."""
    if kind is None:
        return MediaFetch()
    try:
        spec = get_kind(kind)
    except UnknownProviderKind:
        return MediaFetch()
    if spec.provider == "elevenlabs":
        return MediaFetch(headers=media_auth_headers(settings.elevenlabs))
    if spec.name == "replicate-training":
        return MediaFetch(allowed_types=None)
    return MediaFetch()
