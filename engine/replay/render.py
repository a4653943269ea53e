"""Rich rendering of the audit, verify, rebuild and stats reports (text output only;
``--json`` encodes the same values with msgspec).

``audit`` is a table on a terminal of :data:`WIDE` columns or more; narrower, or piped,
it is two lines per event (:func:`audit_lines`): the columns of a table would shrink the
task and the detail — who settled the credits — to nothing."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from callwarden.projections.stats import StatsReport
from callwarden.projections.timeline import TimelineRow
from callwarden.projections.verify import Mismatch
from callwarden.replay.audit import AuditReport
from callwarden.replay.history import JobError
from callwarden.replay.rebuild import RebuildReport
from callwarden.replay.verify import VerifySummary
from callwarden.rules.human import duration

__all__ = ["WIDE", "audit_lines", "audit_table", "rebuild_table", "show_audit", "show_error",
           "show_mismatch", "stats_tables", "verify_table"]

WIDE = 100  # the narrowest terminal the audit table is drawn on


def _t(at: datetime | None) -> str:
    return "-" if at is None else at.isoformat(sep=" ", timespec="milliseconds")


def _delta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return duration(seconds) if seconds < 0 else f"+{duration(seconds)}"


def _settlement(r: TimelineRow) -> str:
    if r.settlement is None:
        return ""
    cost = (f", priced {r.settled_cost:g} (at most the reservation)"
            if r.settled_cost is not None else "")
    return f"[bold]{r.settlement}{cost}[/bold] by {escape(r.settled_by or '?')}"


def _clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S")


def _changed(value: object, previous: object) -> str:
    return "" if value == previous or value is None else escape(str(value))


def _cells(r: TimelineRow, prev: TimelineRow | None) -> list[str]:
    return [str(r.seq), _clock(r.at), _delta(r.since_previous_s), escape(r.actor), r.type,
            r.state_after if r.state_after != r.state_before else f"({r.state_after})",
            _changed(r.task_id, prev and prev.task_id),
            _changed(r.attempts or None, prev and (prev.attempts or None)),
            _detail(r)]


def _detail(r: TimelineRow) -> str:
    error = f"[red]{escape(r.error)}[/red]" if r.error else ""
    return " · ".join(x for x in (_settlement(r), error, escape(r.detail or "")) if x)


def _title(report: AuditReport) -> str:
    day = report.timeline[0].at.astimezone(UTC).date().isoformat() if report.timeline else ""
    return (f"job {report.job_id} · {report.provider_kind or '-'} · status {report.status}"
            f" · call {report.call_state or '-'} (v{report.call_version}) · {day} UTC")


def audit_table(report: AuditReport) -> Table:
    """One row per event: the state it led to (in parentheses when unchanged), the task
    id and attempts where they change, then errors, details and the settlement."""
    table = Table(title=_title(report))
    for col in ("seq", "at", "Δ", "actor", "event", "→ state"):
        table.add_column(col, no_wrap=True)
    table.add_column("task")
    table.add_column("tries", justify="right")
    table.add_column("detail", ratio=1)
    prev = None
    for r in report.timeline:
        table.add_row(*_cells(r, prev))
        prev = r
    return table


def _notes(r: TimelineRow, prev: TimelineRow | None) -> str:
    task = _changed(r.task_id, prev and prev.task_id)
    tries = _changed(r.attempts or None, prev and (prev.attempts or None))
    return " · ".join(x for x in (task and f"task {task}", tries and f"tries {tries}",
                                  _detail(r)) if x)


def audit_lines(report: AuditReport) -> Iterable[tuple[str, str]]:
    """Per event (markup): ``seq at Δ actor event → state``, then the task and tries where
    they change, the settlement, the error and the details ("" when there are none)."""
    wide = max((len(_delta(r.since_previous_s)) for r in report.timeline), default=0)
    prev = None
    for r in report.timeline:
        seq, at, delta, actor, event, state = _cells(r, prev)[:6]
        yield f"{seq:>3} {at} {delta:>{wide}}  {actor}  {event} → {state}", _notes(r, prev)
        prev = r


def show_audit(console: Console, report: AuditReport) -> None:
    """The timeline as a table on a wide terminal, else as :func:`audit_lines`: wrapped
    under each event on a terminal, one line each (never cut) when piped."""
    piped = not console.is_terminal
    if not piped and console.width >= WIDE:
        console.print(audit_table(report))
    else:
        console.print(_title(report), soft_wrap=piped, highlight=False)
        for head, notes in audit_lines(report):
            console.print(head, soft_wrap=piped, highlight=False)
            if notes and piped:  # (Padding would cut the line at the console's width)
                console.print(f"      {notes}", soft_wrap=True, highlight=False)
            elif notes:
                console.print(Padding(Text.from_markup(notes), (0, 0, 0, 6)))
    for line in reservation_lines(report):
        console.print(line, soft_wrap=piped)


def reservation_lines(report: AuditReport) -> Iterable[str]:
    if not report.reservations:
        yield "reservation: none"
    for r in report.reservations:
        charged = "" if r.credits_charged is None else f", charged {r.credits_charged:g}"
        yield (f"reservation: {r.status} ({r.credits_reserved:g} reserved{charged}; "
               f"settled {_t(r.settled_at)})")


def _show(value: Any) -> str:
    return escape(repr(value) if not isinstance(value, str) else value)


def show_mismatch(console: Console, m: Mismatch) -> None:
    console.print(f"[red]mismatch[/red] job {m.job_id} [bold]{m.column}[/bold]: "
                  f"projected {_show(m.projected)} ≠ folded {_show(m.folded)}")


def show_error(console: Console, e: JobError) -> None:
    where = f" seq {e.seq}" if e.seq is not None else ""
    console.print(f"[red]cannot replay[/red] job {e.job_id}{where}: {escape(e.reason)}")


def verify_table(s: VerifySummary) -> Table:
    table = Table(title="verify " + ("[green]ok[/green]" if s.ok else "[red]FAILED[/red]"))
    for col in ("jobs", "events", "mismatches", "jobs mismatched", "replay errors",
                "took", "events/s"):
        table.add_column(col, justify="right")
    rate = s.events / s.seconds if s.seconds else 0.0
    table.add_row(f"{s.jobs:,}", f"{s.events:,}", str(s.mismatches), str(s.mismatched_jobs),
                  str(s.errors), duration(s.seconds), f"{rate:,.0f}")
    return table


def rebuild_table(r: RebuildReport) -> Table:
    table = Table(title="rebuild")
    for col in ("jobs", "rebuilt", "unchanged", "retried", "failed"):
        table.add_column(col, justify="right")
    table.add_row(*(f"{n:,}" for n in (r.jobs, r.rebuilt, r.unchanged, r.retried, r.failed)))
    return table


def _table(title: str, columns: list[str], rows: Iterable[list[str]]) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    return table


def _secs(value: float | None) -> str:
    return "-" if value is None else duration(value)


def stats_tables(s: StatsReport) -> list[Table]:
    window = f"last {duration(s.window_s)}"
    return [
        _table("calls by kind and state", ["kind", "state", "calls"],
               ([k.kind, k.state, str(k.calls)] for k in s.by_kind_state)),
        _table("stale open calls", ["kind", "threshold", "stale"],
               ([k.kind, _secs(k.threshold_s),
                 str(k.stale)] for k in s.stale)),
        _table(f"recoveries by reconcilers ({window})", ["terminal event", "count"],
               ([t, str(n)] for t, n in s.recoveries.items())),
        _table(f"sweeps ({window})", ["kind", "swept"],
               ([k, str(n)] for k, n in s.sweeps.items())),
        _table(f"time to terminal ({window})", ["kind", "calls", "p50", "p95", "p99"],
               ([x.kind, str(x.calls), _secs(x.p50_s), _secs(x.p95_s), _secs(x.p99_s)]
                for x in s.time_to_terminal)),
        _table("jobs waiting without a call, credits reserved (the host's; never swept)",
               ["jobs"], [[str(s.jobs_without_call)]]),
        _table(f"reservations the host left on jobs it ended (over "
               f"{duration(s.host_left.after_s)} ago)", ["reservations", "credits"],
               [[str(s.host_left.reservations), f"{s.host_left.credits:g}"]]),
    ]
