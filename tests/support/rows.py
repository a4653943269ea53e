"""A host's job and what the host sees of it, by plain SQL (no callwarden API)."""

from __future__ import annotations

import uuid
from typing import Any

from callwarden.database.db import Conn


async def host_job(conn: Conn, credits: float = 10) -> uuid.UUID:
    """A pending job and its reservation, inserted as a host's own API does."""
    job = uuid.uuid4()
    await conn.execute("INSERT INTO jobs (id, user_id, status) VALUES (%s, 'u1', 'pending')",
                       (job,))
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                       "VALUES (%s, 'u1', 'reserved', %s)", (job, credits))
    return job


async def seen_by_host(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    """The job's status, call state, output, error, reservation status and asset count."""
    row = await (await conn.execute(
        "SELECT j.status, j.call_state, j.output_data, j.error_message, u.status AS credits, "
        "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s",
        (job,))).fetchone()
    assert row is not None
    return dict(row)
