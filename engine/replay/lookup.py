"""A job named by the start of its id, as ``callwarden jobs`` shows it (``audit 92ebf615``).

A prefix of ``n`` hex digits names every uuid from the prefix padded with ``0`` to the
prefix padded with ``f``; Postgres orders uuids by their bytes, the same order as their
hex, so the lookup is a range on the primary key (``audit_job_prefix``), read through its
index. ``id::text LIKE 'prefix%'`` would read every row.
"""

from __future__ import annotations

import re
import uuid

import msgspec

from callwarden.database.db import Conn
from callwarden.database.write import execute

__all__ = ["MIN_DIGITS", "Candidate", "digits", "jobs_with_prefix", "prefix_range"]

MIN_DIGITS = 4
_HEX = re.compile(r"[0-9a-f]*")


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A job whose id starts with the prefix asked for."""

    id: uuid.UUID
    kind: str | None
    status: str
    call_state: str | None


def digits(text: str) -> str:
    """``text`` as the hex digits of a job id or of its start (dashes dropped, lower
    case); ``ValueError`` unless it is :data:`MIN_DIGITS` to 32 hex digits."""
    hexes = text.strip().lower().replace("-", "")
    if not _HEX.fullmatch(hexes) or not MIN_DIGITS <= len(hexes) <= 32:
        raise ValueError(f"want a job id or its first {MIN_DIGITS} or more hex digits, "
                         f"got {text!r}")
    return hexes


def prefix_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The lowest and the highest uuid starting with the hex digits ``prefix``."""
    hexes = digits(prefix)
    return uuid.UUID(hexes.ljust(32, "0")), uuid.UUID(hexes.ljust(32, "f"))


async def jobs_with_prefix(conn: Conn, prefix: str, limit: int = 6) -> list[Candidate]:
    """Up to ``limit`` jobs whose id starts with ``prefix``, in id order."""
    lower, upper = prefix_range(prefix)
    rows = await execute(conn, "audit_job_prefix",
                         {"lower": lower, "upper": upper, "limit": limit})
    return [Candidate(id=r["id"], kind=r["provider_kind"], status=r["status"],
                      call_state=r["call_state"]) for r in rows]
