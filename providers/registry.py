"""``provider_kind`` -> the client that serves it. The one dispatch point by kind.

The engine asks here for a client and gets an :class:`~callwarden.providers.base.AsyncKindClient`
or a
:class:`~callwarden.providers.base.SyncKindClient`; an unknown kind is
:class:`~callwarden.providers.errors.UnknownProviderKind` (the reconciler sweeps such calls).
"""

from __future__ import annotations

import asyncio
from typing import cast

import aiohttp
import msgspec

from callwarden.providers.anthropic.client import anthropic_client_for
from callwarden.providers.base import AsyncKindClient, ProviderSettings, SyncKindClient
from callwarden.providers.elevenlabs import webhook as elevenlabs_webhook
from callwarden.providers.elevenlabs.client import elevenlabs_client_for
from callwarden.providers.elevenlabs.operations import media_auth_headers
from callwarden.providers.errors import MediaExpired, TaskNotFound, UnknownProviderKind
from callwarden.providers.kie import webhook as kie_webhook
from callwarden.providers.kie.client import kie_client_for
from callwarden.providers.kinds import get_kind
from callwarden.providers.media import ANY_FILE, DEFAULT_MEDIA_TYPES
from callwarden.providers.media_guard import MediaPolicy
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome
from callwarden.providers.replicate import webhook as replicate_webhook
from callwarden.providers.replicate.client import replicate_client_for
from callwarden.providers.transport import Sleep
from callwarden.providers.webhooks import WebhookScheme

__all__ = ["WEBHOOKS", "MediaFetch", "client_for", "media_fetch_for", "poll_task"]

#: The providers that call back, by name: how their deliveries are authenticated and read
#: (:mod:`callwarden.providers.webhooks`). The webhook receiver mounts one route per entry.
WEBHOOKS: dict[str, WebhookScheme] = {
    s.provider: s for s in (replicate_webhook.SCHEME, kie_webhook.SCHEME,
                            elevenlabs_webhook.SCHEME)}


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
                              callback_url=callback_url,
                              stop_policy=settings.stop_policy.get(kind))
    if spec.provider == "replicate":
        return replicate_client_for(kind, session, settings.replicate, policy=policy,
                                    sleep=sleep)
    if spec.provider == "elevenlabs":
        return elevenlabs_client_for(kind, session, settings.elevenlabs, operation,
                                     policy=policy, sleep=sleep)
    return anthropic_client_for(kind, session, settings.anthropic, policy=policy, sleep=sleep,
                                stop_policy=settings.stop_policy.get(kind))


async def poll_task(kind: str, task_id: str, session: aiohttp.ClientSession,
                    settings: ProviderSettings, *, created_at: float | None = None,
                    sleep: Sleep = asyncio.sleep) -> PollOutcome:
    """ONE status check of ``task_id`` of ``kind`` (no loop): the outcome, with a result
    that is gone (``MediaExpired``: Replicate's ``data_removed``) as ``Failed`` and an
    unknown task (``TaskNotFound``) as ``NotFound``; any other failure raises a
    :class:`~callwarden.providers.errors.ProviderError`. ``created_at``: when the task was created
    (unix seconds), for providers that briefly deny new tasks."""
    if not get_kind(kind).is_async:
        raise UnknownProviderKind(f"{kind} is not a polled kind")
    client = cast(AsyncKindClient, client_for(kind, session, settings, sleep=sleep))
    try:
        return await client.poll(task_id, created_at=created_at)
    except MediaExpired as exc:
        return Failed(error=f"result expired: {exc}", code="result_gone")
    except TaskNotFound as exc:
        return NotFound(message=str(exc))


class MediaFetch(msgspec.Struct, frozen=True, kw_only=True):
    """How to download a kind's result URLs: where from (``policy``: the kind's media
    hosts and its provider's configured endpoint, plus an operator allow-list), extra
    headers (ElevenLabs serves dubbed audio only with the API key) and the content types
    accepted (``ANY_FILE`` for Replicate, whose models may output any file)."""

    policy: MediaPolicy = MediaPolicy()
    headers: dict[str, str] | None = None
    allowed_types: frozenset[str] | None = DEFAULT_MEDIA_TYPES


def _endpoint_urls(provider: str, settings: ProviderSettings) -> tuple[str, ...]:
    endpoint = {"kie": settings.kie, "replicate": settings.replicate,
                "elevenlabs": settings.elevenlabs, "anthropic": settings.anthropic}[provider]
    return tuple(u for u in (endpoint.base_url, endpoint.media_base_url) if u)


def media_fetch_for(kind: str | None, settings: ProviderSettings,
                    extra_hosts: tuple[str, ...] = ()) -> MediaFetch:
    """The download options for ``kind``'s results; an unknown kind may fetch only from
    ``extra_hosts`` (the operator's allow-list)."""
    try:
        spec = get_kind(kind) if kind is not None else None
    except UnknownProviderKind:
        spec = None
    if spec is None:
        return MediaFetch(policy=MediaPolicy.build(extra_hosts, ()))
    policy = MediaPolicy.build((*spec.media_hosts, *extra_hosts),
                               _endpoint_urls(spec.provider, settings))
    if spec.provider == "elevenlabs":
        return MediaFetch(policy=policy, headers=media_auth_headers(settings.elevenlabs))
    if spec.provider == "replicate":  # a model's output may be any file (not a web page)
        return MediaFetch(policy=policy, allowed_types=ANY_FILE)
    return MediaFetch(policy=policy)
