"""callwarden's engine: what may happen next to a job's external call, and who does it.

The embedding API, in one import::

    from callwarden import CallConfig, CallRunner, ProviderSettings, open_pool, media_from_env

    async with open_pool(url) as pool, aiohttp.ClientSession() as session:
        async with CallRunner(pool, session, ProviderSettings.from_env(),
                              media_from_env(os.environ, default_dir=Path("media"))) as runner:
            outcome = await runner.run(job_id, "kie-standard", request)

Host code that makes the provider request itself records it with ``OwnCalls`` (async
kinds: ``start`` / ``task_created`` / ``succeeded``; sync kinds and streams: ``async with
calls.sync_call(...)``), or ``BlockingCalls`` without an event loop (docs/embedding.md).

The names below are loaded on first use (``import callwarden`` alone loads nothing), so a
pure module such as ``callwarden.reconciler.decide`` imports without the I/O libraries.

The layers, lowest first (:data:`LAYERS`; ``tests/unit/test_layers.py`` holds every import
to it: a unit imports only units of lower layers, so there is no cycle and nothing imports
upward): ``errors`` (the error tree), ``machine`` (the state diagram) and ``rules`` (the
pure shared rules: staleness, the host's status, what an answer means, the log versus the
row); ``config`` (how every actor reads its settings); ``database`` (the write path, its
SQL, the clock, migrations, the port every actor's ``db`` handle speaks); ``observe``
(metric and trace hooks on the database and the transport); ``calls`` (the worker API,
the host's own calls, finalization, pricing, callback URLs); ``queue``, ``reconciler``
and ``replay`` (the reference queue and the Celery and arq integrations, the reconciler,
the log read back); ``service`` (webhooks, ``/metrics``, the dashboard); ``settings``
(every actor's settings in one object); and the faces on top: ``demo``, ``cli`` and
``__main__`` (``python -m callwarden``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callwarden.calls.callbacks import CallbackUrls
    from callwarden.calls.config import CallConfig
    from callwarden.calls.finalize import Finalizer
    from callwarden.calls.own import (
        CallAlreadyStarted,
        CallNotStarted,
        OwnCall,
        OwnCallError,
        OwnCalls,
        Reported,
        TaskIdConflict,
        WrongKind,
    )
    from callwarden.calls.own_sync import BlockingCall, BlockingCalls, SyncCall
    from callwarden.calls.pricing import ChargeReservation, Pricing, Rate, RateTable, load_pricing
    from callwarden.calls.runner import CallOutcome, CallRunner
    from callwarden.database.db import Conn, Pool, connect, open_pool
    from callwarden.database.jobs import create_job
    from callwarden.database.migrate import migrate
    from callwarden.database.write import cancel
    from callwarden.errors import CallwardenError
    from callwarden.providers.adapters import load_adapters
    from callwarden.providers.base import Endpoint, ProviderSettings
    from callwarden.providers.kinds import KindSpec
    from callwarden.providers.registry import ClientRequest, Provider
    from callwarden.providers.storage import LocalFolderStore, MediaStore, S3Store, media_from_env
    from callwarden.reconciler.config import ReconcileConfig
    from callwarden.reconciler.config import load_config as load_reconcile_config
    from callwarden.reconciler.loop import Reconciler
    from callwarden.replay.verify import verify, verify_job
    from callwarden.service.app import (
        ServiceConfig,
        build_apps,
        build_operator_app,
        build_webhook_app,
    )
    from callwarden.service.webhooks import WebhookConfig
    from callwarden.settings import Settings, load_settings

#: engine's units, lowest layer first: a unit may import only units of lower layers.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "machine", "rules"),
    ("config",),
    ("database",),
    ("observe",),
    ("calls",),
    ("queue", "reconciler", "replay"),
    ("service",),
    ("settings",),
    ("demo",),
    ("cli",),
    ("__main__",),
)

#: name -> (module, attribute): what ``from callwarden import <name>`` gives.
EXPORTS: dict[str, tuple[str, str]] = {
    "BlockingCall": ("callwarden.calls.own_sync", "BlockingCall"),
    "BlockingCalls": ("callwarden.calls.own_sync", "BlockingCalls"),
    "CallAlreadyStarted": ("callwarden.calls.own", "CallAlreadyStarted"),
    "CallNotStarted": ("callwarden.calls.own", "CallNotStarted"),
    "CallConfig": ("callwarden.calls.config", "CallConfig"),
    "CallOutcome": ("callwarden.calls.runner", "CallOutcome"),
    "CallRunner": ("callwarden.calls.runner", "CallRunner"),
    "CallbackUrls": ("callwarden.calls.callbacks", "CallbackUrls"),
    "CallwardenError": ("callwarden.errors", "CallwardenError"),
    "ChargeReservation": ("callwarden.calls.pricing", "ChargeReservation"),
    "ClientRequest": ("callwarden.providers.registry", "ClientRequest"),
    "Endpoint": ("callwarden.providers.base", "Endpoint"),
    "KindSpec": ("callwarden.providers.kinds", "KindSpec"),
    "Provider": ("callwarden.providers.registry", "Provider"),
    "load_adapters": ("callwarden.providers.adapters", "load_adapters"),
    "Conn": ("callwarden.database.db", "Conn"),
    "Finalizer": ("callwarden.calls.finalize", "Finalizer"),
    "LocalFolderStore": ("callwarden.providers.storage", "LocalFolderStore"),
    "MediaStore": ("callwarden.providers.storage", "MediaStore"),
    "OwnCall": ("callwarden.calls.own", "OwnCall"),
    "OwnCallError": ("callwarden.calls.own", "OwnCallError"),
    "OwnCalls": ("callwarden.calls.own", "OwnCalls"),
    "Pool": ("callwarden.database.db", "Pool"),
    "Pricing": ("callwarden.calls.pricing", "Pricing"),
    "ProviderSettings": ("callwarden.providers.base", "ProviderSettings"),
    "Rate": ("callwarden.calls.pricing", "Rate"),
    "RateTable": ("callwarden.calls.pricing", "RateTable"),
    "ReconcileConfig": ("callwarden.reconciler.config", "ReconcileConfig"),
    "Reconciler": ("callwarden.reconciler.loop", "Reconciler"),
    "Reported": ("callwarden.calls.own", "Reported"),
    "S3Store": ("callwarden.providers.storage", "S3Store"),
    "ServiceConfig": ("callwarden.service.app", "ServiceConfig"),
    "Settings": ("callwarden.settings", "Settings"),
    "SyncCall": ("callwarden.calls.own_sync", "SyncCall"),
    "TaskIdConflict": ("callwarden.calls.own", "TaskIdConflict"),
    "WebhookConfig": ("callwarden.service.webhooks", "WebhookConfig"),
    "WrongKind": ("callwarden.calls.own", "WrongKind"),
    "build_apps": ("callwarden.service.app", "build_apps"),
    "build_operator_app": ("callwarden.service.app", "build_operator_app"),
    "build_webhook_app": ("callwarden.service.app", "build_webhook_app"),
    "cancel": ("callwarden.database.write", "cancel"),
    "connect": ("callwarden.database.db", "connect"),
    "create_job": ("callwarden.database.jobs", "create_job"),
    "load_pricing": ("callwarden.calls.pricing", "load_pricing"),
    "load_reconcile_config": ("callwarden.reconciler.config", "load_config"),
    "load_settings": ("callwarden.settings", "load_settings"),
    "migrate": ("callwarden.database.migrate", "migrate"),
    "open_pool": ("callwarden.database.db", "open_pool"),
    "media_from_env": ("callwarden.providers.storage", "media_from_env"),
    "verify": ("callwarden.replay.verify", "verify"),
    "verify_job": ("callwarden.replay.verify", "verify_job"),
}

__all__ = [
    "BlockingCall",
    "BlockingCalls",
    "CallAlreadyStarted",
    "CallConfig",
    "CallNotStarted",
    "CallOutcome",
    "CallRunner",
    "CallbackUrls",
    "CallwardenError",
    "ChargeReservation",
    "ClientRequest",
    "Conn",
    "Endpoint",
    "Finalizer",
    "KindSpec",
    "LocalFolderStore",
    "MediaStore",
    "OwnCall",
    "OwnCallError",
    "OwnCalls",
    "Pool",
    "Pricing",
    "Provider",
    "ProviderSettings",
    "Rate",
    "RateTable",
    "ReconcileConfig",
    "Reconciler",
    "Reported",
    "S3Store",
    "ServiceConfig",
    "Settings",
    "SyncCall",
    "TaskIdConflict",
    "WebhookConfig",
    "WrongKind",
    "build_apps",
    "build_operator_app",
    "build_webhook_app",
    "cancel",
    "connect",
    "create_job",
    "load_adapters",
    "load_pricing",
    "load_reconcile_config",
    "load_settings",
    "media_from_env",
    "migrate",
    "open_pool",
    "verify",
    "verify_job",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's, read once asked
        from importlib.metadata import version
        globals()["__version__"] = version("callwarden")
        return globals()["__version__"]
    try:
        module, attribute = EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'callwarden' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
