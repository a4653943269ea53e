"""Creating host job rows (with a credit reservation) — what a host's API does before
handing a job to a worker; used by ``callwarden enqueue``, the demo, tests and benches."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from callwarden.database.db import Conn
from callwarden.database.write import execute

__all__ = ["create_job"]

_enc = msgspec.json.Encoder()


async def create_job(
    conn: Conn,
    *,
    user_id: str = "user-1",
    job_type: str = "image",
    input_data: Mapping[str, Any] | None = None,
    credits: float | None = 10.0,
    status: str = "pending",
    job_id: uuid.UUID | None = None,
    workflow_execution_id: uuid.UUID | None = None,
    node_id: str | None = None,
) -> uuid.UUID:
    """Insert a job and (unless ``credits`` is None) its ``reserved`` usage log."""
    jid = job_id or uuid.uuid4()
    await execute(conn, "create_job", {
        "job_id": jid, "user_id": user_id, "job_type": job_type, "status": status,
        "input_data": _enc.encode(dict(input_data or {})).decode(), "credits": credits,
        "workflow_execution_id": workflow_execution_id, "node_id": node_id,
    })
    return jid
