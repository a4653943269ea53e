"""``provider_kind`` -> the client that serves it: the one dispatch point by kind, a table.

:data:`PROVIDERS` holds one :class:`Provider` entry per provider name (its client factory,
its endpoint in :class:`~callwarden.providers.base.ProviderSettings`, how its media are
fetched, its webhook scheme); :func:`register` adds one. The engine asks
:func:`client_for` for a client and gets an
:class:`~callwarden.providers.base.AsyncKindClient` or a
:class:`~callwarden.providers.base.SyncKindClient`. A kind that :mod:`callwarden.providers.kinds`
does not know, or whose provider has no entry here, is
:class:`~callwarden.providers.errors.UnknownProviderKind` (the reconciler sweeps such
calls) — never another provider's client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast

import aiohttp
import msgspec

from callwarden.providers.anthropic.client import anthropic_client_for
from callwarden.providers.base import AsyncKindClient, Endpoint, ProviderSettings, SyncKindClient
from callwarden.providers.elevenlabs import webhook as elevenlabs_webhook
from callwarden.providers.elevenlabs.client import elevenlabs_client_for
from callwarden.providers.elevenlabs.operations import media_auth_headers
from callwarden.providers.errors import MediaExpired, TaskNotFound, UnknownProviderKind
from callwarden.providers.kie import webhook as kie_webhook
from callwarden.providers.kie.client import kie_client_for
from callwarden.providers.kinds import get_kind
from callwarden.providers.media import ANY_FILE, DEFAULT_MEDIA_TYPES, Credentials
from callwarden.providers.media_guard import MediaPolicy
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome
from callwarden.providers.replicate import webhook as replicate_webhook
from callwarden.providers.replicate.client import replicate_client_for
from callwarden.providers.transport import Sleep
from callwarden.providers.webhooks import WebhookScheme

__all__ = ["PROVIDERS", "WEBHOOKS", "ClientRequest", "MediaFetch", "Provider", "client_for",
           "media_fetch_for", "media_url_test", "poll_task", "provider_for", "register"]

class MediaFetch(msgspec.Struct, frozen=True, kw_only=True):
    """How to download a kind's result URLs: where from (``policy``: the kind's media
    hosts and its provider's configured endpoint, plus an operator allow-list), the
    credentials sent to the provider's API endpoint only (ElevenLabs serves dubbed audio
    only with the API key; no other host media may come from ever gets it) and the content
    types accepted (``ANY_FILE`` for Replicate, whose models may output any file)."""

    policy: MediaPolicy = MediaPolicy()
    credentials: Credentials | None = None
    allowed_types: frozenset[str] | None = DEFAULT_MEDIA_TYPES


@dataclass(frozen=True, kw_only=True)
class ClientRequest:
    """What a :class:`Provider`'s factory gets to build the client of one call."""

    kind: str
    session: aiohttp.ClientSession
    settings: ProviderSettings
    operation: str | None = None
    callback_url: str | None = None
    sleep: Sleep = asyncio.sleep


@dataclass(frozen=True, kw_only=True)
class Provider:
    """One provider's entry: ``client`` builds the client of a call; ``endpoint`` picks its
    :class:`~callwarden.providers.base.Endpoint` out of the settings (the media guard
    allows its hosts); ``media`` adjusts how its results are downloaded; ``webhook`` is
    its callback scheme, if it calls back (the receiver mounts one route per scheme)."""

    name: str
    client: Callable[[ClientRequest], AsyncKindClient | SyncKindClient]
    endpoint: Callable[[ProviderSettings], Endpoint]
    media: Callable[[MediaFetch, ProviderSettings], MediaFetch] = lambda fetch, _: fetch
    webhook: WebhookScheme | None = None


PROVIDERS: dict[str, Provider] = {}
#: The providers that call back, by name: how their deliveries are authenticated and read
#: (:mod:`callwarden.providers.webhooks`). Kept equal to the schemes in :data:`PROVIDERS`.
WEBHOOKS: dict[str, WebhookScheme] = {}


def register(provider: Provider) -> None:
    """Add (or replace) ``provider``'s entry, and its webhook scheme."""
    PROVIDERS[provider.name] = provider
    WEBHOOKS.pop(provider.name, None)
    if provider.webhook is not None:
        WEBHOOKS[provider.name] = provider.webhook


def provider_for(kind: str) -> Provider:
    """The entry serving ``kind``; :class:`UnknownProviderKind` for a kind that is not
    registered or whose provider has no entry."""
    spec = get_kind(kind)
    try:
        return PROVIDERS[spec.provider]
    except KeyError:
        raise UnknownProviderKind(f"{kind}: no client registered for provider "
                                  f"{spec.provider!r}") from None


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
    return provider_for(kind).client(ClientRequest(
        kind=kind, session=session, settings=settings, operation=operation,
        callback_url=callback_url, sleep=sleep))


def _kie(r: ClientRequest) -> AsyncKindClient | SyncKindClient:
    return kie_client_for(r.kind, r.session, r.settings.kie, policy=r.settings.retry,
                          sleep=r.sleep, callback_url=r.callback_url,
                          stop_policy=r.settings.stop_policy.get(r.kind))


def _replicate(r: ClientRequest) -> AsyncKindClient | SyncKindClient:
    return replicate_client_for(r.kind, r.session, r.settings.replicate,
                                policy=r.settings.retry, sleep=r.sleep)


def _elevenlabs(r: ClientRequest) -> AsyncKindClient | SyncKindClient:
    return elevenlabs_client_for(r.kind, r.session, r.settings.elevenlabs, r.operation,
                                 policy=r.settings.retry, sleep=r.sleep)


def _anthropic(r: ClientRequest) -> AsyncKindClient | SyncKindClient:
    return anthropic_client_for(r.kind, r.session, r.settings.anthropic,
                                policy=r.settings.retry, sleep=r.sleep,
                                stop_policy=r.settings.stop_policy.get(r.kind))


for _entry in (
    Provider(name="kie", client=_kie, endpoint=lambda s: s.kie, webhook=kie_webhook.SCHEME),
    Provider(name="replicate", client=_replicate, endpoint=lambda s: s.replicate,
             webhook=replicate_webhook.SCHEME,
             # a model's output may be any file (not a web page)
             media=lambda fetch, _: msgspec.structs.replace(fetch, allowed_types=ANY_FILE)),
    Provider(name="elevenlabs", client=_elevenlabs, endpoint=lambda s: s.elevenlabs,
             webhook=elevenlabs_webhook.SCHEME,
             media=lambda fetch, s: msgspec.structs.replace(
                 fetch, credentials=Credentials.for_endpoint(
                     s.elevenlabs.base_url, media_auth_headers(s.elevenlabs)))),
    Provider(name="anthropic", client=_anthropic, endpoint=lambda s: s.anthropic),
):
    register(_entry)


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


def _endpoint_urls(provider: Provider, settings: ProviderSettings) -> tuple[str, ...]:
    endpoint = provider.endpoint(settings)
    return tuple(u for u in (endpoint.base_url, endpoint.media_base_url) if u)


def media_fetch_for(kind: str | None, settings: ProviderSettings,
                    extra_hosts: tuple[str, ...] = ()) -> MediaFetch:
    """The download options for ``kind``'s results; an unknown kind may fetch only from
    ``extra_hosts`` (the operator's allow-list)."""
    try:
        spec = get_kind(kind) if kind is not None else None
        provider = provider_for(kind) if kind is not None else None
    except UnknownProviderKind:
        spec = provider = None
    if spec is None or provider is None:
        return MediaFetch(policy=MediaPolicy.build(extra_hosts, ()))
    policy = MediaPolicy.build((*spec.media_hosts, *extra_hosts),
                               _endpoint_urls(provider, settings))
    return provider.media(MediaFetch(policy=policy), settings)


def media_url_test(kinds: Iterable[str], settings: ProviderSettings) -> Callable[[str], bool]:
    """Whether a URL is on a host one of ``kinds``' result files come from: the kind's
    media hosts or its provider's configured endpoint — what makes a URL in a model's
    free-form output a file rather than text (Replicate). The operator's extra
    allow-list widens where files may be downloaded from, not what counts as one."""
    policies = [media_fetch_for(kind, settings).policy for kind in kinds]
    return lambda url: any(policy.allows_url(url) for policy in policies)
