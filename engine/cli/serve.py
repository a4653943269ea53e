"""``callwarden serve``: the webhook receivers, ``/metrics``, health probes and dashboard.

Configuration (environment): ``CALLWARDEN_REPLICATE_WEBHOOK_SECRET`` (``whsec_...``),
``CALLWARDEN_KIE_WEBHOOK_HMAC_KEY`` (optional; without it KIE callbacks are authenticated
by the per-job token in their URL), ``CALLWARDEN_ELEVENLABS_WEBHOOK_SECRET``, the admin
token in the variable named by ``--admin-token-env`` (default ``CALLWARDEN_ADMIN_TOKEN``;
unset: read-only), provider endpoints as for the worker (``ProviderSettings.from_env``)
and media storage as for the worker (``media_from_env``: S3 or ``--media-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from callwarden.calls.config import load_call_config
from callwarden.calls.finalize import Finalizer
from callwarden.calls.identity import incarnation
from callwarden.calls.pricing import pricing_from_env
from callwarden.cli.args import port, positive_int
from callwarden.cli.process import setup_logging
from callwarden.database.db import default_data_dir, open_pool
from callwarden.errors import ConfigError
from callwarden.providers.base import ProviderSettings
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import poll_task
from callwarden.providers.storage import media_from_env
from callwarden.reconciler.config import load_config
from callwarden.service.app import RedactingAccessLogger, ServiceConfig, build_app
from callwarden.service.webhooks import load_webhook_config

__all__ = ["register"]


def register(sub: Any) -> None:
    s = sub.add_parser("serve", help="webhook receivers, /metrics, health and dashboard")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=port, default=8000)
    s.add_argument("--admin-token-env", default="CALLWARDEN_ADMIN_TOKEN", metavar="VAR",
                   help="environment variable holding the admin token (unset: read-only)")
    s.add_argument("--media-dir", type=Path, default=None,
                   help="local media folder (default: <data dir>/media)")
    s.add_argument("--pool-size", type=positive_int, default=10)
    s.add_argument("--config", type=Path, default=None,
                   help="settings file (TOML or JSON): [webhooks], [calls] and the reconciler's "
                        "[reconcile] (stale thresholds, legacy cutoff)")
    s.set_defaults(handler=_serve)


def service_config(args: argparse.Namespace) -> ServiceConfig:
    """The service's settings; stale thresholds and the legacy cutoff are the
    reconciler's own (``--config`` and ``CALLWARDEN_RECONCILE_*``), so ``/metrics`` and the
    dashboard count what the reconciler acts on."""
    env = os.environ
    webhooks = load_webhook_config(args.config, env)
    reconcile = load_config(args.config, env)
    return ServiceConfig(webhooks=webhooks, admin_token=env.get(args.admin_token_env) or None,
                         stale=reconcile.stale,
                         legacy_cutoff=reconcile.legacy_cutoff)


async def _serve(args: argparse.Namespace, url: str) -> int:
    setup_logging(loggers=("callwarden", "aiohttp.access"))
    if not 0 <= args.port < 65536 or args.pool_size < 1:
        raise ConfigError("--port must be 0..65535 and --pool-size >= 1")
    settings = ProviderSettings.from_env()
    env = dict(os.environ)
    if args.media_dir is not None:
        env["CALLWARDEN_MEDIA_DIR"] = str(args.media_dir)
    media = media_from_env(env, default_dir=(args.data_dir or default_data_dir()) / "media")
    config = service_config(args)
    call_config = load_call_config(args.config, env)  # every setting before connecting
    pricing = pricing_from_env(env)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with open_pool(url, max_size=args.pool_size, check=True) as pool, \
            aiohttp.ClientSession() as session:
        finalizer = Finalizer(pool, media, settings, owner=incarnation("webhook"),
                              config=call_config,
                              pricing=pricing)

        async def poll(kind: str, task_id: str, created_at: float | None) -> PollOutcome:
            return await poll_task(kind, task_id, session, settings, created_at=created_at)

        runner = web.AppRunner(build_app(pool, finalizer, config, poll=poll),
                               access_log_class=RedactingAccessLogger)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        print(f"callwarden serve on http://{args.host}:{runner.addresses[0][1]} "
              f"(admin {'enabled' if config.admin_token else 'disabled'})", flush=True)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
    return 0

