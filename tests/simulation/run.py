"""Running seeds: one simulator and one HTTP session per process, a fresh store per seed
(a :class:`MemoryStore`, or a fresh migrated Postgres database: ``DATABASE_URL``'s
server, else an embedded one)."""

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
from datetime import timedelta
from pathlib import Path

import aiohttp

from callwarden.providers.simulator.core import running_simulator
from callwarden.store.databases import create_database, drop_database
from callwarden.store.db import EmbeddedServer, connect, open_pool
from callwarden.store.memory import MemoryStore
from callwarden.store.migrate import migrate
from callwarden.store.postgres import PostgresStore
from tests.simulation.driver import Outcome, Schedule, Violation
from tests.simulation.host import EPOCH, MemoryHost, PostgresHost, SimClock

__all__ = ["Postgres", "merge_labels", "run_parallel", "run_seeds"]


class Postgres:
    """A server to create one database per seed on, from a migrated template."""

    def __init__(self, admin_url: str | None = None) -> None:
        self._embedded: EmbeddedServer | None = None
        url = admin_url or os.environ.get("DATABASE_URL")
        if url is None:
            self._embedded = EmbeddedServer(Path(tempfile.mkdtemp(prefix="cw-sim-pg-")),
                                            cleanup="delete")
            url = self._embedded.url()
        self.admin_url = url
        self.template = f"cw_sim_template_{uuid.uuid4().hex[:8]}"
        self._migrated = False

    async def database(self) -> str:
        if not self._migrated:
            url = create_database(self.admin_url, self.template)
            async with await connect(url) as conn:
                await migrate(conn)
            self._migrated = True
        name = f"cw_sim_{uuid.uuid4().hex[:12]}"
        return create_database(self.admin_url, name, template=self.template)

    def drop(self, url: str) -> None:
        drop_database(self.admin_url, url.rsplit("/", 1)[-1].split("?")[0])

    def close(self) -> None:
        if self._migrated:
            drop_database(self.admin_url, self.template)
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


async def run_seeds(seeds: Iterable[int], *, store: str = "memory",
                    postgres: Postgres | None = None) -> list[Outcome]:
    """Run each seed's schedule; raises :class:`~tests.simulation.driver.Violation` at the
    first violated invariant."""
    out: list[Outcome] = []
    own_pg = store == "postgres" and postgres is None
    pg = Postgres() if own_pg else postgres
    try:
        async with _quiet(), running_simulator() as rs, aiohttp.ClientSession() as http:
            for seed in seeds:
                clock = SimClock(EPOCH)
                if store == "memory":
                    mem = MemoryStore(clock, migrated_at=EPOCH - timedelta(days=1))
                    out.append(await Schedule(seed, mem, MemoryHost(mem), rs, http,
                                              clock).run())
                    continue
                assert pg is not None
                url = await pg.database()
                try:
                    async with open_pool(url, max_size=4) as pool:
                        host = PostgresHost(pool)
                        await host.install_audit()
                        out.append(await Schedule(seed, PostgresStore(pool, clock=clock),
                                                  host, rs, http, clock).run())
                finally:
                    pg.drop(url)
    finally:
        if own_pg and pg is not None:
            pg.close()
    return out


def rate(outcomes: list[Outcome], started: float) -> str:
    elapsed = time.perf_counter() - started
    return (f"{len(outcomes)} schedules in {elapsed:.1f} s "
            f"({len(outcomes) / elapsed if elapsed else 0:.1f}/s)")


def _shard(args: tuple[int, int, str]) -> tuple[int, dict[str, int], str | None]:
    """One process's share: (schedules run, label counts, the violation's text or None)."""
    first, count, store = args
    try:
        outcomes = asyncio.run(run_seeds(range(first, first + count), store=store))
    except Violation as v:
        return 0, {}, str(v)
    return len(outcomes), merge_labels(outcomes), None


def merge_labels(outcomes: Iterable[Outcome]) -> dict[str, int]:
    labels: dict[str, int] = {}
    for o in outcomes:
        for k, n in o.labels.items():
            labels[k] = labels.get(k, 0) + n
    return labels


def run_parallel(first: int, count: int, *, jobs: int, store: str = "memory"
                 ) -> tuple[int, dict[str, int], list[str]]:
    """Seeds ``first .. first + count - 1`` split over ``jobs`` processes: (schedules run,
    label counts, the violations found: at most one per process, each with its replay
    commands)."""
    if jobs <= 1:
        n, labels, bad = _shard((first, count, store))
        return n, labels, [bad] if bad else []
    size = -(-count // jobs)
    shards = [(first + i * size, min(size, count - i * size), store) for i in range(jobs)
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
