"""``provider_kind`` -> the client that serves it: the one dispatch point by kind, a table.

A host's adapter imports what it needs from here: :class:`Provider`, ``KindSpec`` (from
:mod:`callwarden.providers.kinds`) and ``Polled`` (:mod:`callwarden.providers.polled`).

:data:`PROVIDERS` holds one :class:`Provider` entry per provider name (its client factory,
its endpoint in :class:`~callwarden.providers.base.ProviderSettings`, how its media are
fetched, its webhook scheme, and the kinds it serves); :func:`register` adds one — the
four built-in providers and a host's own alike (a host's adapter, loaded by
:mod:`callwarden.providers.adapters`). The engine asks
:func:`client_for` for a client and gets an
:class:`~callwarden.providers.base.AsyncKindClient` or a
:class:`~callwarden.providers.base.SyncKindClient`. A kind that :mod:`callwarden.providers.kinds`
does not know, or whose provider has no entry here, is
:class:`~callwarden.providers.errors.UnknownProviderKind` (the reconciler sweeps such
calls) — never another provider's client.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import cast

import aiohttp
import msgspec

from callwarden.providers.anthropic.client import anthropic_client_for
from callwarden.providers.base import AsyncKindClient, Endpoint, ProviderSettings, SyncKindClient
from callwarden.providers.checked import CheckedAsyncClient, CheckedSyncClient
from callwarden.providers.elevenlabs import webhook as elevenlabs_webhook
from callwarden.providers.elevenlabs.client import elevenlabs_client_for
from callwarden.providers.elevenlabs.operations import media_auth_headers
from callwarden.providers.errors import (
    AdapterError,
    MediaExpired,
    TaskNotFound,
    UnknownProviderKind,
)
from callwarden.providers.kie import webhook as kie_webhook
from callwarden.providers.kie.client import kie_client_for
from callwarden.providers.kinds import (
    BUILTIN_PROVIDERS,
    KINDS,
    KindSpec,
    check_kind,
    get_kind,
    is_sync_call,
)
from callwarden.providers.media import ANY_FILE, DEFAULT_MEDIA_TYPES, Credentials
from callwarden.providers.media_guard import MediaPolicy
from callwarden.providers.outcomes import Failed, NotFound, PollOutcome
from callwarden.providers.polled import Polled
from callwarden.providers.replicate import webhook as replicate_webhook
from callwarden.providers.replicate.client import replicate_client_for
from callwarden.providers.transport import Sleep
from callwarden.providers.webhooks import WebhookScheme

__all__ = ["PROVIDERS", "WEBHOOKS", "ClientRequest", "KindSpec", "MediaFetch", "Polled",
           "Provider", "client_for", "host_providers", "host_variables", "media_fetch_for",
           "media_url_test", "poll_task", "provider_for", "register"]

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
    """What a :class:`Provider`'s factory gets to build the client of one call:
    ``endpoint`` is the provider's own (:meth:`Provider.endpoint_in` the settings)."""

    kind: str
    session: aiohttp.ClientSession
    settings: ProviderSettings
    endpoint: Endpoint | None = None
    operation: str | None = None
    callback_url: str | None = None
    sleep: Sleep = asyncio.sleep

    @property
    def base_url(self) -> str:
        """The endpoint's base URL (:class:`AdapterError` naming the setting when the
        provider has none: no ``CALLWARDEN_<NAME>_URL`` and no ``default_url``)."""
        return self._endpoint().base_url

    @property
    def api_key(self) -> str:
        """The endpoint's key (``<NAME>_API_KEY``; empty when none is set)."""
        return self._endpoint().api_key

    def _endpoint(self) -> Endpoint:
        if self.endpoint is None or not self.endpoint.base_url:
            spec = KINDS.get(self.kind)
            name = (spec.provider if spec is not None else self.kind).upper().replace("-", "_")
            raise AdapterError(f"kind {self.kind}: its provider has no endpoint (set "
                               f"CALLWARDEN_{name}_URL, or give the Provider a "
                               f"default_url)")
        return self.endpoint


def _same_fetch(fetch: MediaFetch, _: ProviderSettings) -> MediaFetch:
    """The default ``Provider.media``: download as the kind's policy says."""
    return fetch


@dataclass(frozen=True, kw_only=True)
class Provider:
    """One provider's entry — its adapter: ``client`` builds the client of a call (an
    :class:`~callwarden.providers.base.AsyncKindClient`, ``create`` -> task id and ``poll``
    -> outcome, for a polled kind; a :class:`~callwarden.providers.base.SyncKindClient`
    for a one-round-trip kind); ``kinds`` are the kinds it serves, each with its stale
    threshold, result-URL lifetime and media hosts (:class:`KindSpec`, ``provider`` equal
    to ``name``); ``endpoint`` picks its :class:`~callwarden.providers.base.Endpoint` out of
    the settings (by default ``settings.endpoints[name]``, read from
    ``CALLWARDEN_<NAME>_URL`` and ``<NAME>_API_KEY``, else ``default_url``; the media guard
    allows that host); ``url_env`` and ``key_env`` name the host's own variables for the
    same URL and key, read when callwarden's are unset (a provider configured once, under
    the host's names or callwarden's); ``media`` adjusts how its results are downloaded;
    ``webhook`` is its callback scheme, if it calls back (the receiver mounts one route per
    scheme)."""

    name: str
    client: Callable[[ClientRequest], AsyncKindClient | SyncKindClient]
    kinds: tuple[KindSpec, ...] = ()
    endpoint: Callable[[ProviderSettings], Endpoint] | None = None
    default_url: str = ""
    media: Callable[[MediaFetch, ProviderSettings], MediaFetch] = _same_fetch
    webhook: WebhookScheme | None = None
    url_env: str = ""
    key_env: str = ""

    def endpoint_in(self, settings: ProviderSettings) -> Endpoint | None:
        """Where this provider lives under ``settings`` (``None``: nowhere configured)."""
        if self.endpoint is not None:
            return self.endpoint(settings)
        found = settings.endpoints.get(self.name)
        if found is not None:
            return found
        return Endpoint(base_url=self.default_url, api_key="") if self.default_url else None


PROVIDERS: dict[str, Provider] = {}
#: The providers that call back, by name: how their deliveries are authenticated and read
#: (:mod:`callwarden.providers.webhooks`). Kept equal to the schemes in :data:`PROVIDERS`.
WEBHOOKS: dict[str, WebhookScheme] = {}


_PROVIDER_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
#: Names whose CALLWARDEN_<NAME>_URL / <NAME>_API_KEY would be (or shadow) callwarden's
#: own settings: a provider called "redis" would take CALLWARDEN_REDIS_URL's password
#: into its base URL, one called "media-s3-endpoint" would allow the media store's host.
_RESERVED = ("reconcile", "call", "webhook", "serve", "media", "db", "redis", "callback",
             "provider", "pricing", "config", "failpoints", "admin", "read", "test",
             "embedded", "metrics")


def is_builtin(provider: Provider) -> bool:
    """Whether ``provider`` is the entry callwarden registered itself."""
    return _BUILTIN.get(provider.name) is provider


def _with_builtin_defaults(provider: Provider) -> Provider:
    """A host's replacement of a built-in provider keeps what it leaves unset: the
    endpoint, how media is fetched (Replicate: any file; ElevenLabs: the key for its own
    host) and the webhook scheme (its route). Set a field to change it."""
    builtin = _BUILTIN.get(provider.name)
    if builtin is None or provider is builtin:
        return provider
    return replace(
        provider,
        endpoint=provider.endpoint or builtin.endpoint,
        media=builtin.media if provider.media is _same_fetch else provider.media,
        webhook=provider.webhook if provider.webhook is not None else builtin.webhook)


def register(provider: Provider) -> None:
    """Add (or replace) ``provider``'s entry, its kinds and its webhook scheme (a host's
    replacement of a built-in provider keeps the built-in's endpoint, media handling and
    webhook scheme where it sets none). :class:`~callwarden.providers.errors.AdapterError`,
    and nothing registered, for a name that cannot name settings or is reserved, a kind of
    another provider, or a kind out of range."""
    if not _PROVIDER_NAME.fullmatch(provider.name):
        raise AdapterError(f"provider name {provider.name!r}: 1-31 of a-z, 0-9 and '-', "
                           "starting with a letter (it names CALLWARDEN_<NAME>_URL)")
    if provider.name.split("-")[0] in _RESERVED and provider.name not in _BUILTIN:
        raise AdapterError(f"provider name {provider.name!r}: its settings "
                           f"(CALLWARDEN_{provider.name.upper().replace('-', '_')}_URL) "
                           "would collide with callwarden's own; choose another name")
    provider = _with_builtin_defaults(provider)
    for spec in provider.kinds:
        if spec.provider != provider.name:
            raise AdapterError(f"provider {provider.name!r} declares kind {spec.name!r} "
                               f"of provider {spec.provider!r}")
        check_kind(spec)  # every kind checked before any is added
    for spec in provider.kinds:
        KINDS[spec.name] = spec
    PROVIDERS[provider.name] = provider
    WEBHOOKS.pop(provider.name, None)
    if provider.webhook is not None:
        WEBHOOKS[provider.name] = provider.webhook


def host_providers() -> dict[str, str]:
    """The registered providers that are not built in: name -> default base URL (what
    :meth:`ProviderSettings.from_env` reads their endpoints for)."""
    return {name: p.default_url for name, p in PROVIDERS.items()
            if name not in BUILTIN_PROVIDERS}


def host_variables() -> dict[str, tuple[str, str]]:
    """The registered providers whose host names its own variables for them: name ->
    (``url_env``, ``key_env``) (what :meth:`ProviderSettings.from_env` falls back to)."""
    return {name: (p.url_env, p.key_env) for name, p in PROVIDERS.items()
            if p.url_env or p.key_env}


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
    provider = provider_for(kind)
    client = provider.client(ClientRequest(
        kind=kind, session=session, settings=settings, endpoint=provider.endpoint_in(settings),
        operation=operation, callback_url=callback_url, sleep=sleep))
    if is_builtin(provider):
        return client
    # a host's adapter: what it answers is checked before the engine acts on it
    if is_sync_call(kind, operation):
        return CheckedSyncClient(cast(SyncKindClient, client), provider.name)
    return CheckedAsyncClient(cast(AsyncKindClient, client), provider.name,
                              policy=settings.retry, sleep=sleep)


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


def _own(provider: str) -> tuple[KindSpec, ...]:
    return tuple(spec for spec in KINDS.values() if spec.provider == provider)


_BUILTIN: dict[str, Provider] = {}
for _entry in (
    Provider(name="kie", client=_kie, kinds=_own("kie"), endpoint=lambda s: s.kie,
             webhook=kie_webhook.SCHEME),
    Provider(name="replicate", client=_replicate, kinds=_own("replicate"),
             endpoint=lambda s: s.replicate,
             webhook=replicate_webhook.SCHEME,
             # a model's output may be any file (not a web page)
             media=lambda fetch, _: msgspec.structs.replace(fetch, allowed_types=ANY_FILE)),
    Provider(name="elevenlabs", client=_elevenlabs, kinds=_own("elevenlabs"),
             endpoint=lambda s: s.elevenlabs,
             webhook=elevenlabs_webhook.SCHEME,
             media=lambda fetch, s: msgspec.structs.replace(
                 fetch, credentials=Credentials.for_endpoint(
                     s.elevenlabs.base_url, media_auth_headers(s.elevenlabs)))),
    Provider(name="anthropic", client=_anthropic, kinds=_own("anthropic"),
             endpoint=lambda s: s.anthropic),
):
    register(_entry)
    _BUILTIN[_entry.name] = _entry


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
    endpoint = provider.endpoint_in(settings)
    if endpoint is None:
        return ()
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
