"""Running seeds: one simulator, one HTTP session and one migrated Postgres database per
process (on ``DATABASE_URL``'s server, else an embedded one), emptied before each seed."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from callwarden.database.databases import create_database, drop_database
from callwarden.database.db import EmbeddedServer, connect, open_pool
from callwarden.database.migrate import migrate
from callwarden.providers.simulator.core import running_simulator
from tests.simulation.driver import Outcome, Schedule, Violation
from tests.simulation.host import EPOCH, SimClock, adapters

__all__ = ["Postgres", "merge_labels", "run_parallel", "run_seeds"]


class Postgres:
    """One migrated database for a process's seeds, on ``admin_url``'s server (default:
    ``DATABASE_URL``, else an embedded server started here)."""

    def __init__(self, admin_url: str | None = None) -> None:
        self._embedded: EmbeddedServer | None = None
        url = admin_url or os.environ.get("DATABASE_URL")
        if url is None:
            self._embedded = EmbeddedServer(Path(tempfile.mkdtemp(prefix="cw-sim-pg-")),
                                            cleanup="delete")
            url = self._embedded.url()
        self.admin_url = url
        self.name = f"cw_sim_{uuid.uuid4().hex[:12]}"
        self.url: str | None = None

    async def database(self) -> str:
        if self.url is None:
            url = create_database(self.admin_url, self.name)
            async with await connect(url) as conn:
                await migrate(conn)
            self.url = url
        return self.url

    def close(self) -> None:
        if self.url is not None:
            drop_database(self.admin_url, self.name)
        if self._embedded is not None:
            self._embedded.stop()


@asynccontextmanager
async def _quiet() -> AsyncIterator[None]:
    """The actors log every outcome at INFO (and crash traces): not for 100,000 runs."""
    loggers = [logging.getLogger(n) for n in ("callwarden", "aiohttp")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


async def run_seeds(seeds: Iterable[int], *, postgres: Postgres | None = None
                    ) -> list[Outcome]:
    """Run each seed's schedule; raises :class:`~tests.simulation.driver.Violation` at the
    first violated invariant."""
    out: list[Outcome] = []
    pg = postgres if postgres is not None else Postgres()
    try:
        url = await pg.database()
        async with (_quiet(), running_simulator() as rs, aiohttp.ClientSession() as http,
                    open_pool(url, max_size=4) as pool):
            for seed in seeds:
                clock = SimClock(EPOCH)
                db, host = adapters(clock=clock, pool=pool)
                await host.install_audit()
                await host.reset()
                out.append(await Schedule(seed, db, host, rs, http, clock).run())
    finally:
        if postgres is None:
            pg.close()
    return out


def rate(outcomes: list[Outcome], started: float) -> str:
    elapsed = time.perf_counter() - started
    return (f"{len(outcomes)} schedules in {elapsed:.1f} s "
            f"({len(outcomes) / elapsed if elapsed else 0:.1f}/s)")


def _shard(args: tuple[int, int]) -> tuple[int, dict[str, int], str | None]:
    """One process's share: (schedules run, label counts, the violation's text or None)."""
    first, count = args
    try:
        outcomes = asyncio.run(run_seeds(range(first, first + count)))
    except Violation as v:
        return 0, {}, str(v)
    return len(outcomes), merge_labels(outcomes), None


def merge_labels(outcomes: Iterable[Outcome]) -> dict[str, int]:
    labels: dict[str, int] = {}
    for o in outcomes:
        for k, n in o.labels.items():
            labels[k] = labels.get(k, 0) + n
    return labels


def run_parallel(first: int, count: int, *, jobs: int) -> tuple[int, dict[str, int], list[str]]:
    """Seeds ``first .. first + count - 1`` split over ``jobs`` processes: (schedules run,
    label counts, the violations found: at most one per process, each with its replay
    commands)."""
    if jobs <= 1:
        n, labels, bad = _shard((first, count))
        return n, labels, [bad] if bad else []
    size = -(-count // jobs)
    shards = [(first + i * size, min(size, count - i * size)) for i in range(jobs)
              if count - i * size > 0]
    total, labels, found = 0, {}, []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for n, got, violation in pool.map(_shard, shards):
            total += n
            for k, v in got.items():
                labels[k] = labels.get(k, 0) + v
            if violation:
                found.append(violation)
    return total, labels, found
