"""``callwarden jobs``: find calls from the terminal, newest call start first, filtered by
call state, kind, user, age, who ended the call and text in its error; ``--json`` for
scripts (one array, every id whole).

It lists with the dashboard's query (``dashboard_list_calls``, the ``/jobs`` page), so a
filter means the same in both: a job is listed once its call has started, its age is the
time since then, and "ended by" is the role of the actor of its terminal event. The table
shows each id's first 8 hex digits, which ``callwarden audit`` takes.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
from psycopg.rows import DictRow
from rich.console import Console
from rich.table import Table

from callwarden.cli.args import positive_int, window
from callwarden.database.clock import DatabaseClock
from callwarden.database.db import connect
from callwarden.database.write import execute
from callwarden.rules.human import duration
from callwarden.service.dashboard.calls import ACTORS, STATES, Filters, sql_params
from callwarden.service.dashboard.overview import OPEN_STATES

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["GROUPS", "JobRow", "register", "states"]

GROUPS = {"open": OPEN_STATES, "terminal": tuple(s for s in STATES if s not in OPEN_STATES)}


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


def states(text: str) -> list[str]:
    """``--state``: call states, comma-separated; ``open`` and ``terminal`` name groups."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part in GROUPS:
            out += GROUPS[part]
        elif part in STATES:
            out.append(part)
        else:
            raise argparse.ArgumentTypeError(
                f"unknown call state {part!r} (want {', '.join([*STATES, *GROUPS])})")
    return out


def _row(r: DictRow, now: datetime) -> JobRow:
    return JobRow(id=str(r["id"]), user_id=r["user_id"], kind=r["provider_kind"],
                  call_state=r["call_state"], status=r["status"], created_at=r["created_at"],
                  updated_at=r["updated_at"], started_at=r["started_at"],
                  ended_at=r["finished_at"], age_s=(now - r["started_at"]).total_seconds(),
                  provider_task_id=r["provider_task_id"], settlement=r["call_settlement"],
                  ended_by=r["ended_by"], error=r["error"])


def _params(args: argparse.Namespace, now: datetime) -> dict[str, Any]:
    chosen = list(dict.fromkeys(s for group in args.state or [] for s in group))
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
    async with await connect(url) as conn:
        clock = DatabaseClock()  # ages by the database's clock, as the dashboard's
        await clock.sync(conn)
        now = clock()
        found = await execute(conn, "dashboard_list_calls", _params(args, now))
    rows = [_row(r, now) for r in found[:args.limit]]
    if args.json:
        sys.stdout.buffer.write(msgspec.json.encode(rows) + b"\n")
        sys.stdout.buffer.flush()
    else:
        _show(rows, len(found) > args.limit, args.limit)
    return 0


def register(sub: Subparsers) -> None:
    """Add ``jobs`` to the ``callwarden`` parser."""
    p = sub.add_parser(
        "jobs", help="list calls, newest first, by state, kind, user, age...",
        description="Calls, newest call start first, as the dashboard's /jobs page lists "
                    "them: a job is listed once its call has started; its age is the time "
                    "since then. The table shows each id's first 8 hex digits, which "
                    "callwarden audit takes; --json prints them whole.")
    p.add_argument("--state", type=states, action="append", metavar="STATE[,STATE]",
                   help="call states (repeatable; open and terminal name groups)")
    p.add_argument("--kind", help="the provider kind (e.g. kie-standard)")
    p.add_argument("--user", help="the job's user_id")
    p.add_argument("--older-than", type=window, metavar="AGE",
                   help="calls started longer ago than AGE (e.g. 10m, 2h, 1d)")
    p.add_argument("--newer-than", type=window, metavar="AGE",
                   help="calls started within AGE (e.g. 10m, 2h, 1d)")
    p.add_argument("--ended-by", choices=ACTORS, help="who ended the call")
    p.add_argument("--error", help="text in the job's or the reconciler's last error "
                                   "(any case)")
    p.add_argument("--limit", type=positive_int, default=50, help="at most this many")
    p.add_argument("--json", action="store_true",
                   help="one JSON array of objects, ids whole")
    p.set_defaults(handler=_jobs)
