"""``callwarden worker`` (the reference worker) and ``callwarden enqueue`` (try it).

Provider endpoints and keys come from the environment (``ProviderSettings.from_env``:
``CALLWARDEN_<PROVIDER>_URL``, ``KIE_API_KEY``, ...); media go to
the store ``CALLWARDEN_MEDIA_S3_BUCKET``, ``CALLWARDEN_MEDIA_DIR`` or ``--media-dir`` names
(:func:`callwarden.settings.configured_media`): a worker with none exits 2 before it
connects, as ``reconcile`` and ``serve`` do, since it would store a call's files where no
other actor looks.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import msgspec

from callwarden.calls.config import AmbiguousCreate, CallConfig, load_call_config
from callwarden.calls.pricing import pricing_from_env
from callwarden.cli.args import count, nonnegative_float, port, positive_float, positive_int
from callwarden.cli.process import setup_logging
from callwarden.config import provider_settings
from callwarden.database.db import connect, preflight
from callwarden.database.jobs import create_job
from callwarden.errors import ConfigError
from callwarden.observe.metrics import start_metrics_server
from callwarden.providers.kinds import KINDS
from callwarden.queue.claims import input_data
from callwarden.queue.worker import run_worker
from callwarden.settings import configured_media

__all__ = ["call_config", "register"]

POLICIES: tuple[str, ...] = get_args(AmbiguousCreate)


def register(sub: Any) -> None:
    _register_worker(sub)
    _register_enqueue(sub)


def _register_worker(sub: Any) -> None:
    w = sub.add_parser("worker", help="claim pending jobs and run their calls")
    w.add_argument("--concurrency", type=positive_int, default=4,
                   help="calls in flight (default 4)")
    w.add_argument("--visibility", type=positive_float, default=60.0, metavar="S",
                   help="lease per delivery; a dead worker's job is redelivered after it")
    w.add_argument("--poll-empty", type=positive_float, default=1.0, metavar="S",
                   help="wait between claims when the queue is empty")
    w.add_argument("--grace", type=nonnegative_float, default=30.0, metavar="S",
                   help="on SIGTERM, how long in-flight calls may take to finish")
    w.add_argument("--max-deliveries", type=positive_int, default=5, metavar="N",
                   help="give up on a job delivered more than N times")
    w.add_argument("--media-dir", type=Path, default=None,
                   help="local media folder (or CALLWARDEN_MEDIA_DIR / "
                        "CALLWARDEN_MEDIA_S3_BUCKET; one is required)")
    w.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="settings file (TOML or JSON; its [calls] table); the environment "
                        "(CALLWARDEN_CALL_*) overrides it, and these flags the environment")
    w.add_argument("--ambiguous-create", choices=POLICIES, default=None,
                   help="a call left created without a task id: leave it to the "
                        "reconciler (sweep, the default) or create again (recreate)")
    w.add_argument("--ambiguous-create-for", action="append", default=[],
                   metavar="KIND=POLICY", help="per-kind policy (repeatable)")
    w.add_argument("--poll-interval", type=positive_float, default=None, metavar="S",
                   help="poll every S seconds, every kind (default: the kind's)")
    w.add_argument("--poll-budget", type=positive_float, default=None, metavar="S",
                   help="give up polling after S seconds, every kind (the reconciler "
                        "takes over; default: the kind's)")
    w.add_argument("--metrics-port", type=port, default=None, metavar="N",
                   help="expose this process's Prometheus /metrics on 127.0.0.1:N")
    w.add_argument("--finalize-lease", type=positive_float, default=None, metavar="S",
                   help="shortest finalization lease (grown to fit the media to store; "
                        "default 120)")
    w.add_argument("--media-timeout", type=positive_float, default=None, metavar="S",
                   help="time allowed to download one result (default 120)")
    w.add_argument("--store-timeout", type=positive_float, default=None, metavar="S",
                   help="time allowed to store one result (default 60)")
    w.add_argument("--lease-margin", type=positive_float, default=None, metavar="S",
                   help="a finalizer gives up this long before its lease ends (default: "
                        "15 s, or a quarter of a shorter --finalize-lease)")
    w.add_argument("--heartbeat-every", type=positive_float, default=None, metavar="S",
                   help="heartbeat a polling call at most this often (default 10)")
    w.set_defaults(handler=_worker)


def _register_enqueue(sub: Any) -> None:
    e = sub.add_parser("enqueue", help="create job rows (with a credit reservation)")
    e.add_argument("--kind", required=True, help="provider_kind, e.g. kie-standard")
    e.add_argument("--request", required=True, metavar="JSON", help="the provider request")
    e.add_argument("--credits", type=nonnegative_float, default=10.0, help="credits to reserve")
    e.add_argument("--operation", default=None, help="ElevenLabs operation, e.g. tts")
    e.add_argument("--user", default="user-1", help="the jobs' user_id")
    e.add_argument("--count", type=count, default=1, help="how many jobs to create")
    e.set_defaults(handler=_enqueue)


def _policy_pairs(pairs: list[str]) -> dict[str, AmbiguousCreate]:
    out: dict[str, AmbiguousCreate] = {}
    for pair in pairs:
        kind, _, policy = pair.partition("=")
        if policy not in POLICIES:
            raise ConfigError(f"--ambiguous-create-for {pair!r}: want KIND=sweep|recreate")
        out[kind] = "recreate" if policy == "recreate" else "sweep"
    return out


_FLAGS = {"finalize_lease": "finalize_lease_s", "heartbeat_every": "heartbeat_every_s",
          "media_timeout": "media_timeout_s", "store_timeout": "store_timeout_s",
          "lease_margin": "lease_margin_s", "ambiguous_create": "ambiguous_create"}
_ORIGINS = {**{field: "--" + flag.replace("_", "-") for flag, field in _FLAGS.items()},
            "ambiguous_create_by_kind": "--ambiguous-create-for",
            "poll_interval_s": "--poll-interval", "poll_budget_s": "--poll-budget"}


def call_config(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> CallConfig:
    """The worker's :class:`CallConfig`: defaults < ``--config`` < environment < flags
    (:func:`callwarden.calls.config.load_call_config`); validated."""
    env = dict(os.environ if env is None else env)
    if "CALLWARDEN_AMBIGUOUS_CREATE" in env:  # the older name of CALLWARDEN_CALL_...
        env.setdefault("CALLWARDEN_CALL_AMBIGUOUS_CREATE", env["CALLWARDEN_AMBIGUOUS_CREATE"])
    flags: dict[str, Any] = {field: getattr(args, flag) for flag, field in _FLAGS.items()
                             if getattr(args, flag) is not None}
    if args.ambiguous_create_for:
        flags["ambiguous_create_by_kind"] = _policy_pairs(args.ambiguous_create_for)
    if args.poll_interval is not None:
        flags["poll_interval_s"] = dict.fromkeys(KINDS, args.poll_interval)
    if args.poll_budget is not None:
        flags["poll_budget_s"] = dict.fromkeys(KINDS, args.poll_budget)
    return load_call_config(args.config, env, flags, origins=_ORIGINS)


async def _worker(args: argparse.Namespace, url: str) -> int:
    setup_logging()
    if args.concurrency < 1 or args.visibility <= 0 or args.poll_empty <= 0:
        raise ConfigError("--concurrency must be >= 1, --visibility and --poll-empty > 0")
    config = call_config(args)
    settings = provider_settings(os.environ)
    media = configured_media(os.environ, args.media_dir, "worker")
    if args.metrics_port is not None:
        _, port = start_metrics_server(args.metrics_port)
        logging.getLogger("callwarden.worker").info("metrics on 127.0.0.1:%d/metrics", port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await preflight(url, "worker")  # a wrong password: exit 2 now, not retried forever
    return await run_worker(url, settings, media,
                            concurrency=args.concurrency, visibility_s=args.visibility,
                            poll_empty_s=args.poll_empty, stop=stop, config=config,
                            grace_s=args.grace, max_deliveries=args.max_deliveries,
                            callback_base_url=os.environ.get("CALLWARDEN_CALLBACK_BASE_URL"),
                            pricing=pricing_from_env(os.environ))


async def _enqueue(args: argparse.Namespace, url: str) -> int:
    if args.kind not in KINDS:
        raise ConfigError(f"--kind {args.kind!r}: unknown provider_kind; "
                          f"known: {', '.join(KINDS)}")
    try:
        request = msgspec.json.decode(args.request)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"--request is not JSON: {exc}") from exc
    if not isinstance(request, dict):
        raise ConfigError("--request must be a JSON object")
    data = input_data(args.kind, request, args.operation)
    conn = await connect(url)
    async with conn:
        for _ in range(max(args.count, 0)):
            job = await create_job(conn, user_id=args.user, input_data=data,
                                   credits=args.credits)
            print(job)
    return 0
