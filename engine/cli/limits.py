"""``callwarden limits``: the provider accounts' admission limits (docs/admission.md) as the
database holds them, with each account's calls in flight and the jobs waiting for it;
``callwarden limits apply`` makes them what the settings file's ``[limits.<account>]``
tables say (``--config``, else ``CALLWARDEN_CONFIG``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rich.console import Console

from callwarden.calls.config import load_call_config
from callwarden.calls.limits import AccountLimit, apply_limits, limits_from, shown_limits
from callwarden.config import config_path, read_section
from callwarden.database.db import connect
from callwarden.errors import ConfigError
from callwarden.reconciler.config import load_config
from callwarden.service.app import load_listen_config
from callwarden.service.webhooks import load_webhook_config

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["caps_in_words", "configured_limits", "limit_of", "register"]


def configured_limits(given: Path | None) -> dict[str, AccountLimit]:
    """The settings file's accounts (none without a file or a ``[limits]`` table)."""
    path = config_path(given, os.environ)
    return {} if path is None else limits_from(read_section(path, "limits"),
                                              f"{path} [limits]")


def caps_in_words(limit: AccountLimit, open_calls: int | None = None) -> list[str]:
    """An account's caps as people say them: ``["5 in flight", "2 per user", "20 creates
    per 10 s"]`` (with ``open_calls``, the first as ``"1/5 in flight"``)."""
    parts = []
    if limit.in_flight is not None:
        now = "" if open_calls is None else f"{open_calls}/"
        parts.append(f"{now}{limit.in_flight} in flight")
    if limit.tenant_in_flight is not None:
        parts.append(f"{limit.tenant_in_flight} per user")
    if limit.creates is not None and limit.per_s is not None:
        parts.append(f"{limit.creates} creates per {limit.per_s:g} s")
    return parts


def limit_of(row: Mapping[str, Any]) -> AccountLimit:
    """The caps of a ``callwarden.limits`` row (as ``limits_show`` answers it)."""
    return AccountLimit(kinds=tuple(row["kinds"]), in_flight=row["in_flight"],
                        tenant_in_flight=row["tenant_in_flight"], creates=row["creates"],
                        per_s=row["per_s"], wait_s=row["wait_s"])


def _cap(row: dict[str, Any]) -> str:
    parts = caps_in_words(limit_of(row), row["open_calls"])
    if row["rate_factor"] < 1:  # the provider's 429s slowed it (docs/admission.md)
        parts.append(f"slowed to x{row['rate_factor']:.2f} by the provider's 429s")
    if row["paused_s"]:
        parts.append(f"paused {row['paused_s']:.0f} s more")
    return ", ".join(parts)


async def _limits(args: argparse.Namespace, url: str) -> int:
    out = Console()
    for load in (load_config, load_call_config, load_webhook_config, load_listen_config):
        load(args.config, os.environ)  # the whole file is valid, as every command asks
    wanted = configured_limits(args.config)  # a bad file is refused before we connect
    async with await connect(url) as conn:
        if args.action == "apply":
            if not wanted and not args.clear:
                raise ConfigError("no [limits.<account>] table in the settings file (give "
                                  "--config, or --clear to remove every limit)")
            removed = await apply_limits(conn, wanted)
            out.print(f"limits applied: {', '.join(wanted) or 'none'}"
                      + (f"; removed: {', '.join(removed)}" if removed else ""), markup=False)
        rows = await shown_limits(conn)
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(rows) + b"\n")
        return 0
    if not rows:
        out.print("no limits: every start is admitted", markup=False)
    for r in rows:
        out.print(f"{r['account']} ({', '.join(r['kinds'])}): {_cap(r)}; "
                  f"{r['waiting']} job(s) waiting", markup=False, soft_wrap=True)
    return 0


def register(sub: Subparsers) -> None:
    """Add ``limits`` to the ``callwarden`` parser."""
    p = sub.add_parser("limits", help="provider accounts' admission limits; apply them",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("action", nargs="?", choices=("show", "apply"), default="show",
                   help="show (default) or apply the settings file's limits")
    p.add_argument("--config", type=Path, default=None, help="TOML or JSON settings file")
    p.add_argument("--clear", action="store_true",
                   help="with apply: a file with no limits removes every limit")
    p.add_argument("--json", action="store_true", help="the accounts as one JSON array")
    p.set_defaults(handler=_limits)
