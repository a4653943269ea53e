"""A first look at a callwarden database: migrations, jobs by status and call state."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from callwarden.database.db import Conn
from callwarden.database.migrate import applied_versions, available
from callwarden.database.write import execute

__all__ = ["print_status"]


async def print_status(conn: Conn, console: Console) -> None:
    done = await applied_versions(conn)
    shipped = available()
    console.print(f"migrations: {len(done)} of {len(shipped)} applied")
    if len(done) < len(shipped):
        console.print("run [bold]callwarden migrate[/bold] to apply the rest")
        return
    rows = await execute(conn, "status_jobs_by_state", {})
    table = Table(title="jobs by status and call state")
    for col in ("status", "call_state", "jobs"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["status"], r["call_state"], str(r["n"]))
    console.print(table)
    events = await execute(conn, "status_event_count", {})
    console.print(f"call events logged: {events[0]['n']}")
