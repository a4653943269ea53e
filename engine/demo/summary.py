"""The demo's verdict: every invariant checked with SQL over the database and the
simulator's journal (creates per job), never from the demo's own counters."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import msgspec

from callwarden.database.citus import on_citus
from callwarden.database.db import Conn
from callwarden.database.write import execute, execute_script
from callwarden.events.states import TERMINAL
from callwarden.projections.columns import as_float
from callwarden.replay.verify import verify

__all__ = ["Credits", "DemoSummary", "install_audit", "summarize"]

_TERMINAL = {s.value for s in TERMINAL}


class Credits(msgspec.Struct, kw_only=True):
    reserved: float = 0.0
    committed: float = 0.0
    released: float = 0.0  # reserved minus charged on committed calls (priced below reserve)
    partial_commits: int = 0  # committed calls charged less than their reservation
    refunded: float = 0.0
    leaked: float = 0.0    # still reserved although the call is terminal


class DemoSummary(msgspec.Struct, kw_only=True):
    jobs: int
    terminal: dict[str, int]
    non_terminal: int
    # The non-terminal jobs (at most 10) and their call states ('none': no call yet).
    stuck: dict[str, str] = msgspec.field(default_factory=dict)
    recovered_by_reconciler: int
    settled_by_webhook: int
    upstream_creates_max_per_job: int
    late_callbacks: int  # callback retries the providers sent on their own schedules
    duplicate_settlements: int
    credits: Credits
    verify_mismatches: int
    p50_s: float | None
    p95_s: float | None
    violations: list[str] = msgspec.field(default_factory=list)
    queue: str = "reference"  # what ran the jobs: the reference queue, celery or arq
    workers_killed: int = 0  # worker processes SIGKILLed while the jobs ran
    # Celery: publications of jobs with no call whose message was neither queued nor
    # unacked in two scans (lost by the broker, or consumed by a task that failed before
    # its call started), engine/demo/lost.py.
    messages_lost: int = 0
    # Faults the demo rode through (``--chaos``, or a restart from outside).
    database_restarts: int = 0
    connections_cut: int = 0
    database_outages: int = 0  # as the demo's own bookkeeping saw them
    database_down_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


async def install_audit(conn: Conn) -> None:
    """Audit every settlement move in the demo database (a trigger on usage_logs)."""
    await execute_script(conn, "demo_audit_trigger_citus" if await on_citus(conn)
                         else "demo_audit_trigger")  # several statements: no parameters


def _f(value: Decimal | float | None) -> float:
    return as_float(value) or 0.0


async def _credits(conn: Conn) -> tuple[Credits, int, int]:
    c, duplicates, unsettled = Credits(), 0, 0
    for r in await execute(conn, "demo_settlements", {}):
        reserved, terminal = _f(r["credits_reserved"]), r["call_state"] in _TERMINAL
        c.reserved += reserved
        if r["status"] == "committed":
            c.committed += _f(r["credits_charged"])
            c.released += reserved - _f(r["credits_charged"])
            c.partial_commits += int(_f(r["credits_charged"]) < reserved)
        elif r["status"] == "refunded":
            c.refunded += reserved
        elif terminal:
            c.leaked += reserved
        duplicates += int(r["moves"] > 1 or r["bad_moves"] > 0)
        unsettled += int(terminal and r["moves"] != 1)
    return c, duplicates, unsettled


async def summarize(conn: Conn, creates_per_job: Mapping[str, int],
                    late_callbacks: int = 0) -> DemoSummary:
    states = {r["state"]: r["n"] for r in await execute(conn, "demo_states", {})}
    credits, duplicates, unsettled = await _credits(conn)
    recovered = (await execute(conn, "demo_recovered", {}))[0]["n"]
    by_webhook = (await execute(conn, "demo_by_webhook", {}))[0]["n"]
    lat = (await execute(conn, "demo_latency", {}))[0]
    check, _ = await verify(conn)
    s = DemoSummary(
        jobs=sum(states.values()),
        terminal={k: v for k, v in sorted(states.items()) if k in _TERMINAL},
        non_terminal=sum(v for k, v in states.items() if k not in _TERMINAL),
        stuck={r["id"]: r["state"] for r in await execute(conn, "demo_stuck", {})},
        recovered_by_reconciler=recovered, settled_by_webhook=by_webhook,
        upstream_creates_max_per_job=max(creates_per_job.values(), default=0),
        late_callbacks=late_callbacks,
        duplicate_settlements=duplicates, credits=credits,
        verify_mismatches=check.mismatches + check.errors,
        p50_s=lat["p50"], p95_s=lat["p95"])
    s.violations = _violations(s, unsettled)
    return s


def _listed(stuck: Mapping[str, str], total: int) -> str:
    named = ", ".join(f"{job} {'with no call yet' if state == 'none' else state}"
                      for job, state in stuck.items())
    return f"{named}, ..." if total > len(stuck) else named


def _violations(s: DemoSummary, unsettled: int) -> list[str]:
    checks = [
        (s.non_terminal == 0, f"{s.non_terminal} jobs not terminal at the deadline "
                              f"({_listed(s.stuck, s.non_terminal)})"),
        (s.upstream_creates_max_per_job <= 1,
         f"a job created {s.upstream_creates_max_per_job} upstream tasks"),
        (s.duplicate_settlements == 0, f"{s.duplicate_settlements} reservations settled twice"),
        (unsettled == 0, f"{unsettled} terminal jobs not settled exactly once"),
        (s.credits.leaked == 0, f"{s.credits.leaked:g} credits leaked"),
        (s.verify_mismatches == 0, f"{s.verify_mismatches} projection/log mismatches"),
    ]
    return [msg for ok, msg in checks if not ok]
