"""A first look at a callwarden database: migrations, jobs by status and call state."""

from __future__ import annotations

import msgspec
from rich.console import Console
from rich.table import Table

from callwarden.database.db import Conn
from callwarden.database.migrate import applied_versions, available
from callwarden.database.write import execute

__all__ = ["JobCount", "StatusReport", "print_status", "status_report"]


class JobCount(msgspec.Struct, frozen=True):
    status: str
    call_state: str | None  # None: no call started
    jobs: int


class StatusReport(msgspec.Struct, frozen=True):
    """``callwarden status --json``. ``jobs`` and ``call_events`` are ``None`` until every
    migration is applied (``pending`` names those that are not)."""

    migrations_applied: int
    migrations_available: int
    pending: list[str]
    jobs: list[JobCount] | None
    call_events: int | None


async def status_report(conn: Conn) -> StatusReport:
    done = await applied_versions(conn)
    shipped = available()
    pending = [f"{m.version:04d}_{m.name}" for m in shipped if m.version not in done]
    if pending:
        return StatusReport(migrations_applied=len(shipped) - len(pending),
                            migrations_available=len(shipped), pending=pending, jobs=None,
                            call_events=None)
    rows = await execute(conn, "status_jobs_by_state", {})
    events = await execute(conn, "status_event_count", {})
    return StatusReport(
        migrations_applied=len(shipped), migrations_available=len(shipped), pending=[],
        jobs=[JobCount(status=r["status"], jobs=int(r["n"]),
                       call_state=None if r["call_state"] == "-" else r["call_state"])
              for r in rows],
        call_events=int(events[0]["n"]))


async def print_status(conn: Conn, console: Console) -> None:
    report = await status_report(conn)
    console.print(f"migrations: {report.migrations_applied} of "
                  f"{report.migrations_available} applied")
    if report.jobs is None:
        console.print("run [bold]callwarden migrate[/bold] to apply the rest")
        return
    table = Table(title="jobs by status and call state")
    for col in ("status", "call_state", "jobs"):
        table.add_column(col)
    for j in report.jobs:
        table.add_row(j.status, j.call_state or "-", str(j.jobs))
    console.print(table)
    console.print(f"call events logged: {report.call_events}")
