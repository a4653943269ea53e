"""callwarden's engine: what may happen next to a job's external call, and who does it.

The embedding API, in one import::

    from engine import CallConfig, CallRunner, ProviderSettings, open_pool, store_from_env

    async with open_pool(url) as pool, aiohttp.ClientSession() as session:
        runner = CallRunner(pool, session, ProviderSettings.from_env(),
                            store_from_env(os.environ, default_dir=Path("media")))
        outcome = await runner.run(job_id, "kie-standard", request)

Host code that makes the provider request itself records it with ``OwnCalls`` (async
kinds: ``start`` / ``task_created`` / ``succeeded``; sync kinds and streams: ``async with
calls.sync_call(...)``), or ``BlockingCalls`` without an event loop (docs/embedding.md).

The names below are loaded on first use (``import engine`` alone loads nothing), so a pure
module such as ``engine.reconciler.decide`` imports without the I/O libraries. The layout:
``store`` (the write path, the database, migrations, the clock), ``calls`` (the worker API,
finalization, pricing), ``reconciler``, ``service`` (webhooks, metrics, dashboard),
``replay`` (history, verify, rebuild, audit), ``queue`` (the reference queue and worker),
``cli`` and ``demo``; ``errors`` draws the error tree; ``machine`` the state diagram.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.calls.config import CallConfig
    from engine.calls.finalize import Finalizer
    from engine.calls.own import (
        CallAlreadyStarted,
        CallNotStarted,
        OwnCall,
        OwnCallError,
        OwnCalls,
        Reported,
        TaskIdConflict,
        WrongKind,
    )
    from engine.calls.own_sync import BlockingCall, BlockingCalls, SyncCall
    from engine.calls.pricing import ChargeReservation, Pricing, Rate, RateTable, load_pricing
    from engine.calls.runner import CallOutcome, CallRunner
    from engine.errors import CallwardenError
    from engine.reconciler.config import ReconcileConfig
    from engine.reconciler.config import load_config as load_reconcile_config
    from engine.reconciler.loop import Reconciler
    from engine.replay.verify import verify, verify_job
    from engine.service.app import ServiceConfig, build_app
    from engine.service.webhooks import CallbackUrls, WebhookConfig
    from engine.store.db import Conn, Pool, connect, open_pool
    from engine.store.jobs import create_job
    from engine.store.migrate import migrate
    from engine.store.write import cancel
    from providers.base import ProviderSettings
    from providers.storage import LocalFolderStore, MediaStore, S3Store, store_from_env

#: name -> (module, attribute): what ``from engine import <name>`` gives.
EXPORTS: dict[str, tuple[str, str]] = {
    "BlockingCall": ("engine.calls.own_sync", "BlockingCall"),
    "BlockingCalls": ("engine.calls.own_sync", "BlockingCalls"),
    "CallAlreadyStarted": ("engine.calls.own", "CallAlreadyStarted"),
    "CallNotStarted": ("engine.calls.own", "CallNotStarted"),
    "CallConfig": ("engine.calls.config", "CallConfig"),
    "CallOutcome": ("engine.calls.runner", "CallOutcome"),
    "CallRunner": ("engine.calls.runner", "CallRunner"),
    "CallbackUrls": ("engine.service.webhooks", "CallbackUrls"),
    "CallwardenError": ("engine.errors", "CallwardenError"),
    "ChargeReservation": ("engine.calls.pricing", "ChargeReservation"),
    "Conn": ("engine.store.db", "Conn"),
    "Finalizer": ("engine.calls.finalize", "Finalizer"),
    "LocalFolderStore": ("providers.storage", "LocalFolderStore"),
    "MediaStore": ("providers.storage", "MediaStore"),
    "OwnCall": ("engine.calls.own", "OwnCall"),
    "OwnCallError": ("engine.calls.own", "OwnCallError"),
    "OwnCalls": ("engine.calls.own", "OwnCalls"),
    "Pool": ("engine.store.db", "Pool"),
    "Pricing": ("engine.calls.pricing", "Pricing"),
    "ProviderSettings": ("providers.base", "ProviderSettings"),
    "Rate": ("engine.calls.pricing", "Rate"),
    "RateTable": ("engine.calls.pricing", "RateTable"),
    "ReconcileConfig": ("engine.reconciler.config", "ReconcileConfig"),
    "Reconciler": ("engine.reconciler.loop", "Reconciler"),
    "Reported": ("engine.calls.own", "Reported"),
    "S3Store": ("providers.storage", "S3Store"),
    "ServiceConfig": ("engine.service.app", "ServiceConfig"),
    "SyncCall": ("engine.calls.own_sync", "SyncCall"),
    "TaskIdConflict": ("engine.calls.own", "TaskIdConflict"),
    "WebhookConfig": ("engine.service.webhooks", "WebhookConfig"),
    "WrongKind": ("engine.calls.own", "WrongKind"),
    "build_app": ("engine.service.app", "build_app"),
    "cancel": ("engine.store.write", "cancel"),
    "connect": ("engine.store.db", "connect"),
    "create_job": ("engine.store.jobs", "create_job"),
    "load_pricing": ("engine.calls.pricing", "load_pricing"),
    "load_reconcile_config": ("engine.reconciler.config", "load_config"),
    "migrate": ("engine.store.migrate", "migrate"),
    "open_pool": ("engine.store.db", "open_pool"),
    "store_from_env": ("providers.storage", "store_from_env"),
    "verify": ("engine.replay.verify", "verify"),
    "verify_job": ("engine.replay.verify", "verify_job"),
}

__all__ = ["BlockingCall", "BlockingCalls", "CallAlreadyStarted", "CallConfig", "CallNotStarted",
           "CallOutcome", "CallRunner", "CallbackUrls", "CallwardenError", "ChargeReservation",
           "Conn", "Finalizer", "LocalFolderStore", "MediaStore", "OwnCall", "OwnCallError",
           "OwnCalls", "Pool", "Pricing", "ProviderSettings", "Rate", "RateTable",
           "ReconcileConfig", "Reconciler", "Reported", "S3Store", "ServiceConfig", "SyncCall",
           "TaskIdConflict", "WebhookConfig", "WrongKind", "build_app", "cancel", "connect",
           "create_job", "load_pricing", "load_reconcile_config", "migrate", "open_pool",
           "store_from_env", "verify", "verify_job"]


def __getattr__(name: str) -> Any:
    try:
        module, attribute = EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'engine' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *EXPORTS])
