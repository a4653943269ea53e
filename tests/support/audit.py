"""Helpers of the audit, verify and rebuild tests: a job with a given history written by
SQL (:func:`new_job`), the CLI run in-process (:func:`cli`), a sync call run to its end."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import pytest

from callwarden.cli.main import main
from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import (
    Event,
)

X = TypeVar("X")


async def drive(conn: Conn, job: uuid.UUID, events: Sequence[Event]) -> None:
    """Append ``events`` through the real write path."""
    p = await load(conn, job)
    for e in events:
        result = await append(conn, job, p, e)
        assert result.ok
        p = result.projection


async def new_job(conn: Conn, events: Sequence[Event], credits: float = 10) -> uuid.UUID:
    job = await create_job(conn, credits=credits)
    await drive(conn, job, events)
    return job


def run_sync(db_url: str, fn: Callable[[Conn], Awaitable[X]]) -> X:
    """Run ``fn`` on a fresh connection from a synchronous (CLI) test."""
    async def go() -> X:
        async with await connect(db_url) as conn:
            return await fn(conn)
    return asyncio.run(go())


def cli(db_url: str, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setenv("DATABASE_URL", db_url)
    return main(list(argv))
