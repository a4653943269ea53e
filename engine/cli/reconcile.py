"""``callwarden reconcile [--once] [--json] [--config FILE]``: run the reconciler.

Without ``--once`` it runs a pass every (jittered) scan interval until SIGTERM or SIGINT,
finishing the batch in hand. ``--once`` runs one pass and prints its counts (``--json``:
one JSON object). Configuration: ``--config`` (TOML or JSON) and ``CALLWARDEN_RECONCILE_*``
(see :mod:`callwarden.reconciler.config`); providers from ``CALLWARDEN_<PROVIDER>_URL`` and the
API keys; media storage from ``CALLWARDEN_MEDIA_*`` (extra media hosts in
``CALLWARDEN_MEDIA_ALLOW_HOSTS``). Exit codes: 0 the pass ran (per-call provider errors
are outcomes, recorded on the calls and counted); 1 the pass could not run through
(``--once`` retries with backoff while the database is unavailable, at the claim or
during the pass, and gives up once the outage outlasts ``CALLWARDEN_DB_OUTAGE_LIMIT_S``);
2 bad configuration, or a database that refuses the URL for good (a wrong password, an
unknown role or database), found at start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import msgspec
from rich.console import Console
from rich.table import Table

from callwarden.calls.config import load_call_config
from callwarden.calls.pricing import pricing_from_env
from callwarden.cli.args import port
from callwarden.cli.process import setup_logging
from callwarden.config import provider_settings
from callwarden.database.db import open_pool, preflight
from callwarden.database.outage import configured_limit_s
from callwarden.errors import ConfigError
from callwarden.observe.metrics import start_metrics_server
from callwarden.reconciler.config import load_config
from callwarden.reconciler.loop import Counts, Reconciler
from callwarden.settings import configured_media, contradictions

__all__ = ["register"]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def register(sub: Subparsers) -> None:
    p = sub.add_parser("reconcile", help="find stuck calls and settle them")
    p.add_argument("--metrics-port", type=port, default=None, metavar="N",
                   help="expose this process's Prometheus /metrics on 127.0.0.1:N")
    p.add_argument("--once", action="store_true", help="run one pass, print its counts")
    p.add_argument("--json", action="store_true", help="with --once: counts as JSON")
    p.add_argument("--config", type=Path, default=None, help="TOML or JSON settings file")
    p.add_argument("--media-dir", type=Path, default=None,
                   help="local media folder (else CALLWARDEN_MEDIA_DIR or "
                        "CALLWARDEN_MEDIA_S3_BUCKET; one is required)")
    p.set_defaults(handler=handler)


def _print(counts: Counts, as_json: bool) -> None:
    if as_json:
        sys.stdout.buffer.write(msgspec.json.encode(counts) + b"\n")
        sys.stdout.buffer.flush()
        return
    table = Table("outcome", "calls", title="reconcile pass")
    for name, value in msgspec.structs.asdict(counts).items():
        table.add_row(name, str(value))
    Console().print(table)


async def handler(args: argparse.Namespace, url: str) -> int:
    config = load_config(args.config, os.environ)
    call_config = load_call_config(args.config, os.environ)  # every setting before connecting
    try:  # the workers' [calls] may be set apart from this process's: said, not refused
        contradictions(call_config, config)
    except ConfigError as exc:
        logging.getLogger("callwarden.reconciler").error("settings that contradict: %s", exc)
    pricing = pricing_from_env(os.environ)
    media = configured_media(os.environ, args.media_dir, "reconcile")
    setup_logging()
    if args.metrics_port is not None:
        start_metrics_server(args.metrics_port)
    await preflight(url, "reconcile")  # refused for good: exit 2; down: ridden through
    # --once retries a short wait for a connection until the outage limit (then exit 1).
    wait_s = min(5.0, configured_limit_s()) if args.once else 30.0
    async with open_pool(url, max_size=config.concurrency + 2, check=True,
                         wait_s=wait_s) as pool, \
            aiohttp.ClientSession() as session:
        reconciler = Reconciler(pool, session, provider_settings(os.environ), media,
                                config=config,
                                call_config=call_config,
                                pricing=pricing)
        if args.once:
            try:
                counts = await reconciler.reconcile_once_through_outage()
            finally:
                await reconciler.aclose()
            _print(counts, args.json)
            return 1 if counts.pass_failed or counts.interrupted else 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        logging.getLogger("callwarden.reconcile").info(
            "reconciler %s: scan every ~%gs", reconciler.owner, config.scan_interval_s)
        await reconciler.run(stop)
    return 0
