"""``callwarden``: the command-line face over the engine and projections.

Subcommands: ``migrate`` (apply the schema), ``status`` (a first look at the database),
``simulator`` (run the provider simulator). Each is a thin shell over library calls.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine.db import connect, resolve_database_url
from engine.errors import CallwardenError
from engine.migrate import applied_versions, available, migrate
from engine.store import Conn

__all__ = ["main"]

console = Console()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="callwarden", description=__doc__)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="embedded Postgres data folder (ignored when DATABASE_URL is set)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply pending migrations")
    sub.add_parser("status", help="migrations applied and jobs by status and call state")
    sim = sub.add_parser("simulator", help="run the provider simulator on 127.0.0.1")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8080)
    return p


async def _status(conn: Conn) -> None:
    done = await applied_versions(conn)
    shipped = available()
    console.print(f"migrations: {len(done)} of {len(shipped)} applied")
    if len(done) < len(shipped):
        console.print("run [bold]callwarden migrate[/bold] to apply the rest")
        return
    rows = await (await conn.execute(
        "SELECT status, coalesce(call_state, '-') AS call_state, count(*) AS n "
        "FROM jobs GROUP BY 1, 2 ORDER BY 1, 2")).fetchall()
    table = Table(title="jobs by status and call state")
    for col in ("status", "call_state", "jobs"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["status"], r["call_state"], str(r["n"]))
    console.print(table)
    events = await (await conn.execute("SELECT count(*) AS n FROM call_events")).fetchone()
    console.print(f"call events logged: {events['n'] if events else 0}")


async def _run_db(args: argparse.Namespace) -> int:
    url = resolve_database_url(args.data_dir)
    conn = await connect(url)
    async with conn:
        if args.command == "migrate":
            applied = await migrate(conn)
            names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "none"
            console.print(f"applied migrations: {names}")
            await _status(conn)
        else:
            await _status(conn)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "simulator":
        from providers.simulator import main as sim_main

        return sim_main(["--host", args.host, "--port", str(args.port)])
    try:
        return asyncio.run(_run_db(args))
    except CallwardenError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
