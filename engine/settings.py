"""Every actor's settings in one object, from one file and the environment.

::

    settings = callwarden.load_settings()          # CALLWARDEN_CONFIG and the environment
    calls = OwnCalls(pool, **settings.own_calls())
    reconciler = Reconciler(pool, session, **settings.reconciler())

:func:`load_settings` reads what the commands read, the same way
(:mod:`callwarden.config`: defaults < the file's table < the environment): the
``[calls]``, ``[reconcile]``, ``[webhooks]`` and ``[serve]`` tables of the file
(``path``, else ``CALLWARDEN_CONFIG``), the providers (the host's adapters first), the
price list (``CALLWARDEN_PRICING_FILE``) and the media store (``CALLWARDEN_MEDIA_DIR`` or
``CALLWARDEN_MEDIA_S3_BUCKET``; ``None`` when neither is set). A host's web process, its
queue workers, ``callwarden reconcile`` and ``callwarden serve`` given the same file and
environment therefore agree on every setting — the provider endpoints the reconciler
recovers through are the ones the workers created with.

:func:`configured_media` (defined in :mod:`callwarden.config`, where the queue processes
find it too) is the store every actor that finalizes calls requires: ``worker``,
``reconcile``, ``serve`` and the Celery and arq processes. Without a store named
(``CALLWARDEN_MEDIA_DIR``, ``CALLWARDEN_MEDIA_S3_BUCKET`` or ``--media-dir``) they used to
write under the user's data folder, on whichever machine they ran; they now refuse to
start (exit 2).

:func:`unknown_variables` names each ``CALLWARDEN_*`` variable nothing reads, with the
closest one that is read (``load_settings`` logs the likely typos among them as warnings,
every command prints them): a typo there would otherwise leave its setting at its default
without a word.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_origin

import msgspec

from callwarden.calls.config import ENV_PREFIX as CALL_PREFIX
from callwarden.calls.config import MEDIA_ALLOW_ENV, CallConfig, load_call_config
from callwarden.calls.pricing import PRICING_ENV, Pricing, pricing_from_env
from callwarden.config import (
    CONFIG_VAR,
    MEDIA_SETTINGS,
    config_path,
    configured_media,
    named_media,
    provider_settings,
)
from callwarden.database.db import POOLER_ENV
from callwarden.database.outage import LIMIT_ENV
from callwarden.errors import ConfigError
from callwarden.providers.adapters import SETTING as PROVIDERS_VAR
from callwarden.providers.base import ProviderSettings
from callwarden.providers.storage import BASE_URL_ENV as MEDIA_BASE_URL_ENV
from callwarden.providers.storage import MediaStore
from callwarden.reconciler.config import ENV_PREFIX as RECONCILE_PREFIX
from callwarden.reconciler.config import ReconcileConfig, load_config
from callwarden.rules.spelling import closest, did_you_mean
from callwarden.service.app import ListenConfig, load_listen_config
from callwarden.service.webhooks import WebhookConfig, load_webhook_config

__all__ = ["MEDIA_SETTINGS", "Settings", "configured_media", "contradictions", "load_settings",
           "named_media", "unknown_variables"]

#: Each actor's variables, ``<PREFIX><FIELD>`` (per kind ``<PREFIX><MAP>_<KIND>``): one
#: under a prefix is its actor's to refuse (naming the closest of its own) when it loads.
_ACTORS: dict[str, type[msgspec.Struct]] = {
    CALL_PREFIX: CallConfig, RECONCILE_PREFIX: ReconcileConfig,
    "CALLWARDEN_WEBHOOK_": WebhookConfig, "CALLWARDEN_SERVE_": ListenConfig}
#: Every other ``CALLWARDEN_*`` variable read (besides each registered provider's
#: ``CALLWARDEN_<NAME>_URL`` and webhook secret).
_VARIABLES = (CONFIG_VAR, PROVIDERS_VAR, "CALLWARDEN_PROVIDER_MAX_ANSWER_BYTES", *MEDIA_SETTINGS,
              "CALLWARDEN_MEDIA_S3_ENDPOINT_URL", "CALLWARDEN_MEDIA_S3_PREFIX",
              MEDIA_BASE_URL_ENV, MEDIA_ALLOW_ENV, PRICING_ENV, POOLER_ENV, LIMIT_ENV,
              "CALLWARDEN_CALLBACK_BASE_URL",
              "CALLWARDEN_FAILPOINTS", "CALLWARDEN_ADMIN_TOKEN", "CALLWARDEN_READ_TOKEN",
              "CALLWARDEN_REDIS_URL", "CALLWARDEN_AMBIGUOUS_CREATE",  # (the older name)
              "CALLWARDEN_DEMO_QUEUE", "CALLWARDEN_DEMO_REDELIVER_S",
              "CALLWARDEN_DEMO_CONCURRENCY")  # (the demo's, to its queue processes)

@dataclass(frozen=True, kw_only=True)
class Settings:
    """One deployment's settings (see the module); ``path``: the file they were read from."""

    path: Path | None
    calls: CallConfig
    reconcile: ReconcileConfig
    webhooks: WebhookConfig
    listen: ListenConfig
    providers: ProviderSettings
    pricing: Pricing
    media: MediaStore | None

    def own_calls(self) -> dict[str, Any]:
        """``OwnCalls``' / ``CallRunner``'s keyword arguments: media, settings, config,
        pricing."""
        return {"media": self.media, "settings": self.providers, "config": self.calls,
                "pricing": self.pricing}

    def reconciler(self) -> dict[str, Any]:
        """``Reconciler``'s arguments after the pool and the session: settings, media,
        config, call_config, pricing (a :class:`~callwarden.errors.ConfigError` when no
        media store is named: it stores what it recovers)."""
        if self.media is None:
            raise ConfigError("the reconciler needs a media store: set "
                              "CALLWARDEN_MEDIA_DIR or CALLWARDEN_MEDIA_S3_BUCKET")
        return {"settings": self.providers, "media": self.media, "config": self.reconcile,
                "call_config": self.calls, "pricing": self.pricing}


def contradictions(calls: CallConfig, reconcile: ReconcileConfig) -> None:
    """Settings each valid alone that contradict each other: a
    :class:`~callwarden.errors.ConfigError` naming them. A worker beats every
    ``[calls] heartbeat_every_s``, and while it polls once a poll (its kind's poll
    interval): once the longer of the two reaches ``[reconcile] heartbeat_timeout_s``, every
    live call looks dead between two beats and would be swept. The kinds weighed are
    those the deployment runs (``[reconcile] kinds``)."""
    gap, what = calls.heartbeat_every_s, "[calls] heartbeat_every_s"
    for kind in reconcile.deployed:
        if calls.interval_for(kind) > gap:
            gap, what = calls.interval_for(kind), f"[calls] poll_interval_s for {kind}"
    if gap >= reconcile.heartbeat_timeout_s:
        raise ConfigError(
            f"{what} ({gap:g} s) must be below [reconcile] heartbeat_timeout_s "
            f"({reconcile.heartbeat_timeout_s:g} s): a worker beats at most that often, and "
            "between two beats every live call would look dead and be swept")


#: How alike (difflib's ratio, without the prefix) an unknown variable and a known one must
#: be for the unknown one to be a likely typo: ``MEDIA_DIRR`` 0.95, ``PRICING`` (for
#: ``PRICING_FILE``) 0.74; a deployment's own tooling is further (CI's ``CITUS_URL`` 0.67
#: from ``REDIS_URL``, ``VENDOR`` 0.50).
TYPO_CUTOFF = 0.7


def unknown_variables(env: Mapping[str, str], also: Iterable[str] = (), *,
                      likely_typos: bool = False) -> list[str]:
    """A line for each ``CALLWARDEN_*`` variable of ``env`` that nothing reads (``also``:
    more names read, e.g. the variable a command's ``--read-token-env`` names), naming the
    closest that is read; the providers are those registered (the host's once
    :func:`~callwarden.config.load_providers` has run). Those under an actor's prefix are
    left to the actor. ``likely_typos``: only those a known name is as close to as
    :data:`TYPO_CUTOFF` (what every command warns of at start, and ``load_settings``): a
    deployment's own tooling may share the prefix, and a warning on each of its variables
    would bury the typo."""
    from callwarden.providers.registry import PROVIDERS, WEBHOOKS

    known = {*_VARIABLES, *also, *(s.secret_env for s in WEBHOOKS.values()),
             *(f"CALLWARDEN_{name.upper().replace('-', '_')}_URL" for name in PROVIDERS)}
    actors = {prefix + f.name.upper() for prefix, cls in _ACTORS.items()
              for f in msgspec.structs.fields(cls)
              if get_origin(f.type) not in (Mapping, dict)}  # (a map is set per kind)
    unknown = [name for name in sorted(env) if name.startswith("CALLWARDEN_")
               and name not in known and not name.startswith(tuple(_ACTORS))]
    if likely_typos:
        unknown = [name for name in unknown if closest(
            name, known | actors, prefix="CALLWARDEN_", cutoff=TYPO_CUTOFF) is not None]
    return [f"{name}: unknown variable, ignored"
            + did_you_mean(name, known | actors, prefix="CALLWARDEN_") for name in unknown]


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None
                  ) -> Settings:
    """Every actor's settings from ``path`` (else ``CALLWARDEN_CONFIG``) and ``env``
    (``os.environ`` by default); a bad one is a :class:`~callwarden.errors.ConfigError`
    naming it."""
    env = dict(os.environ if env is None else env)
    path = config_path(path, env)
    calls, reconcile = load_call_config(path, env), load_config(path, env)
    contradictions(calls, reconcile)
    providers = provider_settings(env)  # (the host's providers registered: their names too)
    for line in unknown_variables(env, likely_typos=True):
        logging.getLogger("callwarden.settings").warning("%s", line)
    return Settings(
        path=path,
        providers=providers,
        calls=calls,
        reconcile=reconcile,
        webhooks=load_webhook_config(path, env),
        listen=load_listen_config(path, env),
        pricing=pricing_from_env(env),
        media=named_media(env))
