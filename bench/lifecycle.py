"""Full async call lifecycles per second: callwarden's CallRunner vs a DBOS workflow.

Run: ``python bench/lifecycle.py [--jobs 300] [--rounds 6] [--warmup 48]``

One run, one Postgres (``DATABASE_URL`` or a throwaway embedded server), the provider
simulator in process on 127.0.0.1 (``kie-standard``, one ``running`` poll then success,
256-byte media), media stored in a ``LocalFolderStore`` under a temp dir:

- ``callwarden``: ``CallRunner.run`` on jobs made beforehand with ``create_job`` (create ->
  poll -> finalize -> completed, the asset row and the committed reservation), poll interval
  0 and a no-op sleep, N jobs shared by 1 or 8 asyncio tasks over one runner and one pool of
  8 connections.
- ``floor``: the lifecycle's provider and media work alone, nothing recorded (create, poll
  until success, download through a kept guarded session, store): the rate no durable
  engine on this machine can beat, so ``floor / DBOS`` is the highest ratio any could show.
- ``raw-SQL floor``: the same provider and media work with callwarden's three durable
  commits sent as bare statements (``floor3_*`` in bench/bench.sql: CallStarted before the
  create, TaskCreated after it, then the success, its claim, ``Completed``, the settlement
  and the asset rows in one statement), on the peer's plain pool: what an engine that keeps
  the same commits costs with no code of its own, fences, guards or hooks. ``callwarden /
  raw-SQL floor`` is the engine's own overhead; ``raw-SQL floor / DBOS`` is the most such
  an engine could show.
- ``host API``: the same provider and media work with callwarden's three commits made by
  its SQL functions (migration 0014: ``start_call``, ``task_created``, ``succeeded``), as a
  Node host calls them through ``clients/node``: the write path every non-Python host
  gets, its fences, declaration checks and settlement included, three round trips.
- ``Node host``: the host API driven by a real Node 20 process through ``clients/node``'s
  ``runTask`` (``clients/node/bench/lifecycle_host.mjs``: the host's own KIE requests
  with ``fetch``, its own media storage, ``pg``'s pool of 8): the rate a BullMQ
  worker's handler gets, minus the queue. A round is sent to the long-lived process as
  one line and timed here. ``Node floor``: the same process doing the provider and media
  work alone (nothing recorded), so that ``Node host / Node floor`` is the client's and
  the database's share, as ``raw-SQL floor / floor`` is in Python.
- ``dbos``: the same lifecycle as a DBOS workflow of three async steps (create, poll,
  finalize) with the same provider client, the same download and storage write, and in
  ``finalize`` one application transaction (job completed, reservation committed, asset
  row); DBOS's system database lives on the same server.

The seven run in alternating rounds (``--rounds``) at each concurrency, so that the
noise of a shared machine falls on all alike; rates are jobs / summed round time.

Per callwarden call it also reports the transactions, twice: on the server
(``xact_commit + xact_rollback`` of the bench database in ``pg_stat_database`` around each
callwarden round, once every pooled backend has flushed its stats with
``pg_stat_force_next_flush()``, the flushing statements subtracted; autovacuum visiting the
database in that window adds a few) and on the client (autocommit statements + outermost
transaction blocks); the round trips (``AsyncConnection.wait`` calls that send something:
one per statement, one per ``BEGIN``/``COMMIT``); and the statements by query name. The
client's counts come from an untimed round per cell of a second runner on a counting pool
(``bench/counting.py``): the timed rounds run on the engine's plain pool, as the peers do,
so the counting's own work is not in callwarden's rate. The
warm-up runs on the same pool, so psycopg has already prepared its statements (preparing is
one more round trip and, outside a transaction block, one more transaction).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import aiohttp
import msgspec
from _common import SQL, conninfo_parts, fresh_database
from counting import CountingConnection, configure_counted
from dbos import DBOS, DBOSConfig, SetWorkflowID
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import URL

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.databases import drop_database
from callwarden.database.db import Pool, connect, open_pool, uri
from callwarden.database.jobs import create_job
from callwarden.database.postgres import PostgresDatabase
from callwarden.database.write import load
from callwarden.providers.base import AsyncKindClient, ProviderSettings
from callwarden.providers.media import download
from callwarden.providers.media_guard import MediaSessions
from callwarden.providers.outcomes import Running, Succeeded
from callwarden.providers.registry import client_for, media_fetch_for
from callwarden.providers.simulator.core import running_simulator
from callwarden.providers.storage import LocalFolderStore, StoredObject, media_key

KIND = "kie-standard"
SCRIPT = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded"}
REQUEST: dict[str, Any] = {"model": "nano-banana-pro",
                           "input": {"prompt": "bench", "_sim": SCRIPT}}
POOL_SIZE = 8
NODE_HOST = Path(__file__).parents[1] / "clients" / "node" / "bench" / "lifecycle_host.mjs"


@asynccontextmanager
async def counting_pool(url: str) -> AsyncIterator[Pool]:
    """A ready pool of ``POOL_SIZE`` autocommit dict-row counting connections."""
    pool: Pool = AsyncConnectionPool(
        url, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False,
        kwargs={"autocommit": True, "row_factory": dict_row},
        connection_class=CountingConnection, configure=configure_counted)
    async with pool:
        await pool.wait(timeout=30)
        yield pool


# -- pg_stat_database ------------------------------------------------------------------


@dataclass
class Db:
    url: str
    admin: str  # the same server's "postgres" database: reading stats adds nothing here
    name: str

    async def xacts(self) -> int:
        async with await connect(self.admin) as conn:
            await conn.execute(SQL["stats_clear_snapshot"])
            rows = await (await conn.execute(SQL["stats_transactions"],
                                             {"name": self.name})).fetchall()
        return int(rows[0]["n"])

    async def flushed_xacts(self, *pools: Pool) -> int:
        """The database's transactions once every connection of ``pools`` has flushed its
        pending stats: ``pg_stat_force_next_flush()`` takes effect when the backend goes
        idle, before it answers; each call is one transaction of its own."""
        for pool in pools:
            async with AsyncExitStack() as stack:
                conns = [await stack.enter_async_context(pool.connection())
                         for _ in range(POOL_SIZE)]
                for conn in conns:
                    await conn.execute(SQL["stats_force_flush"])
        return await self.xacts()


# -- shared work -----------------------------------------------------------------------


# Made and checked through a long-lived pool: a closed connection's backend flushes its
# stats when it exits, which could land inside a measured window.
async def make_jobs(pool: Pool, n: int) -> list[uuid.UUID]:
    async with pool.connection() as conn:
        return [await create_job(conn, credits=5) for _ in range(n)]


async def all_completed(pool: Pool, jobs: list[uuid.UUID]) -> bool:
    async with pool.connection() as conn:
        return [(await load(conn, j)).status for j in jobs] == ["completed"] * len(jobs)


async def timed(run: Callable[[uuid.UUID], Awaitable[object]], jobs: list[uuid.UUID],
                concurrency: int) -> float:
    """Seconds to run ``jobs`` shared by ``concurrency`` tasks."""
    queue = iter(jobs)

    async def worker() -> None:
        for job in queue:
            await run(job)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def no_sleep(_: float) -> None:
    """The runner's wait between polls: none, as the floors' ``polled`` (not even a turn
    of the event loop)."""


# -- callwarden --------------------------------------------------------------------------


@dataclass
class Measured:
    seconds: float = 0.0
    jobs: int = 0
    xacts: int = 0  # pg_stat_database, in the timed rounds
    counted_jobs: int = 0  # the calls of the counted rounds, and what the client sent:
    client_xacts: int = 0
    round_trips: int = 0
    statements: Counter[str] = field(default_factory=Counter)

    def per_call(self, value: float) -> float:
        return value / self.jobs

    def per_counted_call(self, value: float) -> float:
        return value / self.counted_jobs


def pool_of(runner: CallRunner) -> Pool:
    """The pool the runner's database handle was built on."""
    db = runner.db
    assert isinstance(db, PostgresDatabase)
    return db.pool


def make_runner(pool: Pool, http: aiohttp.ClientSession, settings: ProviderSettings,
                media: Path) -> CallRunner:
    return CallRunner(pool, http, settings, LocalFolderStore(media), sleep=no_sleep,
                      config=CallConfig(poll_interval_s={KIND: 1e-6}))


async def run_callwarden(runner: CallRunner, job: uuid.UUID) -> None:
    out = await runner.run(job, KIND, REQUEST)
    if out.result != "completed":
        raise RuntimeError(f"callwarden job {job} ended {out.result}: {out.detail}")


async def callwarden_round(db: Db, runner: CallRunner, peer_pool: Pool, jobs: list[uuid.UUID],
                           concurrency: int, into: Measured) -> None:
    """One timed round, on a plain pool as the peers', with its transactions on the server
    (the peer's pool is idle meanwhile, and flushed before, so nothing of it is counted)."""
    before = await db.flushed_xacts(peer_pool, pool_of(runner))
    into.seconds += await timed(lambda j: run_callwarden(runner, j), jobs, concurrency)
    into.jobs += len(jobs)
    into.xacts += await db.flushed_xacts(pool_of(runner)) - before - POOL_SIZE


async def counted_round(counted: CallRunner, jobs: list[uuid.UUID], concurrency: int,
                        into: Measured) -> None:
    """An untimed round of a runner on a counting pool: what the client sends per call
    (round trips, transactions, statements). Apart from the timed rounds, so that the
    counting's own work is not in callwarden's rate (the peers' pools count nothing)."""
    CountingConnection.reset()
    await timed(lambda j: run_callwarden(counted, j), jobs, concurrency)
    into.counted_jobs += len(jobs)
    into.round_trips += CountingConnection.round_trips
    into.client_xacts += CountingConnection.transactions
    into.statements.update(CountingConnection.statements)


# -- the floor: the provider and media work alone, no database ---------------------------


async def run_floor(peer: Peer, sessions: MediaSessions, job: uuid.UUID) -> None:
    client = cast(AsyncKindClient, client_for(KIND, peer.http, peer.settings))
    done = await polled(client, await client.create(REQUEST))
    fetch = media_fetch_for(KIND, peer.settings)
    await stored_media(peer, sessions.session(fetch.policy), str(job), done.media_urls)


# -- the raw-SQL floor: the same provider and media work, and the same three commits -----


async def floor3_write(pool: Pool, name: str, params: dict[str, Any],
                       expect: dict[str, int] | None = None) -> None:
    """One of the floor's three transactions: one autocommit statement, which must write
    (a fenced update that matched nothing would make the floor fast and wrong): a row
    (``rowcount``), or the counts ``expect`` names in the row it answers."""
    async with pool.connection() as conn:
        cur = await conn.execute(SQL[name], params)
        wrote = (await cur.fetchone() if expect else None) or {}
        if (cur.rowcount < 1 if expect is None
                else any(wrote.get(k) != n for k, n in expect.items())):
            raise RuntimeError(f"{name} for job {params['job_id']} wrote {wrote or 'nothing'}"
                               f", not {expect or 'a row'}")


async def run_floor3(peer: Peer, sessions: MediaSessions, job: uuid.UUID) -> None:
    """CallStarted before the create, TaskCreated after it, then the success, its claim and
    Completed with the settlement and the asset rows in one statement: what any engine
    that keeps callwarden's three durable commits must send, with no engine around it."""
    actor = "floor3"
    await floor3_write(peer.pool, "floor3_start", {
        "job_id": job, "kind": KIND, "actor": actor,
        "payload": _json({"kind": KIND, "sync": False})})
    client = cast(AsyncKindClient, client_for(KIND, peer.http, peer.settings))
    task_id = await client.create(REQUEST)
    await floor3_write(peer.pool, "floor3_task", {
        "job_id": job, "task_id": task_id, "actor": actor,
        "payload": _json({"task_id": task_id})})
    done = await polled(client, task_id)
    fetch = media_fetch_for(KIND, peer.settings)
    stored = await stored_media(peer, sessions.session(fetch.policy), str(job),
                                done.media_urls)
    await floor3_write(peer.pool, "floor3_complete", {
        "job_id": job, "actor": actor, "cost": done.cost,
        "events": _json([
            {"type": "UpstreamSucceeded", "media_urls": list(done.media_urls),
             "cost": done.cost},
            {"type": "FinalizeClaimed", "owner": actor},
            {"type": "Completed", "cost": done.cost}]),
        "assets": _json([{"key": o.key, "url": o.uri, "content_type": o.content_type,
                          "size": o.size} for o in stored]),
    }, expect={"events": 3, "settled": 1, "assets": len(stored)})


async def host_api_call(pool: Pool, name: str, params: dict[str, Any],
                        expect: dict[str, object]) -> None:
    async with pool.connection() as conn:
        row = await (await conn.execute(SQL[name], params)).fetchone()
    if row is None or any(row.get(k) != v for k, v in expect.items()):
        raise RuntimeError(f"{name} for job {params['job_id']} answered {row}, not {expect}")


async def run_host_api(peer: Peer, sessions: MediaSessions, job: uuid.UUID) -> None:
    """The lifecycle through the host API's three functions (what clients/node sends)."""
    actor = "host-api"
    await host_api_call(peer.pool, "host_api_start",
                        {"job_id": job, "kind": KIND, "actor": actor}, {"action": "create"})
    client = cast(AsyncKindClient, client_for(KIND, peer.http, peer.settings))
    task_id = await client.create(REQUEST)
    await host_api_call(peer.pool, "host_api_task",
                        {"job_id": job, "task_id": task_id, "actor": actor}, {"ok": True})
    done = await polled(client, task_id)
    fetch = media_fetch_for(KIND, peer.settings)
    stored = await stored_media(peer, sessions.session(fetch.policy), str(job),
                                done.media_urls)
    await host_api_call(peer.pool, "host_api_succeeded", {
        "job_id": job, "actor": actor,
        "media": _json([{"key": o.key, "url": o.uri, "content_type": o.content_type,
                         "size": o.size} for o in stored])},
        {"ok": True, "settlement": "settled"})


def _json(value: object) -> str:
    return msgspec.json.encode(value).decode()


class NodeHost:
    """:data:`NODE_HOST`, started once: :meth:`round` runs jobs through it."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    @asynccontextmanager
    async def started(cls, url: str, settings: ProviderSettings, media: Path
                      ) -> AsyncIterator[NodeHost]:
        env = {**os.environ, "DATABASE_URL": uri(url), "BENCH_MEDIA_DIR": str(media),
               "CALLWARDEN_KIE_URL": settings.kie.base_url,
               "KIE_API_KEY": settings.kie.api_key, "BENCH_POOL_SIZE": str(POOL_SIZE)}
        proc = await asyncio.create_subprocess_exec(
            "node", str(NODE_HOST), env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        host = cls(proc)
        try:
            await host._answer("ready")
            yield host
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def _answer(self, key: str) -> Any:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 600)
        answer = msgspec.json.decode(line) if line else {"error": "node exited"}
        if key not in answer:
            raise RuntimeError(f"{NODE_HOST.name}: {answer.get('error', answer)}")
        return answer[key]

    async def round(self, jobs: list[uuid.UUID], concurrency: int, *,
                    bare: bool = False) -> float:
        """Seconds for the Node host to run ``jobs`` shared by ``concurrency`` calls
        (``bare``: the provider and media work alone, nothing recorded)."""
        assert self.proc.stdin is not None
        start = time.perf_counter()
        self.proc.stdin.write(msgspec.json.encode(
            {"jobs": [str(j) for j in jobs], "concurrency": concurrency, "bare": bare})
            + b"\n")
        await self.proc.stdin.drain()
        if await self._answer("done") != len(jobs):
            raise RuntimeError(f"{NODE_HOST.name} ran a round short")
        return time.perf_counter() - start


# -- what the floors and DBOS's steps all do ----------------------------------------------


async def polled(client: AsyncKindClient, task_id: str) -> Succeeded:
    """Poll ``task_id`` until it succeeds (no wait between polls)."""
    while not isinstance(outcome := await client.poll(task_id), Succeeded):
        if not isinstance(outcome, Running):
            raise RuntimeError(f"task {task_id}: {outcome!r}")
    return outcome


async def stored_media(peer: Peer, session: aiohttp.ClientSession, job: str,
                       urls: Sequence[str]) -> list[StoredObject]:
    """Download each result and store it under its key, as the finalizer does."""
    policy = media_fetch_for(KIND, peer.settings).policy
    stored = []
    for index, url in enumerate(urls):
        got = await download(session, url, policy=policy)
        stored.append(await peer.store.put(media_key(job, index, got.content_type),
                                           got.data, got.content_type))
    return stored


# -- DBOS: create, poll, finalize as three steps of one workflow -------------------------

@dataclass
class Peer:
    http: aiohttp.ClientSession
    settings: ProviderSettings
    store: LocalFolderStore
    pool: Pool


_PEER: list[Peer] = []


def kie() -> tuple[Peer, AsyncKindClient]:
    peer = _PEER[0]
    return peer, cast(AsyncKindClient, client_for(KIND, peer.http, peer.settings))


@DBOS.step()
async def create_step(request: dict[str, Any]) -> str:
    return await kie()[1].create(request)


@DBOS.step()
async def poll_step(task_id: str) -> dict[str, Any]:
    done = await polled(kie()[1], task_id)
    return {"urls": list(done.media_urls), "cost": done.cost}


@DBOS.step()
async def finalize_step(job: str, result: dict[str, Any]) -> None:
    peer = kie()[0]
    stored = await stored_media(peer, peer.http, job, result["urls"])
    async with peer.pool.connection() as conn, conn.transaction():
        await conn.execute(SQL["peer_complete"], {"job_id": job, "cost": result["cost"]})
        await conn.execute(SQL["peer_insert_assets"], {
            "job_id": job, "keys": [o.key for o in stored], "urls": [o.uri for o in stored],
            "types": [o.content_type for o in stored], "sizes": [o.size for o in stored]})


@DBOS.workflow()
async def dbos_lifecycle(job: str) -> None:
    task_id = await create_step(REQUEST)
    result = await poll_step(task_id)
    await finalize_step(job, result)


async def run_dbos(job: uuid.UUID) -> None:
    with SetWorkflowID(str(job)):
        await dbos_lifecycle(str(job))


def sqlalchemy_url(url: str, dbname: str) -> str:
    parts = conninfo_parts(url)
    host = parts.get("host", "127.0.0.1")
    socket = host.startswith("/")
    return URL.create(
        "postgresql", username=parts.get("user"), password=parts.get("password"),
        host=None if socket else host, port=int(parts["port"]) if "port" in parts else None,
        database=dbname, query={"host": host} if socket else {},
    ).render_as_string(hide_password=False)


@asynccontextmanager
async def launched_dbos(db: Db, peer: Peer) -> AsyncIterator[None]:
    config: DBOSConfig = {"name": "callwarden-bench", "log_level": "WARNING",
                          "system_database_url": sqlalchemy_url(db.url, f"{db.name}_dbos")}
    _PEER.append(peer)
    try:
        DBOS(config=config)
        DBOS.launch()
        yield
    finally:
        DBOS.destroy()
        _PEER.clear()
        drop_database(db.admin, f"{db.name}_dbos")


# callwarden, DBOS, floor, raw-SQL floor, host API, Node host, Node floor
Cell = tuple[Measured, Measured, Measured, Measured, Measured, Measured, Measured]


async def cell(db: Db, runner: CallRunner, counted: CallRunner, peer: Peer, sql: Peer,
               host: Peer, node: NodeHost, args: argparse.Namespace, concurrency: int) -> Cell:
    """The seven at one concurrency, in alternating rounds (same machine noise); ``sql``
    and ``host``: the raw-SQL floor's and the host API's peers (each its own media
    folder, as callwarden has); ``node``: the Node host's process; ``counted``: a
    callwarden runner on a counting pool, for the per-call counts (untimed)."""
    ours, theirs, floor, floor3, api, nodes, node_floor = (
        Measured(), Measured(), Measured(), Measured(), Measured(), Measured(), Measured())
    async with MediaSessions() as sessions:
        def run_bare(job: uuid.UUID) -> Awaitable[None]:
            return run_floor(peer, sessions, job)

        def run_sql(job: uuid.UUID) -> Awaitable[None]:
            return run_floor3(sql, sessions, job)

        def run_api(job: uuid.UUID) -> Awaitable[None]:
            return run_host_api(host, sessions, job)

        warm = [await make_jobs(peer.pool, args.warmup) for _ in range(5)]
        await timed(lambda j: run_callwarden(runner, j), warm[0], concurrency)
        # three times as long: its one counted round must not meet a statement some
        # connection has yet to prepare (one more round trip each)
        await timed(lambda j: run_callwarden(counted, j),
                    await make_jobs(peer.pool, 3 * args.warmup), concurrency)
        await timed(run_dbos, warm[1], concurrency)
        await timed(run_bare, [uuid.uuid4() for _ in range(args.warmup)], concurrency)
        await timed(run_sql, warm[2], concurrency)
        await timed(run_api, warm[3], concurrency)
        await node.round(warm[4], concurrency)
        await node.round([uuid.uuid4() for _ in range(args.warmup)], concurrency, bare=True)
        size = max(concurrency, args.jobs // args.rounds)
        for _ in range(max(1, args.jobs // size)):
            jobs = [await make_jobs(peer.pool, size) for _ in range(5)]
            await callwarden_round(db, runner, peer.pool, jobs[0], concurrency, ours)
            theirs.seconds += await timed(run_dbos, jobs[1], concurrency)
            theirs.jobs += size
            floor.seconds += await timed(run_bare, [uuid.uuid4() for _ in range(size)],
                                         concurrency)
            floor.jobs += size
            floor3.seconds += await timed(run_sql, jobs[2], concurrency)
            floor3.jobs += size
            api.seconds += await timed(run_api, jobs[3], concurrency)
            api.jobs += size
            nodes.seconds += await node.round(jobs[4], concurrency)
            nodes.jobs += size
            node_floor.seconds += await node.round([uuid.uuid4() for _ in range(size)],
                                                   concurrency, bare=True)
            node_floor.jobs += size
            if not all([await all_completed(peer.pool, j) for j in jobs]):
                raise RuntimeError("a job was not completed")
        await counted_round(counted, await make_jobs(peer.pool, size), concurrency, ours)
    return ours, theirs, floor, floor3, api, nodes, node_floor


async def measure(url: str, args: argparse.Namespace) -> dict[int, Cell]:
    db = Db(url=url, admin=make_conninfo(url, dbname="postgres"),
            name=conninfo_parts(url)["dbname"])
    with tempfile.TemporaryDirectory(prefix="cw-bench-media-") as tmp:
        async with (running_simulator() as sim, aiohttp.ClientSession() as http,
                    counting_pool(db.url) as counting,
                    open_pool(db.url, min_size=POOL_SIZE, max_size=POOL_SIZE) as pool,
                    open_pool(db.url, min_size=POOL_SIZE, max_size=POOL_SIZE) as peer_pool):
            peer = Peer(http, sim.settings, LocalFolderStore(Path(tmp, "dbos")), peer_pool)
            sql = replace(peer, store=LocalFolderStore(Path(tmp, "floor3")))
            host = replace(peer, store=LocalFolderStore(Path(tmp, "host-api")))
            async with make_runner(pool, http, sim.settings, Path(tmp, "cw")) as runner, \
                    make_runner(counting, http, sim.settings, Path(tmp, "cw-counted")) \
                    as counted, launched_dbos(db, peer), \
                    NodeHost.started(db.url, sim.settings, Path(tmp, "node")) as node:
                return {c: await cell(db, runner, counted, peer, sql, host, node, args, c)
                        for c in (1, 8)}


def report(console: Console, results: dict[int, Cell]) -> None:
    jobs = results[1][0].jobs
    table = Table(title=f"async call lifecycles per second ({jobs} jobs per system and cell, "
                        "alternating rounds)")
    for col in ("", "c=1", "c=8"):
        table.add_column(col, justify="right")
    rate = {c: tuple(m.jobs / m.seconds for m in results[c]) for c in (1, 8)}
    table.add_row("callwarden", *(f"{rate[c][0]:,.0f}" for c in (1, 8)))
    table.add_row("DBOS (3 steps)", *(f"{rate[c][1]:,.0f}" for c in (1, 8)))
    table.add_row("raw-SQL floor: the same three commits, bare statements",
                  *(f"{rate[c][3]:,.0f}" for c in (1, 8)))
    table.add_row("host API: the same three commits, callwarden's SQL functions",
                  *(f"{rate[c][4]:,.0f}" for c in (1, 8)))
    table.add_row("Node host: the host API through clients/node's runTask",
                  *(f"{rate[c][5]:,.0f}" for c in (1, 8)))
    table.add_row("Node floor: the Node host's provider + media work alone",
                  *(f"{rate[c][6]:,.0f}" for c in (1, 8)))
    table.add_row("floor: provider + media alone, no database",
                  *(f"{rate[c][2]:,.0f}" for c in (1, 8)))
    table.add_row("ratio (goal: 3x at c=1, 4x at c=8)",
                  *(f"{rate[c][0] / rate[c][1]:.2f}x" for c in (1, 8)))
    table.add_row("  with no engine code (raw-SQL floor / DBOS)",
                  *(f"{rate[c][3] / rate[c][1]:.2f}x" for c in (1, 8)))
    table.add_row("  the most any engine could show (floor / DBOS)",
                  *(f"{rate[c][2] / rate[c][1]:.2f}x" for c in (1, 8)))
    table.add_row("callwarden / raw-SQL floor",
                  *(f"{rate[c][0] / rate[c][3]:.2f}x" for c in (1, 8)))
    table.add_row("host API / raw-SQL floor",
                  *(f"{rate[c][4] / rate[c][3]:.2f}x" for c in (1, 8)))
    table.add_row("Node host / raw-SQL floor",
                  *(f"{rate[c][5] / rate[c][3]:.2f}x" for c in (1, 8)))
    table.add_row("Node host / Node floor (raw-SQL floor / floor, the same in Python)",
                  *(f"{rate[c][5] / rate[c][6]:.2f}x ({rate[c][3] / rate[c][2]:.2f}x)"
                    for c in (1, 8)))
    ours = {c: results[c][0] for c in (1, 8)}
    table.add_row("callwarden transactions/call (goal <= 3)",
                  *(f"{ours[c].per_call(ours[c].xacts):.2f}" for c in (1, 8)))
    table.add_row("  the same, counted by the client",
                  *(f"{ours[c].per_counted_call(ours[c].client_xacts):.2f}" for c in (1, 8)))
    table.add_row("callwarden round trips/call",
                  *(f"{ours[c].per_counted_call(ours[c].round_trips):.2f}" for c in (1, 8)))
    for key in sorted(set(ours[1].statements) | set(ours[8].statements)):
        table.add_row(f"  statement {key}", *(
            f"{ours[c].per_counted_call(ours[c].statements[key]):.2f}" for c in (1, 8)))
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=300, help="jobs per system and concurrency")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per cell")
    ap.add_argument("--warmup", type=int, default=48,
                    help="untimed jobs per system before each cell (>= 5 per pooled "
                         "connection, so psycopg has prepared every statement)")
    args = ap.parse_args()
    with fresh_database("bench_lifecycle") as url:
        results = asyncio.run(measure(url, args))
    report(Console(), results)


if __name__ == "__main__":
    main()
