"""``callwarden jobs``: find calls from the terminal, newest call start first, filtered by
call state, kind, user, age, who ended the call and text in its error; ``--json`` for
scripts (one array, every id whole).

It lists with the dashboard's query (``dashboard_list_calls``, the ``/jobs`` page), so a
filter means the same in both: a job is listed once its call has started, its age is the
time since then, and "ended by" is the role of the actor of its terminal event. The table
shows each id's first 8 hex digits, which ``callwarden audit`` takes.

``--state waiting`` lists instead the jobs waiting for a provider account's slot (a start
its limits refused: the job has no call yet; docs/admission.md), longest waiting first,
with the dashboard's ``/waiting`` query (``dashboard_waiting``): the account, the reason,
how long the job has waited, when it is tried again and how many starts were refused.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from psycopg.rows import DictRow
from rich.console import Console
from rich.table import Table

from callwarden.cli.args import positive_int, window
from callwarden.database.clock import DatabaseClock
from callwarden.database.db import connect
from callwarden.database.write import execute
from callwarden.errors import ConfigError
from callwarden.rules.human import duration
from callwarden.service.dashboard.calls import ACTORS, STATES, Filters, sql_params
from callwarden.service.dashboard.overview import OPEN_STATES

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["GROUPS", "WAITING", "JobRow", "WaitingRow", "register", "states"]

GROUPS = {"open": OPEN_STATES, "terminal": tuple(s for s in STATES if s not in OPEN_STATES)}
#: ``--state waiting``: not a call state (the job has no call yet), listed on its own
WAITING = "waiting"


class JobRow(msgspec.Struct, frozen=True, kw_only=True):
    """One call as ``--json`` prints it (these keys, in this order)."""

    id: str
    user_id: str
    kind: str | None
    call_state: str | None
    status: str
    created_at: datetime
    updated_at: datetime
    started_at: datetime
    ended_at: datetime | None
    age_s: float  # since the call started
    provider_task_id: str | None
    settlement: str | None
    ended_by: str | None
    error: str | None


class WaitingRow(msgspec.Struct, frozen=True, kw_only=True):
    """One job waiting for a slot as ``--state waiting --json`` prints it (these keys, in
    this order)."""

    id: str
    user_id: str
    account: str
    reason: str
    status: str | None
    created_at: datetime
    since: datetime      # the first refusal of its start
    age_s: float         # waiting for, since then
    retry_at: datetime
    retry_in_s: float    # until retry_at; 0 once due
    refusals: int


#: a listed row (``JobRow``, ``WaitingRow``)
R = TypeVar("R", bound=msgspec.Struct)


def states(text: str) -> list[str]:
    """``--state``: call states, comma-separated; ``open`` and ``terminal`` name groups,
    ``waiting`` the jobs waiting for a slot (no call yet: listed on their own)."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part in GROUPS:
            out += GROUPS[part]
        elif part in STATES or part == WAITING:
            out.append(part)
        else:
            raise argparse.ArgumentTypeError(
                f"unknown call state {part!r} (want {', '.join([*STATES, *GROUPS, WAITING])})")
    return out


def _row(r: DictRow, now: datetime) -> JobRow:
    return JobRow(id=str(r["id"]), user_id=r["user_id"], kind=r["provider_kind"],
                  call_state=r["call_state"], status=r["status"], created_at=r["created_at"],
                  updated_at=r["updated_at"], started_at=r["started_at"],
                  ended_at=r["finished_at"], age_s=(now - r["started_at"]).total_seconds(),
                  provider_task_id=r["provider_task_id"], settlement=r["call_settlement"],
                  ended_by=r["ended_by"], error=r["error"])


def _chosen(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys(s for group in args.state or [] for s in group))


def _waiting_row(r: DictRow, now: datetime) -> WaitingRow:
    return WaitingRow(id=str(r["id"]), user_id=r["user_id"], account=r["account"],
                      reason=r["reason"], status=r["status"], created_at=r["created_at"],
                      since=r["since"], age_s=(now - r["since"]).total_seconds(),
                      retry_at=r["retry_at"],
                      retry_in_s=max(0.0, (r["retry_at"] - now).total_seconds()),
                      refusals=r["refusals"])


def _refuse_for_waiting(args: argparse.Namespace) -> None:
    """A filter a waiting job cannot match (another state, who ended its call, its error:
    it has no call) is refused, naming it."""
    others = [s for s in _chosen(args) if s != WAITING]
    if others:
        raise ConfigError(f"--state waiting lists jobs that have no call yet: give it alone "
                          f"(not with {', '.join(others)})")
    for flag, value in (("--ended-by", args.ended_by), ("--error", args.error)):
        if value is not None:
            raise ConfigError(f"{flag} does not apply to --state waiting (a waiting job has "
                              "no call yet)")


def _waiting_params(args: argparse.Namespace, now: datetime) -> dict[str, Any]:
    """``dashboard_waiting``'s parameters; the ages bound the time the job began to wait."""
    return {"user_id": args.user, "kind": args.kind,
            "from": None if args.newer_than is None else now - args.newer_than,
            "to": None if args.older_than is None else now - args.older_than,
            "limit": args.limit + 1}


def _params(args: argparse.Namespace, now: datetime) -> dict[str, Any]:
    chosen = _chosen(args)
    f = Filters(kind=args.kind, actor=args.ended_by, error=args.error,
                start=None if args.newer_than is None else now - args.newer_than,
                end=None if args.older_than is None else now - args.older_than)
    return {**sql_params(f, args.limit), "states": chosen or None, "user_id": args.user}


def _console() -> Console:
    """Made per use. Piped, as wide as ``COLUMNS`` says, else 80 (not the width of a
    terminal stderr may still be on)."""
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").isdigit()
    return Console(width=80 if piped else None)


def _cells(r: JobRow) -> list[str]:
    return [r.id[:8], r.kind or "-", r.call_state or "-", r.ended_by or "",
            duration(round(r.age_s)), r.provider_task_id or "", r.error or ""]


def _table(rows: list[JobRow], width: int) -> Table:
    """One line per call in ``width`` columns: the id, state, ended by and age whole; the
    kind cut to 14 characters, and the task and the error sharing what is left (a third
    for the task), where the whole of each does not fit (cut with …)."""
    heads = ["job", "kind", "state", "ended by", "age", "task", "error"]
    cells = [_cells(r) for r in rows]
    need = [max(len(x) for x in column) for column in zip(heads, *cells, strict=True)]
    left = width - sum(need[:5]) - 2 * (len(heads) - 1)
    if left < need[5] + need[6]:
        left, need[1] = left + need[1] - min(need[1], 14), min(need[1], 14)
    left = max(left, 2)
    need[5] = min(need[5], max(left // 3, left - need[6]), left - 1)
    need[6] = max(min(need[6], left - need[5]), 1)
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False,
                  header_style="bold")
    for head, size in zip(heads, need, strict=True):
        table.add_column(head, width=size, no_wrap=True, overflow="ellipsis",
                         justify="right" if head == "age" else "left")
    for row in cells:
        table.add_row(*row)
    return table


def _waiting_cells(r: WaitingRow) -> list[str]:
    """The table's cells; the reason without the account's name before it (its own
    column shows it: admission's reasons start with it)."""
    retry = "due" if r.retry_in_s <= 0 else duration(max(1, round(r.retry_in_s)))
    reason = r.reason.removeprefix(f"{r.account}: ")
    return [r.id[:8], r.user_id, r.account, duration(round(r.age_s)), retry,
            str(r.refusals), reason]


def _waiting_table(rows: list[WaitingRow], width: int) -> Table:
    """One line per waiting job in ``width`` columns: the id, the waits and the refusals
    whole; the user and the account cut to 16 characters, and the reason taking what is
    left (cut with …) where the whole of each does not fit."""
    heads = ["job", "user", "account", "waiting", "retry", "refused", "reason"]
    cells = [_waiting_cells(r) for r in rows]
    need = [max(len(x) for x in column) for column in zip(heads, *cells, strict=True)]
    gaps = 2 * (len(heads) - 1)
    if sum(need) + gaps > width:
        need[1], need[2] = min(need[1], 16), min(need[2], 16)
    need[6] = max(min(need[6], width - sum(need[:6]) - gaps), 6)
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False,
                  header_style="bold")
    for head, size in zip(heads, need, strict=True):
        table.add_column(head, width=size, no_wrap=True, overflow="ellipsis",
                         justify="right" if head in ("waiting", "retry", "refused")
                         else "left")
    for row in cells:
        table.add_row(*row)
    return table


def _show_waiting(rows: list[WaitingRow], more: bool, limit: int) -> None:
    out = _console()
    if not rows:
        out.print("no job waits for a slot", markup=False)
        return
    out.print(_waiting_table(rows, out.width), markup=False)
    tail = (f"the {limit} waiting longest shown; more wait (narrow the filters or raise "
            f"--limit)" if more else f"{len(rows)} job(s) waiting")
    out.print(f"{tail}; callwarden limits for the accounts", soft_wrap=True, markup=False)


def _print_json(rows: list[R]) -> None:
    sys.stdout.buffer.write(msgspec.json.encode(rows) + b"\n")
    sys.stdout.buffer.flush()


def _show(rows: list[JobRow], more: bool, limit: int) -> None:
    out = _console()
    if not rows:
        out.print("no call matches")
        return
    out.print(_table(rows, out.width), markup=False)
    tail = (f"the newest {limit} shown; more match (narrow the filters or raise --limit)"
            if more else f"{len(rows)} call(s)")
    out.print(f"{tail}; callwarden audit JOB for one", soft_wrap=True, markup=False)


async def _jobs(args: argparse.Namespace, url: str) -> int:
    if WAITING in _chosen(args):
        _refuse_for_waiting(args)  # before we connect
        return await _listed(args, url, "dashboard_waiting", _waiting_params, _waiting_row,
                             _show_waiting)
    return await _listed(args, url, "dashboard_list_calls", _params, _row, _show)


async def _listed(args: argparse.Namespace, url: str, query: str,
                  params: Callable[[argparse.Namespace, datetime], dict[str, Any]],
                  row: Callable[[DictRow, datetime], R],
                  show: Callable[[list[R], bool, int], None]) -> int:
    """``query``'s rows, at most ``--limit``, as JSON or a table; their ages by the
    database's clock, as the dashboard's."""
    async with await connect(url) as conn:
        clock = DatabaseClock()
        await clock.sync(conn)
        now = clock()
        found = await execute(conn, query, params(args, now))
    rows = [row(r, now) for r in found[:args.limit]]
    if args.json:
        _print_json(rows)
    else:
        show(rows, len(found) > args.limit, args.limit)
    return 0


def register(sub: Subparsers) -> None:
    """Add ``jobs`` to the ``callwarden`` parser."""
    p = sub.add_parser(
        "jobs", help="list calls, newest first, by state, kind, user, age...",
        description="Calls, newest call start first, as the dashboard's /jobs page lists "
                    "them: a job is listed once its call has started; its age is the time "
                    "since then. --state waiting lists instead the jobs waiting for a "
                    "provider account's slot (no call yet), as the /waiting page does. The "
                    "table shows each id's first 8 hex digits, which callwarden audit "
                    "takes; --json prints them whole.")
    p.add_argument("--state", type=states, action="append", metavar="STATE[,STATE]",
                   help="call states (repeatable; open and terminal name groups); waiting: "
                        "the jobs waiting for a slot (alone)")
    p.add_argument("--kind", help="the provider kind (e.g. kie-standard)")
    p.add_argument("--user", help="the job's user_id")
    p.add_argument("--older-than", type=window, metavar="AGE",
                   help="calls started (waiting jobs: refused first) longer ago than AGE "
                        "(e.g. 10m, 2h, 1d)")
    p.add_argument("--newer-than", type=window, metavar="AGE",
                   help="calls started (waiting jobs: refused first) within AGE (e.g. 10m, "
                        "2h, 1d)")
    p.add_argument("--ended-by", choices=ACTORS, help="who ended the call")
    p.add_argument("--error", help="text in the job's or the reconciler's last error "
                                   "(any case)")
    p.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    p.add_argument("--json", action="store_true",
                   help="one JSON array of objects, ids whole")
    p.set_defaults(handler=_jobs)
