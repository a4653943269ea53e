"""Helpers of the reconciler-side tests: a task on the provider simulator
(:func:`upstream_task`), a call its dead worker left behind, written by SQL
(:func:`dead_worker_call`), a host's seed row (:func:`seed_row`), the job row read back."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import aiohttp
import msgspec
from psycopg import sql

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import (
    CallStarted,
    TaskCreated,
)
from callwarden.providers.base import AsyncKindClient
from callwarden.providers.registry import client_for
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.reconciler.loop import Counts

VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"


DUB = {"file": b"\x00\x00\x00\x18ftypmp42video", "target_lang": "es", "name": "clip"}


DEAD = "worker:dead0000"


OLD = timedelta(minutes=40)  # past every family's threshold used here


REQUESTS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "kie-standard": lambda s: {"model": "nano-banana-pro", "input": {"prompt": "a cat",
                                                                     "_sim": s}},
    "replicate-prediction": lambda s: {"version": VERSION, "input": {"prompt": "x",
                                                                     "_sim": s}},
    "replicate-training": lambda s: {"model": "ostris/flux-dev-lora-trainer",
                                     "version": VERSION, "destination": "me/my-lora",
                                     "input": {"steps": 100, "_sim": s}},
    "elevenlabs-async": lambda s: {**DUB, "_sim": s},
}


NOW_SCRIPT: dict[str, Any] = {"steps": [], "end": "succeeded"}


async def upstream_task(http: aiohttp.ClientSession, sim: RunningSimulator, kind: str,
                        script: dict[str, Any]) -> str:
    """A task created upstream through the simulator, as the dead worker did."""
    client = cast(AsyncKindClient, client_for(kind, http, sim.settings))
    return await client.create(REQUESTS[kind](script))


async def dead_worker_call(conn: Conn, kind: str, task_id: str | None, *,
                           age: timedelta = OLD, sync: bool = False) -> uuid.UUID:
    """A job whose worker recorded CallStarted (+ TaskCreated) ``age`` ago, then died."""
    job = await create_job(conn, credits=10)
    at = utcnow() - age
    p = (await append(conn, job, await load(conn, job),
                      CallStarted(at=at, actor=DEAD, kind=kind, sync=sync))).projection
    if task_id is not None:
        await append(conn, job, p, TaskCreated(at=at, actor=DEAD, task_id=task_id))
    return job


async def row(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    got = await (await conn.execute(
        "SELECT j.status, j.call_state, j.error_message, j.reconcile_attempts, "
        "j.reconcile_last_error, j.reconcile_next_at, j.reconcile_owner, j.call_version, "
        "j.progress, u.status AS credits, u.credits_charged, "
        "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j LEFT JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s", (job,)
    )).fetchone()
    assert got is not None
    return dict(got)


def counted(c: Counts) -> dict[str, int]:
    return {k: v for k, v in msgspec.structs.asdict(c).items() if v}


async def seed_row(conn: Conn, task: str | None, *, kind: str = "kie-standard",
                   age: timedelta = OLD, **columns: Any) -> uuid.UUID:
    """A job the host's own worker instrumented (seed §5.2), straight onto jobs."""
    job = await create_job(conn, credits=10, status="processing")
    await conn.execute(
        "UPDATE jobs SET provider_kind = %s, provider_task_id = %s, "
        "provider_call_started_at = now() - %s WHERE id = %s", (kind, task, age, job))
    for column, value in columns.items():
        await conn.execute(sql.SQL("UPDATE jobs SET {} = %s WHERE id = %s").format(
            sql.Identifier(column)), (value, job))
    return job
