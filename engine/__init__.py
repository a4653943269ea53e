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

**The public API** is the names below (``__all__``) and the modules of
:data:`PUBLIC_MODULES`, listed in docs/api.md (``tests/unit/test_embedding_api.py`` keeps
the three equal, and fails on a doc or example that imports anything else). Every other
module is internal: it may change in any release. Each name is written twice: in the
``TYPE_CHECKING`` imports (what a type checker and an editor read) and in ``__all__``; the
names load on first use from those imports (``import callwarden`` alone loads nothing), so
a pure module such as ``callwarden.reconciler.decide`` imports without the I/O libraries.

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

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from callwarden.calls.config import CallConfig
    from callwarden.calls.own import OwnCall, OwnCalls
    from callwarden.calls.own_sync import BlockingCalls
    from callwarden.calls.pricing import Rate, RateTable
    from callwarden.calls.runner import CallOutcome, CallRunner
    from callwarden.database.db import Pool, connect, open_pool
    from callwarden.database.jobs import create_job
    from callwarden.database.migrate import migrate
    from callwarden.database.write import cancel
    from callwarden.errors import CallwardenError
    from callwarden.providers.base import ProviderSettings
    from callwarden.providers.storage import LocalFolderStore, MediaStore, S3Store, media_from_env
    from callwarden.reconciler.loop import Reconciler
    from callwarden.settings import Settings, load_settings

__all__ = [
    "BlockingCalls",
    "CallConfig",
    "CallOutcome",
    "CallRunner",
    "CallwardenError",
    "LocalFolderStore",
    "MediaStore",
    "OwnCall",
    "OwnCalls",
    "Pool",
    "ProviderSettings",
    "Rate",
    "RateTable",
    "Reconciler",
    "S3Store",
    "Settings",
    "cancel",
    "connect",
    "create_job",
    "load_settings",
    "media_from_env",
    "migrate",
    "open_pool",
]

#: The modules a host imports by name, besides ``callwarden`` itself: the error tree, the
#: queue integrations, the API of a provider adapter, the HTTP faces embedded, the events,
#: the traces.
PUBLIC_MODULES: tuple[str, ...] = (
    "callwarden.errors",
    "callwarden.events",
    "callwarden.observe.tracing",
    "callwarden.queue.arq",
    "callwarden.queue.celery",
    "callwarden.providers.errors",
    "callwarden.providers.kinds",
    "callwarden.providers.outcomes",
    "callwarden.providers.registry",
    "callwarden.providers.webhooks",
    "callwarden.service.app",
)

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


@functools.cache
def _exports() -> dict[str, tuple[str, str]]:
    """name -> (module, attribute), read from the ``TYPE_CHECKING`` imports above."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.asname or alias.name: (node.module, alias.name)
            for node in block.body if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names}


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's, read once asked
        from importlib.metadata import version
        globals()["__version__"] = version("callwarden")
        return globals()["__version__"]
    if name not in __all__:
        raise AttributeError(f"module 'callwarden' has no attribute {name!r}")
    module, attribute = _exports()[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
