"""``callwarden check``: what a host's configuration or schema lacks, before anything runs.

Every actor's settings are read as the actor reads them (the ``--config`` file and the
environment: ``[reconcile]``, ``[calls]``, ``[webhooks]``, ``[serve]``, the price list,
the provider adapters, the media store); then the database: every migration applied, and
the host's tables against the host contract (:mod:`callwarden.database.contract`): each
column callwarden reads or writes present with a compatible type, no NOT NULL column
without a default in a table callwarden inserts into, and a CHECK on ``jobs.status`` that
allows the statuses callwarden writes; and who can reach callwarden's schema (every role
but its owner and the runtime roles is a problem: :mod:`callwarden.cli.grant`). The
admission limits (``[limits.<account>]``, docs/admission.md): each account's kinds and caps
in words (a note), a kind callwarden does not know (a problem, with the closest known
kind), and the file against ``callwarden.limits``: an account the database lacks or holds
with other caps is a problem (run ``callwarden limits apply``), one only the database
holds a note. Each finding is one line (a problem on stderr);
exit 2 if any is a problem, 0 otherwise (notes, such as a provider with no API key, do not
fail it). One run names every problem: the settings' and the database's. ``--json``: one
object, ``{"findings": [{"level", "text"}...], "problems": N}``, the exit status the same.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec
from rich.console import Console
from rich.text import Text

from callwarden.calls.config import CallConfig, load_call_config
from callwarden.calls.limits import AccountLimit, shown_limits
from callwarden.calls.pricing import pricing_from_env
from callwarden.cli.grant import privilege_findings
from callwarden.cli.limits import caps_in_words, configured_limits, limit_of
from callwarden.config import provider_settings
from callwarden.database.contract import CONTRACT, JOB_STATUSES_WRITTEN, Column, Family
from callwarden.database.db import Conn, connect
from callwarden.database.migrate import available, pending
from callwarden.database.write import execute
from callwarden.errors import CallwardenError, ConfigError, DatabaseUnavailable
from callwarden.providers.base import ProviderSettings
from callwarden.providers.kinds import BUILTIN_PROVIDERS, KINDS
from callwarden.reconciler.config import ReconcileConfig, load_config
from callwarden.replay.audit import host_left
from callwarden.rules.human import duration
from callwarden.rules.spelling import did_you_mean
from callwarden.service.app import ListenConfig, load_listen_config, operator_exposure
from callwarden.service.webhooks import load_webhook_config
from callwarden.settings import configured_media, contradictions

if TYPE_CHECKING:
    from collections.abc import Callable

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["register"]

Level = Literal["ok", "note", "problem"]
Finding = tuple[Level, str]

#: information_schema's udt_name values each family accepts
_TYPES: dict[Family, frozenset[str]] = {
    "uuid": frozenset({"uuid"}),
    "text": frozenset({"text", "varchar", "bpchar"}),
    "text or uuid": frozenset({"text", "varchar", "bpchar", "uuid"}),
    "jsonb": frozenset({"jsonb"}),
    "numeric": frozenset({"numeric", "int2", "int4", "int8", "float4", "float8"}),
    "integer": frozenset({"int2", "int4", "int8", "numeric"}),
    "boolean": frozenset({"bool"}),
    "timestamptz": frozenset({"timestamptz"}),
    "text[]": frozenset({"_text", "_varchar"}),
}


def register(sub: Subparsers) -> None:
    p = sub.add_parser("check", help="what the host's configuration or schema lacks (exit 2)",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--config", type=Path, default=None, help="TOML or JSON settings file")
    p.add_argument("--media-dir", type=Path, default=None,
                   help="the media folder reconcile and serve would be given")
    p.add_argument("--read-token-env", default="CALLWARDEN_READ_TOKEN", metavar="VAR",
                   help="the variable serve reads its operator read token from (as "
                        "serve's --read-token-env)")
    p.add_argument("--json", action="store_true",
                   help="the findings as one JSON object (level, text; problems)")
    p.set_defaults(handler=handler)


def _settings(args: argparse.Namespace) -> list[Finding]:
    env = os.environ
    steps: list[tuple[str, Callable[[], object]]] = [
        ("provider adapters and endpoints", lambda: provider_settings(env)),
        ("[reconcile] settings", lambda: load_config(args.config, env)),
        ("[calls] settings", lambda: load_call_config(args.config, env)),
        ("[webhooks] settings", lambda: load_webhook_config(args.config, env)),
        ("[serve] listeners", lambda: load_listen_config(args.config, env)),
        ("price list", lambda: pricing_from_env(env)),
        ("media store", lambda: configured_media(env, args.media_dir, "reconcile and serve")),
        ("[limits] admission limits", lambda: configured_limits(args.config)),
    ]
    found: list[Finding] = []
    read: list[object] = []
    for what, step in steps:
        try:
            read.append(step())
        except (CallwardenError, ValueError) as exc:
            found.append(("problem", f"{what}: {exc}"))
            read.append(None)
        else:
            found.append(("ok", what))
    limits = read[7]
    if isinstance(limits, dict):
        found += _limit_findings(limits, isinstance(read[0], ProviderSettings))
    reconcile, calls = read[1], read[2]
    if isinstance(reconcile, ReconcileConfig) and isinstance(calls, CallConfig):
        try:
            contradictions(calls, reconcile)
        except ConfigError as exc:
            found.append(("problem", f"settings that contradict: {exc}"))
    listen = read[4]
    if isinstance(listen, ListenConfig):
        try:
            exposed = operator_exposure(listen, env.get(args.read_token_env),
                                        args.read_token_env)
        except ConfigError as exc:
            found.append(("problem", f"[serve] operator listener: {exc}"))
        else:
            if exposed:
                found.append(("note", exposed))
    settings = read[0]
    if isinstance(settings, ProviderSettings):
        for name in BUILTIN_PROVIDERS:
            endpoint = getattr(settings, name)
            if not endpoint.api_key:
                kinds = ", ".join(k for k, s in KINDS.items() if s.provider == name)
                found.append(("note", f"no API key for {name} ({kinds}): its calls would be "
                                      "refused upstream"))
    return found


_DEFAULT_WAIT_S = AccountLimit(kinds=("-",)).wait_s


def _described(account: str, limit: AccountLimit) -> str:
    """``kie-main (kie-standard, kie-veo): 5 in flight, 2 per user, 20 creates per 10 s``
    (and its wait when not the default)."""
    words = caps_in_words(limit)
    if limit.wait_s != _DEFAULT_WAIT_S:
        words.append(f"a refused start waits {limit.wait_s:g} s")
    return f"{account} ({', '.join(limit.kinds)}): {', '.join(words)}"


def _limit_findings(limits: Mapping[str, AccountLimit], kinds_loaded: bool) -> list[Finding]:
    """Each configured account in words (a note); a kind callwarden does not know (with
    the host's providers loaded) is a problem: no call is of that kind, so the calls it
    meant would start unlimited."""
    found: list[Finding] = [("note", f"limits {_described(a, limit)}")
                            for a, limit in limits.items()]
    if not kinds_loaded:
        if limits:
            found.append(("note", "[limits] kinds not checked: the provider adapters did "
                                  "not load (above)"))
        return found
    for account, limit in limits.items():
        for kind in limit.kinds:
            if kind not in KINDS:
                found.append(("problem", f"[limits] {account}: unknown kind {kind!r}"
                                         f"{did_you_mean(kind, KINDS)}: no call is of that "
                                         "kind, so the calls it meant start unlimited"))
    return found


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return f"[{', '.join(map(str, value))}]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _differences(held: AccountLimit, wanted: AccountLimit) -> list[str]:
    """The settings whose values differ: ``in_flight 3 in callwarden.limits, 5 in the
    file`` (kinds compared as sets: their order means nothing to a start)."""
    out = []
    for field in msgspec.structs.fields(AccountLimit):
        have, want = getattr(held, field.name), getattr(wanted, field.name)
        same = set(have) == set(want) if field.name == "kinds" else have == want
        if not same:
            out.append(f"{field.name} {_shown(have)} in callwarden.limits, {_shown(want)} "
                       "in the file")
    return out


async def _limits_held(conn: Conn, wanted: Mapping[str, AccountLimit]) -> list[Finding]:
    """The settings file's accounts against ``callwarden.limits``, which every start
    obeys: an account it lacks or holds otherwise is a problem, one only it holds a note."""
    held = {str(r["account"]): limit_of(r) for r in await shown_limits(conn)}
    found: list[Finding] = []
    for account, want in wanted.items():
        have = held.get(account)
        if have is None:
            found.append(("problem", f"limits {account}: in the settings file, not in "
                                     "callwarden.limits: no start obeys it; run "
                                     "callwarden limits apply"))
        elif differs := _differences(have, want):
            found.append(("problem", f"limits {account}: callwarden.limits differs from the "
                                     f"settings file ({'; '.join(differs)}): starts obey "
                                     "the database; run callwarden limits apply"))
    for account, have in held.items():
        if account not in wanted:
            found.append(("note", f"limits {_described(account, have)}: in "
                                  "callwarden.limits, not in the settings file (its starts "
                                  "obey it; callwarden limits apply removes an account the "
                                  "file does not name)"))
    if wanted and not any(level == "problem" for level, _ in found):
        found.append(("ok", f"callwarden.limits holds the settings file's {len(wanted)} "
                            "account(s)"))
    return found


def _columns(rows: list[dict[str, object]]) -> list[Finding]:
    have: dict[tuple[str, str], dict[str, object]] = {
        (str(r["table_name"]), str(r["column_name"])): r for r in rows}
    tables = {t for t, _ in have}
    found: list[Finding] = []
    for table in CONTRACT:
        if table.name not in tables:
            found.append(("problem", f"table {table.name} is missing (callwarden migrate "
                                     "creates the baseline on an empty database)"))
            continue
        for column in table.columns:
            row = have.get((table.name, column.name))
            if row is None:
                found.append(("problem", f"{table.name}.{column.name} is missing "
                                         f"({column.family}: {column.why})"))
            elif str(row["udt_name"]) not in _TYPES[column.family]:
                found.append(("problem", f"{table.name}.{column.name} is {row['udt_name']}, "
                                         f"callwarden needs {column.family} ({column.why})"))
            elif row["max_chars"] is not None:
                found.append(_limited(table.name, column, int(str(row["max_chars"])),
                                      str(row["declared"])))
        if table.inserts is not None:
            ours = {c.name for c in table.columns} | {"id", "created_at", "updated_at"}
            for (t, name), row in sorted(have.items()):
                if (t == table.name and name not in ours and row["is_nullable"] == "NO"
                        and row["column_default"] is None):
                    found.append(("problem" if table.always else "note",
                                  f"{t}.{name} is NOT NULL without a default: "
                                  f"{table.inserts} inserts {t} rows without it"))
    return found


def _limited(table: str, column: Column, limit: int, declared: str) -> Finding:
    """A length limit on a text column: a problem below what callwarden writes there."""
    if column.min_chars is not None and limit < column.min_chars:
        return ("problem", f"{table}.{column.name} is {declared}: callwarden writes up to "
                           f"{column.min_chars} characters there; a longer one would fail "
                           "the write that ends the call")
    return ("note", f"{table}.{column.name} is {declared}: a longer value would fail the "
                    "write")


def _allowed(definition: str) -> set[str] | None:
    """The values a CHECK of the form ``status = ANY (ARRAY[...])`` / ``IN (...)`` allows
    (on the column or, for a domain, ``VALUE``); ``None`` for any other expression."""
    upper = definition.upper()
    if "= ANY" not in upper or any(w in upper for w in (" AND ", " OR ", " NOT ", " IS ",
                                                        "<>", "!=")):
        return None
    return set(re.findall(r"'([^']*)'", definition))


def _status_checks(rows: list[dict[str, object]]) -> list[Finding]:
    found: list[Finding] = []
    for row in rows:
        definition = str(row["definition"])
        allowed = _allowed(definition)
        if allowed is None:
            found.append(("note", f"jobs.status CHECK {row['name']} ({definition}): make sure "
                                  f"it allows {', '.join(JOB_STATUSES_WRITTEN)}, which "
                                  "callwarden writes"))
            continue
        missing = [s for s in JOB_STATUSES_WRITTEN if s not in allowed]
        if missing:
            found.append(("problem", f"jobs.status CHECK {row['name']} does not allow "
                                     f"{', '.join(missing)}, which callwarden writes "
                                     f"({definition})"))
    return found


async def _database(url: str, host_left_after_s: float,
                    limits: Mapping[str, AccountLimit] | None) -> list[Finding]:
    """``limits``: the settings file's accounts (``None``: the file's [limits] could not be
    read, a problem named with the settings)."""
    found: list[Finding] = []
    conn = await connect(url)
    async with conn:
        waiting = await pending(conn)
        if waiting:
            names = ", ".join(f"{m.version:04d}_{m.name}" for m in waiting)
            found.append(("problem", f"{len(waiting)} of {len(available())} migrations not "
                                     f"applied ({names}): run callwarden migrate"))
        else:
            found.append(("ok", f"all {len(available())} migrations applied"))
        columns = _columns(await execute(conn, "check_host_columns", {}))
        found += columns or [("ok", "the host tables hold every column callwarden uses")]
        found += _status_checks(await execute(conn, "check_status_constraints", {}))
        found += await privilege_findings(conn)
        if not waiting:
            found += await _host_left(conn, host_left_after_s)
            if limits is not None:
                found += await _limits_held(conn, limits)
    return found


async def _host_left(conn: Conn, after_s: float) -> list[Finding]:
    """What the host left reserved on jobs it ended (a note: data, not a setting)."""
    now = (await execute(conn, "clock_now", {}))[0]["now"]
    left = await host_left(conn, now=now, after_s=after_s)
    if not left.reservations:
        return [("ok", f"no reservation left reserved on a job the host ended over "
                       f"{duration(after_s)} ago")]
    return [("note", f"{left.reservations} reservation(s) ({left.credits:g} credits) still "
                     f"reserved on jobs the host ended over {duration(after_s)} ago: the host's "
                     "commit or refund never came (docs/reconciler.md, \"Jobs ended outside "
                     "callwarden\"; callwarden stats)")]


def _print(found: list[Finding]) -> int:
    """Each finding on its own line (problems on stderr); the number of problems."""
    out, err = Console(), Console(stderr=True)
    style = {"ok": "green", "note": "yellow", "problem": "red"}
    for level, text in found:
        (err if level == "problem" else out).print(
            Text.assemble((f"{level:<7}", style[level]), f" {text}"), soft_wrap=True)
    return sum(1 for level, _ in found if level == "problem")


def _host_left_after(args: argparse.Namespace) -> float:
    try:
        return load_config(args.config, os.environ).host_left_after_s
    except (CallwardenError, ValueError):  # already reported with the settings
        return ReconcileConfig().host_left_after_s


def _configured(args: argparse.Namespace) -> dict[str, AccountLimit] | None:
    try:
        return configured_limits(args.config)
    except (CallwardenError, ValueError):  # already reported with the settings
        return None


def _emit_json(found: list[Finding]) -> int:
    problems = sum(1 for level, _ in found if level == "problem")
    sys.stdout.buffer.write(msgspec.json.encode({
        "findings": [{"level": level, "text": text} for level, text in found],
        "problems": problems}) + b"\n")
    sys.stdout.buffer.flush()
    return problems


async def handler(args: argparse.Namespace, url: str) -> int:
    settings = _settings(args)
    problems = 0 if args.json else _print(settings)  # every problem in one run: the database too
    try:
        found = await _database(url, _host_left_after(args), _configured(args))
    except DatabaseUnavailable as exc:
        found = [("problem", f"the database was not checked: {exc}")]
    if args.json:
        return 2 if _emit_json(settings + found) else 0
    problems += _print(found)
    Console().print(f"{problems} problem(s)" if problems else "nothing missing")
    return 2 if problems else 0
