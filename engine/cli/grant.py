"""``callwarden grant ROLE``: give the runtime role exactly what it needs, and who else
can reach callwarden's objects (``callwarden check``'s privilege lines).

The role model (docs/security.md): the role that runs ``migrate`` owns the schema
``callwarden`` and everything in it; the runtime role (workers, the reconciler, ``serve``,
a host calling callwarden's functions) is granted the set
``callwarden.grant_runtime(role)`` (migration 0011) runs, which this command calls and
prints; every other role reaches nothing. A role is callwarden's runtime when it may use
the schema and append to ``callwarden.call_events``: the same test 0011's guard trigger
makes before it lets a role write callwarden's columns of the host's rows.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Literal

from rich.console import Console

from callwarden.database.citus import on_citus
from callwarden.database.db import Conn, connect
from callwarden.database.write import execute

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["classify", "privilege_findings", "register", "runtime_roles"]

Level = Literal["ok", "note", "problem"]


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "grant", help="grant a role callwarden's runtime privileges (run as the owner)",
        description="Grant ROLE exactly what callwarden's runtime needs (workers, the "
                    "reconciler, serve, a host calling callwarden's functions): run as the "
                    "role that ran migrate. Prints each statement it ran. The same as the "
                    "SQL statement SELECT callwarden.grant_runtime('ROLE').")
    p.add_argument("role", help="the runtime role (it must exist)")
    p.set_defaults(handler=handler)


async def handler(args: argparse.Namespace, url: str) -> int:
    conn = await connect(url)
    async with conn:
        rows = await execute(conn, "privileges_grant_runtime", {"role": args.role})
    console = Console()
    for row in rows:
        console.print(f"{row['stmt']};", soft_wrap=True, highlight=False)
    console.print(f"{args.role} is callwarden's runtime role")
    return 0


def classify(roles: list[dict[str, object]], public: list[str]
             ) -> list[tuple[Level, str]]:
    """Findings from ``privileges_roles`` and ``privileges_public`` rows (pure): the
    runtime roles (schema USAGE and INSERT on the log, granted to them or a role they
    belong to), a problem for every other role that reaches an object by a grant of its
    own, or for PUBLIC holding anything; a note for a role that reaches them only through
    pg_read_all_data / pg_write_all_data."""
    found: list[tuple[Level, str]] = []
    runtime = runtime_roles(roles)
    if public:
        found.append(("problem", f"PUBLIC (every role) holds privileges on callwarden's "
                                 f"{', '.join(public)}: run callwarden migrate, or revoke "
                                 f"them (docs/security.md)"))
    for r in roles:
        name = str(r["role"])
        reaches, granted = _names(r["reaches"]), _names(r["granted"])
        if name in runtime or not (reaches or granted or r["usage"]):
            continue
        if r["reads_all"] and not (granted or r["usage"]):
            found.append(("note", f"{name} reaches callwarden's objects through "
                                  f"pg_read_all_data/pg_write_all_data ({', '.join(reaches)})"))
            continue
        what = ", ".join(granted or reaches) or "schema callwarden"
        found.append(("problem", f"{name} is not callwarden's runtime but can reach "
                                 f"{what}: REVOKE it (docs/security.md)"))
    found.append(("ok", f"runtime role(s): {', '.join(runtime)}") if runtime else
                 ("note", "no runtime role besides the owner: callwarden grant ROLE "
                          "gives one its privileges (docs/security.md)"))
    return found


def runtime_roles(roles: list[dict[str, object]]) -> list[str]:
    """The roles of ``privileges_roles`` rows that are callwarden's runtime: schema USAGE
    and INSERT on the log, granted to them or a role they belong to."""
    return [str(r["role"]) for r in roles if r["usage"] and r["appends"]]


def _names(values: object) -> list[str]:
    return [str(v) for v in values] if isinstance(values, list) else []


async def privilege_findings(conn: Conn) -> list[tuple[Level, str]]:
    """Who can reach callwarden's objects, and whether the guard on the host's rows is
    installed; nothing to say on a database not yet migrated to its own schema."""
    owner = await execute(conn, "privileges_owner", {})
    if not owner:
        return []
    roles = await execute(conn, "privileges_roles", {})
    found = classify(roles, [str(r["name"])
                             for r in await execute(conn, "privileges_public", {})])
    for gap in await execute(conn, "privileges_rls_gaps", {"roles": runtime_roles(roles)}):
        found.append(("problem", f"runtime role {gap['role']} sees no row of {gap['tbl']} "
                                 f"under its row-level security: run callwarden grant "
                                 f"{gap['role']} again (docs/security.md)"))
    guards = (await execute(conn, "privileges_guards", {}))[0]["n"]
    if await on_citus(conn):
        found.append(("note", "on Citus the guard on callwarden's columns of jobs is not "
                              "installed (Citus refuses triggers on distributed tables): "
                              "give no other role UPDATE on jobs (docs/security.md)"))
    elif guards != 4:
        found.append(("problem", "the guard on callwarden's columns of jobs and usage_logs "
                                 f"is missing or disabled ({guards} of 4 triggers enabled): "
                                 "run callwarden migrate"))
    else:
        found.append(("ok", "only callwarden's runtime may write its columns of jobs"))
    return found
