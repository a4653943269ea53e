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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callwarden.calls.config import CallConfig, load_call_config
from callwarden.calls.pricing import Pricing, pricing_from_env
from callwarden.config import (
    MEDIA_SETTINGS,
    config_path,
    configured_media,
    named_media,
    provider_settings,
)
from callwarden.errors import ConfigError
from callwarden.providers.base import ProviderSettings
from callwarden.providers.storage import MediaStore
from callwarden.reconciler.config import ReconcileConfig, load_config
from callwarden.service.app import ListenConfig, load_listen_config
from callwarden.service.webhooks import WebhookConfig, load_webhook_config

__all__ = ["MEDIA_SETTINGS", "Settings", "configured_media", "contradictions", "load_settings",
           "named_media"]

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


def load_settings(path: Path | None = None, env: Mapping[str, str] | None = None
                  ) -> Settings:
    """Every actor's settings from ``path`` (else ``CALLWARDEN_CONFIG``) and ``env``
    (``os.environ`` by default); a bad one is a :class:`~callwarden.errors.ConfigError`
    naming it."""
    env = dict(os.environ if env is None else env)
    path = config_path(path, env)
    calls, reconcile = load_call_config(path, env), load_config(path, env)
    contradictions(calls, reconcile)
    return Settings(
        path=path,
        providers=provider_settings(env),
        calls=calls,
        reconcile=reconcile,
        webhooks=load_webhook_config(path, env),
        listen=load_listen_config(path, env),
        pricing=pricing_from_env(env),
        media=named_media(env))
