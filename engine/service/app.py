"""The service's two applications over one connection pool.

- The **webhook** application (:func:`build_webhook_app`): the webhook routes and the
  health probes (``/healthz``, ``/readyz`` without the database's error text) — all that
  providers, which must reach it from the internet, ever need.
- The **operator** application (:func:`build_operator_app`): the dashboard, the job pages,
  ``/metrics``, the admin actions and the probes (:mod:`callwarden.service.operator`),
  behind a read token when one is set, else answering only a ``Host`` that names it
  (loopback, ``allowed_hosts``). ``callwarden serve`` binds it to 127.0.0.1 on its own
  port (:class:`ListenConfig`).

:func:`build_apps` builds both, sharing one outage tracker. The caller owns the pool
(opened) and runs each app on its own listener (``callwarden serve``, or
:func:`runner` in tests and embeddings): the webhook app never inflates a compressed
request body (``auto_decompress=False``, and its routes refuse any ``Content-Encoding``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from aiohttp import web
from aiohttp.web_log import AccessLogger

from callwarden import config as actor_config
from callwarden.calls.finalize import Finalizer
from callwarden.database.boundary import connection
from callwarden.database.clock import Clock, DatabaseClock
from callwarden.database.db import Pool
from callwarden.database.outage import Outage
from callwarden.database.write import execute
from callwarden.errors import ConfigError, DatabaseError, DatabaseUnavailable
from callwarden.reconciler.config import ReconcileConfig
from callwarden.rules.redact import without_callback_token
from callwarden.rules.stale import StaleRule
from callwarden.service.dashboard import Dashboard
from callwarden.service.operator import (
    allowed_host,
    build_operator_routes,
    host_guard,
    is_loopback,
    read_guard,
)
from callwarden.service.probes import Probes
from callwarden.service.webhooks import Receiver, TaskPoll, WebhookConfig

__all__ = [
    "PATH_REDACTED",
    "RECEIVER",
    "ListenConfig",
    "RedactingAccessLogger",
    "ServiceApps",
    "ServiceConfig",
    "build_apps",
    "build_operator_app",
    "build_webhook_app",
    "is_loopback",
    "load_listen_config",
    "operator_exposure",
    "redact_path",
    "runner",
]

RECEIVER = web.AppKey("receiver", Receiver)


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """``admin_token``: enables the admin actions (unset: read-only); ``read_token``:
    wanted by every operator route but the probes (unset: whoever reaches the operator
    listener reads it, but only under a ``Host`` that is a loopback name or address or one
    of ``allowed_hosts`` — host names or addresses, no port — so that a DNS-rebinding page
    reads nothing; ``callwarden serve`` puts its ``operator_host`` there). ``stale``,
    ``legacy_cutoff``, ``host_left_after_s``, ``attempt_cap`` and ``repoll_interval_s``
    are the reconciler's (``callwarden serve`` reads its settings): what ``/metrics`` and
    the dashboard call stale (and a reservation the host left), and the cap a failed
    webhook-triggered finalization counts towards."""

    webhooks: WebhookConfig = msgspec.field(default_factory=WebhookConfig)
    admin_token: str | None = None
    read_token: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    stale: StaleRule = msgspec.field(default_factory=lambda: ReconcileConfig().stale)
    legacy_cutoff: datetime | None = None
    host_left_after_s: float = msgspec.field(
        default_factory=lambda: ReconcileConfig().host_left_after_s)
    attempt_cap: int = msgspec.field(default_factory=lambda: ReconcileConfig().attempt_cap)
    repoll_interval_s: float = msgspec.field(
        default_factory=lambda: ReconcileConfig().repoll_interval_s)
    prune_every_s: float = 60.0
    ready_timeout_s: float = 2.0


class ListenConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where ``callwarden serve`` listens: ``host``:``port`` for the webhooks (the
    listener providers reach), ``operator_host``:``operator_port`` for the operator
    surface (loopback by default). Port 0: any free port. ``allowed_hosts``: names (or
    addresses) besides loopback ones and ``operator_host`` that the operator listener
    answers to while it has no read token (a name it is reached by, behind a proxy or a
    tunnel); any other ``Host`` gets 421. ``open_operator``: serve the operator listener
    on a non-loopback address with no read token (refused unless said: see
    :func:`operator_exposure`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    operator_host: str = "127.0.0.1"
    operator_port: int = 8001
    allowed_hosts: tuple[str, ...] = ()
    open_operator: bool = False

    def __post_init__(self) -> None:
        for name in ("port", "operator_port"):
            value = getattr(self, name)
            if not 0 <= value < 65536:
                raise ConfigError(f"{name} must be 0..65535, got {value}")
        for name in ("host", "operator_host"):
            if not getattr(self, name):
                raise ConfigError(f"{name} must not be empty")
        if self.port and (self.host, self.port) == (self.operator_host, self.operator_port):
            raise ConfigError(f"the operator listener needs its own port: both are "
                              f"{self.host}:{self.port}")
        for entry in self.allowed_hosts:
            allowed_host(entry)

    @property
    def operator_names(self) -> tuple[str, ...]:
        """The names the operator listener answers to without a read token, besides
        loopback ones: its own host and ``allowed_hosts``."""
        return (self.operator_host, *self.allowed_hosts)


actor_config.register("serve", ListenConfig)


def operator_exposure(listen: ListenConfig, read_token: str | None, token_env: str
                      ) -> str | None:
    """The operator listener (dashboard, job pages with every call's output, raw answers,
    ``/metrics``) on a non-loopback address with no read token: a
    :class:`~callwarden.errors.ConfigError` naming the settings, unless the operator said
    ``open_operator``; then the warning to log. ``None``: nothing to say. The ``Host``
    check stops DNS rebinding; it is not authentication."""
    if is_loopback(listen.operator_host) or read_token:
        return None
    exposed = (f"the operator listener (dashboard, job pages, /metrics) binds "
               f"{listen.operator_host} with no read token: anyone who reaches it reads "
               f"every call's output")
    if not listen.open_operator:
        raise ConfigError(f"{exposed}; set {token_env}, or bind it to loopback, or serve "
                          "it open on purpose with --open-operator ([serve] open_operator "
                          "= true, CALLWARDEN_SERVE_OPEN_OPERATOR=true)")
    return f"{exposed} (open_operator is set)"


def load_listen_config(path: Path | None, env: Mapping[str, str],
                       flags: Mapping[str, Any] | None = None) -> ListenConfig:
    """Defaults < ``path``'s ``[serve]`` < ``CALLWARDEN_SERVE_<FIELD>`` < ``flags``
    (``--host``, ``--port``, ``--operator-host``, ``--operator-port``; ``None``: unset)."""
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    origins = {k: "--" + k.replace("_", "-") for k in given}
    return actor_config.load(ListenConfig, path=path, env=env, prefix="CALLWARDEN_SERVE_",
                             section="serve", overrides=given, origins=origins)


async def _prune_loop(pool: Pool, config: ServiceConfig, now: Callable[[], datetime]) -> None:
    keep = timedelta(seconds=2 * config.webhooks.longest_tolerance_s)
    while True:
        with contextlib.suppress(DatabaseUnavailable, DatabaseError):
            async with connection(pool) as conn:
                await execute(conn, "webhook_prune_deliveries", {"before": now() - keep})
        await asyncio.sleep(config.prune_every_s)


#: What stands for a callback token in a logged path (a path segment: ``[redacted]``
#: would be percent-escaped in it).
PATH_REDACTED = "redacted"


def redact_path(path: str) -> str:
    """``path`` with the secret callback token of a signal scheme's callback URL (KIE's:
    ``/webhooks/<provider>/<job>/<token>``) blanked out, as the job page blanks it
    (:func:`callwarden.rules.redact.without_callback_token`)."""
    return without_callback_token(path, PATH_REDACTED)


class RedactingAccessLogger(AccessLogger):
    """aiohttp's access log, without the secrets that travel in URL paths."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse,
            time: float) -> None:
        redacted = redact_path(request.rel_url.raw_path)
        if redacted != request.rel_url.raw_path:
            request = request.clone(rel_url=redacted)
        super().log(request, response, time)


def runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The ``AppRunner`` either app wants: secrets redacted from the access log, request
    bodies never inflated by aiohttp (a gzip bomb stays the size it was sent)."""
    return web.AppRunner(app, access_log_class=RedactingAccessLogger, auto_decompress=False,
                         **kwargs)


def _probes(pool: Pool, config: ServiceConfig, now: Clock, outage: Outage) -> Probes:
    return Probes(pool, config.stale, config.legacy_cutoff, now, outage,
                  timeout_s=config.ready_timeout_s,
                  host_left_after_s=config.host_left_after_s)


def _outage() -> Outage:
    return Outage(logging.getLogger("callwarden.service"), "service")


def build_webhook_app(pool: Pool, finalizer: Finalizer, config: ServiceConfig, *,
                      clock: Callable[[], float] = time.time, now: Clock | None = None,
                      poll: TaskPoll | None = None, outage: Outage | None = None
                      ) -> web.Application:
    """The internet-facing app: the webhook routes, ``/healthz`` and ``/readyz``. ``clock``
    (unix seconds) checks webhook signature timestamps, ``now`` stamps events and windows
    (default: the database's clock), ``poll`` checks a KIE task a callback signals. Run it
    with :func:`runner`."""
    now = now if now is not None else DatabaseClock()
    outage = outage if outage is not None else _outage()
    app = web.Application()
    receiver = Receiver(pool, finalizer, config.webhooks, clock=clock, now=now, poll=poll,
                        outage=outage, attempt_cap=config.attempt_cap,
                        repoll_interval_s=config.repoll_interval_s)
    app.add_routes(receiver.routes())
    app.add_routes(_probes(pool, config, now, outage).routes(detail=False))

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        pruner = asyncio.get_running_loop().create_task(_prune_loop(pool, config, now))
        yield
        pruner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pruner
        await receiver.drain()

    app.cleanup_ctx.append(lifecycle)
    app[RECEIVER] = receiver
    return app


def build_operator_app(pool: Pool, config: ServiceConfig, *, now: Clock | None = None,
                       outage: Outage | None = None) -> web.Application:
    """The operator app: the dashboard, the job pages, ``/metrics``, the admin actions and
    the probes; behind ``config.read_token`` when one is set, else answering only a
    ``Host`` that is loopback or in ``config.allowed_hosts`` (the probes always). Never
    expose it where the webhooks are (docs/service.md, "Deployment")."""
    now = now if now is not None else DatabaseClock()
    outage = outage if outage is not None else _outage()
    guard = (read_guard(config.read_token, config.admin_token) if config.read_token
             else host_guard(config.allowed_hosts))
    app = web.Application(middlewares=[guard])
    app.add_routes(build_operator_routes(
        pool, _probes(pool, config, now, outage),
        Dashboard(pool, config.stale, now=now, admin=bool(config.admin_token)),
        config.admin_token, now))
    return app


class ServiceApps(NamedTuple):
    webhooks: web.Application
    operator: web.Application


def build_apps(pool: Pool, finalizer: Finalizer, config: ServiceConfig, *,
               clock: Callable[[], float] = time.time, now: Clock | None = None,
               poll: TaskPoll | None = None) -> ServiceApps:
    """Both apps over ``pool``, sharing one clock and one outage tracker (what
    ``callwarden serve`` runs, each on its own listener)."""
    now = now if now is not None else DatabaseClock()
    outage = _outage()
    return ServiceApps(
        webhooks=build_webhook_app(pool, finalizer, config, clock=clock, now=now, poll=poll,
                                   outage=outage),
        operator=build_operator_app(pool, config, now=now, outage=outage))
