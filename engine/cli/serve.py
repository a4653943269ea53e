"""``callwarden serve``: two listeners over one pool.

- the **webhook listener** (``--host``/``--port``, default 127.0.0.1:8000): the webhook
  receivers and the health probes, nothing else — the one providers reach from the
  internet;
- the **operator listener** (``--operator-host``/``--operator-port``, default
  127.0.0.1:8001): the dashboard, the job pages, ``/metrics``, the admin actions and the
  probes, behind the read token when one is set.

Both are also set by ``CALLWARDEN_SERVE_<FIELD>`` (``HOST``, ``PORT``, ``OPERATOR_HOST``,
``OPERATOR_PORT``) and the ``--config`` file's ``[serve]`` table; a flag wins. Without a
read token the operator listener answers only a ``Host`` that is loopback, its
``operator_host`` or in ``allowed_hosts`` (``CALLWARDEN_SERVE_ALLOWED_HOSTS``, comma-
separated; ``[serve] allowed_hosts``): 421 otherwise, the probes excepted.

Configuration (environment): ``CALLWARDEN_REPLICATE_WEBHOOK_SECRET`` (``whsec_...``),
``CALLWARDEN_KIE_WEBHOOK_HMAC_KEY`` (optional; without it KIE callbacks are authenticated
by the per-job token in their URL), ``CALLWARDEN_ELEVENLABS_WEBHOOK_SECRET``, the admin
token in the variable named by ``--admin-token-env`` (default ``CALLWARDEN_ADMIN_TOKEN``;
unset: read-only), the read token in the variable named by ``--read-token-env`` (default
``CALLWARDEN_READ_TOKEN``; unset: the operator listener is open to whoever reaches it),
provider endpoints as for the worker (``ProviderSettings.from_env``) and the media store,
which must be named (``CALLWARDEN_MEDIA_S3_BUCKET``, ``CALLWARDEN_MEDIA_DIR`` or
``--media-dir``; without one it exits 2: :func:`callwarden.settings.configured_media`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from callwarden.calls.config import CallConfig, load_call_config
from callwarden.calls.finalize import Finalizer
from callwarden.calls.identity import incarnation
from callwarden.calls.pricing import Pricing, pricing_from_env
from callwarden.cli.args import port, positive_int
from callwarden.cli.process import setup_logging
from callwarden.config import provider_settings
from callwarden.database.db import open_pool, preflight
from callwarden.errors import ConfigError
from callwarden.providers.base import ProviderSettings
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import poll_task
from callwarden.providers.storage import MediaStore
from callwarden.reconciler.config import load_config
from callwarden.service.app import (
    ListenConfig,
    ServiceConfig,
    build_apps,
    load_listen_config,
    operator_exposure,
    runner,
)
from callwarden.service.webhooks import load_webhook_config
from callwarden.settings import configured_media

__all__ = ["register"]


def register(sub: Any) -> None:
    s = sub.add_parser("serve", help="webhook receivers and health on one listener; "
                                     "dashboard, /metrics and admin on another")
    s.add_argument("--host", default=None,
                   help="the webhook listener's address (default 127.0.0.1)")
    s.add_argument("--port", type=port, default=None,
                   help="the webhook listener's port (default 8000)")
    s.add_argument("--operator-host", default=None,
                   help="the operator listener's address (default 127.0.0.1: keep it off "
                        "the internet)")
    s.add_argument("--operator-port", type=port, default=None,
                   help="the operator listener's port (default 8001)")
    s.add_argument("--open-operator", action="store_true", default=None,
                   help="serve the operator listener on a non-loopback --operator-host with "
                        "no read token (refused otherwise: anyone who reaches it reads "
                        "every call's output)")
    s.add_argument("--admin-token-env", default="CALLWARDEN_ADMIN_TOKEN", metavar="VAR",
                   help="environment variable holding the admin token (unset: read-only)")
    s.add_argument("--read-token-env", default="CALLWARDEN_READ_TOKEN", metavar="VAR",
                   help="environment variable holding the operator listener's read token "
                        "(unset: no token asked)")
    s.add_argument("--media-dir", type=Path, default=None,
                   help="local media folder (else CALLWARDEN_MEDIA_DIR or "
                        "CALLWARDEN_MEDIA_S3_BUCKET; one is required)")
    s.add_argument("--pool-size", type=positive_int, default=10,
                   help="database connections this process may hold")
    s.add_argument("--config", type=Path, default=None,
                   help="settings file (TOML or JSON): [serve], [webhooks], [calls] and the "
                        "reconciler's [reconcile] (stale thresholds, legacy cutoff)")
    s.set_defaults(handler=_serve)


def listen_config(args: argparse.Namespace) -> ListenConfig:
    return load_listen_config(args.config, os.environ, {
        "host": args.host, "port": args.port, "operator_host": args.operator_host,
        "operator_port": args.operator_port, "open_operator": args.open_operator})


def service_config(args: argparse.Namespace, listen: ListenConfig) -> ServiceConfig:
    """The service's settings; stale thresholds and the legacy cutoff are the
    reconciler's own (``--config`` and ``CALLWARDEN_RECONCILE_*``), so ``/metrics`` and the
    dashboard count what the reconciler acts on. Without a read token the operator
    listener answers to ``listen``'s operator names (and loopback ones) only."""
    env = os.environ
    webhooks = load_webhook_config(args.config, env)
    reconcile = load_config(args.config, env)
    return ServiceConfig(webhooks=webhooks, admin_token=env.get(args.admin_token_env) or None,
                         read_token=env.get(args.read_token_env) or None,
                         allowed_hosts=listen.operator_names,
                         stale=reconcile.stale, attempt_cap=reconcile.attempt_cap,
                         repoll_interval_s=reconcile.repoll_interval_s,
                         legacy_cutoff=reconcile.legacy_cutoff,
                         host_left_after_s=reconcile.host_left_after_s)


async def _serve(args: argparse.Namespace, url: str) -> int:
    setup_logging(loggers=("callwarden", "aiohttp.access"))
    if args.pool_size < 1:
        raise ConfigError("--pool-size must be >= 1")
    listen = listen_config(args)
    settings = provider_settings(os.environ)
    env = dict(os.environ)
    media = configured_media(env, args.media_dir, "serve")
    config = service_config(args, listen)
    call_config = load_call_config(args.config, env)  # every setting before connecting
    pricing = pricing_from_env(env)
    exposed = operator_exposure(listen, config.read_token, args.read_token_env)
    if exposed is not None:
        logging.getLogger("callwarden.service").warning("%s", exposed)
    # both listeners bound first: a taken port is one line and exit 2 before anything
    # else starts (then handed to aiohttp as they are)
    public_sock = _bind(listen.host, listen.port, "--port")
    with public_sock, _bind(listen.operator_host, listen.operator_port,
                            "--operator-port") as operator_sock:
        await preflight(url, "serve")  # refused for good: exit 2; down: /readyz says so
        return await _run(args, url, listen, config, call_config, settings, media, pricing,
                          public_sock, operator_sock)


async def _run(args: argparse.Namespace, url: str, listen: ListenConfig,
               config: ServiceConfig, call_config: CallConfig, settings: ProviderSettings,
               media: MediaStore, pricing: Pricing, public_sock: socket.socket,
               operator_sock: socket.socket) -> int:
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

        apps = build_apps(pool, finalizer, config, poll=poll)
        public, operator = runner(apps.webhooks), runner(apps.operator)
        await public.setup()
        await operator.setup()
        try:
            await web.SockSite(public, public_sock).start()
            await web.SockSite(operator, operator_sock).start()
            print(f"callwarden serve on {_url(listen.host, public)} (webhooks, health); "
                  f"operator on {_url(listen.operator_host, operator)} (dashboard, /metrics, "
                  f"admin {'enabled' if config.admin_token else 'disabled'}, read token "
                  f"{'required' if config.read_token else 'not set'})", flush=True)
            await stop.wait()
        finally:
            await operator.cleanup()
            await public.cleanup()
            await finalizer.aclose()
    return 0


def _bind(host: str, port: int, flag: str) -> socket.socket:
    """A listening socket on ``host:port`` (what aiohttp's TCPSite would open); one taken or
    not ours is a ``ConfigError`` naming it and the flag that moves it (exit 2)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        raise ConfigError(f"serve: cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc} (another process holds it? choose "
                          f"another with {flag})") from exc


def _url(host: str, app_runner: web.AppRunner) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{app_runner.addresses[0][1]}"
