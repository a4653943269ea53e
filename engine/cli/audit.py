"""``callwarden audit | verify | rebuild | stats``: replaying the log for people.

Exit codes: 0 all good; 1 something to look at (unknown job, mismatches, replay errors,
jobs rebuild could not repair); 2 a job's own log cannot be replayed or a prefix of its id
names several jobs (``audit``), or the database failed (handled by :mod:`callwarden.cli`).

``audit`` takes a job's whole id or its first hex digits (at least four), as
``callwarden jobs`` shows them (:mod:`callwarden.replay.lookup`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

from callwarden.cli.args import positive_int, window
from callwarden.database.clock import DatabaseClock, utcnow
from callwarden.database.db import Conn, connect
from callwarden.errors import JobNotFound
from callwarden.events.codec import EventDecodeError
from callwarden.projections.stats import parse_window
from callwarden.reconciler.config import load_config
from callwarden.replay import render
from callwarden.replay.audit import audit_job, stats
from callwarden.replay.lookup import digits, jobs_with_prefix
from callwarden.replay.rebuild import rebuild
from callwarden.replay.verify import BatchResult, VerifySummary, count_jobs, verify_batches

__all__ = ["parse_since", "register"]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

def _out() -> Console:
    """A console made per use, so COLUMNS and the terminal are read when it prints."""
    return Console()


def _err() -> Console:
    return Console(stderr=True)


def _emit_json(value: Any) -> None:
    sys.stdout.buffer.write(msgspec.json.encode(value) + b"\n")
    sys.stdout.buffer.flush()


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: a window back from now (``24h``) or an ISO time (UTC if naive)."""
    try:
        return (now or utcnow()) - parse_window(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid --since {text!r}: use a window (24h, 90m) or an ISO time") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _job_ref(text: str) -> str:
    try:
        return digits(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def _job_id(conn: Conn, ref: str) -> uuid.UUID | int:
    """The job ``ref`` (hex digits) names, or the exit code after saying why there is
    none: 1 no job has that id or prefix, 2 several have that prefix (listed)."""
    if len(ref) == 32:
        return uuid.UUID(ref)
    found = await jobs_with_prefix(conn, ref, limit=6)
    if not found:
        _err().print(f"no job {ref} (no job id starts with it)", soft_wrap=True)
        return 1
    if len(found) == 1:
        return found[0].id
    more = " (and more)" if len(found) > 5 else ""
    _err().print(f"[red]error:[/red] {ref} is the start of {len(found[:5])}{more} job ids; "
                 "give more digits:", soft_wrap=True)
    for c in found[:5]:
        _err().print(f"  {c.id}  {c.kind or '-'}  status {c.status}  "
                     f"call {c.call_state or '-'}", soft_wrap=True, markup=False)
    return 2


async def _audit(args: argparse.Namespace, url: str) -> int:
    async with await connect(url) as conn:
        job_id = await _job_id(conn, args.job_id)
        if isinstance(job_id, int):
            return job_id
        try:
            report = await audit_job(conn, job_id)
        except JobNotFound:
            _err().print(f"no job {job_id}")
            return 1
        except EventDecodeError as exc:
            _err().print(f"[red]cannot replay:[/red] {exc}")
            return 2
    if args.json:
        _emit_json(report)
    elif not report.timeline:
        _out().print(f"job {report.job_id} has no call events (status {report.status})")
    else:
        render.show_audit(_out(), report)
    return 0


def _progress(args: argparse.Namespace) -> Progress | None:
    if args.json or not sys.stdout.isatty():
        return None
    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeRemainingColumn(), console=_out())


def _report_batch(as_json: bool, console: Console, batch: BatchResult) -> None:
    for m in batch.mismatches:
        if as_json:
            _emit_json({"mismatch": m})
        else:
            render.show_mismatch(console, m)
    for e in batch.errors:
        if as_json:
            _emit_json({"error": e})
        else:
            render.show_error(console, e)


async def _stream_verify(conn: Conn, args: argparse.Namespace,
                         progress: Progress | None) -> VerifySummary:
    summary = VerifySummary()
    task = None
    if progress is not None:
        task = progress.add_task("verifying", total=await count_jobs(conn, args.since))
    console = progress.console if progress is not None else _out()
    async for batch in verify_batches(conn, batch=args.batch, since=args.since):
        summary.add(batch)
        _report_batch(args.json, console, batch)
        if progress is not None and task is not None:
            progress.advance(task, batch.jobs)
    return summary


async def _verify(args: argparse.Namespace, url: str) -> int:
    progress = _progress(args)
    started = time.perf_counter()
    async with await connect(url) as conn:
        if progress is None:
            summary = await _stream_verify(conn, args, None)
        else:
            with progress:
                summary = await _stream_verify(conn, args, progress)
    summary.seconds = time.perf_counter() - started
    if args.json:
        _emit_json({"summary": summary, "ok": summary.ok})
    else:
        _out().print(render.verify_table(summary))
    return 0 if summary.ok else 1


async def _rebuild(args: argparse.Namespace, url: str) -> int:
    async with await connect(url) as conn:
        try:
            report = await rebuild(conn, job_id=args.job, batch=args.batch, force=args.force)
        except JobNotFound:
            _err().print(f"no job {args.job}")
            return 1
    if args.json:
        _emit_json(report)
    else:
        _out().print(render.rebuild_table(report))
        for f in report.failures:
            render.show_error(_out(), f)
    return 0 if report.failed == 0 else 1


async def _stats(args: argparse.Namespace, url: str) -> int:
    config = load_config(args.config, os.environ)
    async with await connect(url) as conn:
        clock = DatabaseClock()  # the reconciler's clock: the same "now" for staleness
        await clock.sync(conn)
        report = await stats(conn, now=clock(), window=args.window,
                             stale=config.stale,
                             legacy_cutoff=config.legacy_cutoff,
                             host_left_after_s=config.host_left_after_s)
    if args.json:
        _emit_json(report)
    else:
        for table in render.stats_tables(report):
            _out().print(table)
    return 0


def _add_audit(sub: Subparsers) -> None:
    p = sub.add_parser("audit", help="a job's timeline: events, states, settlement")
    p.add_argument("job_id", type=_job_ref,
                   help="the job's id, or its first hex digits (4 or more: what "
                        "callwarden jobs shows) if no other job's id starts with them")
    p.add_argument("--json", action="store_true", help="the timeline as JSON")
    p.set_defaults(handler=_audit)


def _add_verify(sub: Subparsers) -> None:
    p = sub.add_parser("verify", help="fold every job's log and compare with its columns")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--since", type=parse_since, default=None,
                   help="only jobs with events recorded since (24h, or an ISO time)")
    p.add_argument("--batch", type=positive_int, default=1000, help="jobs per snapshot")
    p.set_defaults(handler=_verify)


def _add_rebuild(sub: Subparsers) -> None:
    p = sub.add_parser("rebuild", help="rewrite projection columns from the log (fenced)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--job", type=uuid.UUID, help="one job")
    which.add_argument("--all", action="store_true", help="every job with a call")
    p.add_argument("--batch", type=positive_int, default=500, help="jobs per snapshot")
    p.add_argument("--force", action="store_true",
                   help="rewrite every job, even one whose columns already match")
    p.add_argument("--json", action="store_true", help="the counts as JSON")
    p.set_defaults(handler=_rebuild)


def _add_stats(sub: Subparsers) -> None:
    p = sub.add_parser("stats", help="calls by kind and state, stale calls, recoveries")
    p.add_argument("--json", action="store_true", help="the statistics as JSON")
    p.add_argument("--window", type=window, default="24h",
                   help="how far back recoveries, sweeps and latencies look (e.g. 90m, 7d)")
    p.add_argument("--config", type=Path, default=None,
                   help="the reconciler's settings file (thresholds, legacy cutoff)")
    p.set_defaults(handler=_stats)


def register(sub: Subparsers) -> None:
    """Add ``audit``, ``verify``, ``rebuild`` and ``stats`` to the ``callwarden`` parser."""
    for add in (_add_audit, _add_verify, _add_rebuild, _add_stats):
        add(sub)
