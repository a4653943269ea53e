"""``callwarden``: the command-line face over the engine and projections.

Each group of subcommands lives in its own ``engine/cli/<command>.py`` module exposing
``register(sub)`` (add its parsers, each with ``handler=<async fn(args, url) -> int>`` or
``sync_handler=<fn(args) -> int>`` as a default) — this module only assembles them, and
gives every command the global options (``--data-dir``, before or after the command) and
its ``--help``'s form (:mod:`callwarden.cli.helptext`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.text import Text

from callwarden.cli.helptext import HelpFormatter, tidy
from callwarden.cli.process import env_help
from callwarden.config import load_providers
from callwarden.database.db import connect, resolve_database_url
from callwarden.database.migrate import migrate
from callwarden.errors import CallwardenError
from callwarden.providers.simulator.core import KEY_HELP
from callwarden.providers.simulator.core import add_arguments as add_simulator_arguments
from callwarden.replay.status import print_status, status_report
from callwarden.settings import unknown_variables

__all__ = ["COMMAND_MODULES", "build_parser", "console", "main"]

def _console() -> Console:
    """A console made per use, so COLUMNS and the terminal are read when it prints."""
    return Console()

# Modules adding subcommands; a missing one (not yet written) is skipped.
COMMAND_MODULES = ["callwarden.cli.audit", "callwarden.cli.jobs", "callwarden.cli.worker",
                   "callwarden.cli.reconcile", "callwarden.cli.demo", "callwarden.cli.serve",
                   "callwarden.cli.check", "callwarden.cli.grant", "callwarden.cli.limits"]


async def _migrate(args: argparse.Namespace, url: str) -> int:
    conn = await connect(url)
    async with conn:
        applied = await migrate(conn)
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "none"
        _console().print(f"applied migrations: {names}")
        await print_status(conn, _console())
    return 0


async def _status(args: argparse.Namespace, url: str) -> int:
    conn = await connect(url)
    async with conn:
        if args.json:
            sys.stdout.buffer.write(msgspec.json.encode(await status_report(conn)) + b"\n")
            sys.stdout.buffer.flush()
        else:
            await print_status(conn, _console())
    return 0


def _simulator(args: argparse.Namespace) -> int:
    from callwarden.providers.simulator.core import forwarded, main

    return main(forwarded(args))


def _version() -> str:
    try:
        return metadata.version("callwarden")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--data-dir", type=Path, default=default,
                        help="embedded Postgres data folder (ignored when DATABASE_URL is set; "
                             "default: the user's data folder)")


def _finish(sub: Any) -> None:
    """Every command takes the global options after it too (given there, they win; not
    given, those before the command stand: SUPPRESS leaves them), and its --help is plain
    text ending with the environment variables it reads."""
    for name, parser in sub.choices.items():
        _global_options(parser, argparse.SUPPRESS)
        block = env_help(name)
        if block is not None:
            parser.epilog = f"{parser.epilog}\n\n{block}" if parser.epilog else block
        tidy(parser)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="callwarden",
        description="Durable, recoverable, billed-exactly-once calls to external AI "
                    "providers, on Postgres. Start with: callwarden demo",
        epilog="With DATABASE_URL unset, an embedded Postgres runs in --data-dir.",
        formatter_class=HelpFormatter)
    _global_options(p, None)
    p.add_argument("--version", action="version", version=f"callwarden {_version()}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="callwarden COMMAND --help tells more")
    sub.add_parser("migrate", help="apply pending migrations").set_defaults(handler=_migrate)
    status = sub.add_parser("status", help="migrations applied; jobs by status and call state")
    status.add_argument("--json", action="store_true", help="the same as one JSON object")
    status.set_defaults(handler=_status)
    sim = sub.add_parser("simulator", help="run the provider simulator on 127.0.0.1",
                         description="Run the provider simulator (KIE, Replicate, "
                                     "ElevenLabs, Anthropic) on one port.",
                         epilog=KEY_HELP)
    add_simulator_arguments(sim, default_port=8080)
    sim.set_defaults(sync_handler=_simulator)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    _finish(sub)
    return p


def console() -> int:
    """The ``callwarden`` console script: the working directory on ``sys.path``, as
    ``python -m callwarden.cli``, ``arq``, ``celery`` and ``uvicorn`` put it, so a host's
    adapters load from its root (``CALLWARDEN_PROVIDERS=providers:PROVIDERS``); last, not
    first, so a stray ``secrets.py`` or ``statistics.py`` there never stands in for the
    standard library or an installed package. Then :func:`main`."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.append(here)
    return main()


def _warn_unknown(args: argparse.Namespace) -> None:
    """A line on stderr per ``CALLWARDEN_*`` variable nothing reads that is a likely typo of
    one that is (the token variables a command was told to read count as read)."""
    told = [getattr(args, n) for n in ("admin_token_env", "read_token_env") if hasattr(args, n)]
    for line in unknown_variables(os.environ, also=told, likely_typos=True):
        Console(stderr=True).print(Text.assemble(("warning:", "yellow"), f" {line}"),
                                   soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        load_providers(os.environ)  # a host's kinds, before any command reads its settings
        _warn_unknown(args)
        if getattr(args, "sync_handler", None) is not None:
            return int(args.sync_handler(args))
        url = resolve_database_url(args.data_dir)
        return int(asyncio.run(args.handler(args, url)))
    except CallwardenError as exc:
        # A message is shown as it is: no markup, no emoji codes (``module:X:`` would
        # print as a cross), one line.
        Console(stderr=True).print(Text.assemble(("error:", "red"), f" {exc}"), soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        return 130

