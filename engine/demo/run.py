"""``callwarden demo``: killed workers' jobs recovered, with no credit lost.

On real parts: a fresh database (embedded Postgres, or ``DATABASE_URL``), the provider
simulator on 127.0.0.1 with faults armed, real worker processes killed with SIGKILL at
random and restarted, and the reconciler with thresholds scaled down so the demo ends in
about a minute. The verdict is computed with SQL (:mod:`callwarden.demo.summary`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web
from psycopg.rows import DictRow

from callwarden.calls.config import CallConfig
from callwarden.calls.finalize import Finalizer
from callwarden.calls.identity import incarnation
from callwarden.database.boundary import connection, transaction
from callwarden.database.db import Conn, Pool, open_pool
from callwarden.database.jobs import create_job
from callwarden.database.migrate import migrate
from callwarden.database.outage import Outage, until_up
from callwarden.database.write import execute
from callwarden.demo.fleet import Fleet, WorkerFleet
from callwarden.demo.lost import LostMessages
from callwarden.demo.queues import QueueFleet, call_env, job_specs, queue_fleet
from callwarden.demo.report import Sample
from callwarden.demo.summary import DemoSummary, install_audit, summarize
from callwarden.demo.workload import DEMO_PRICING, PlannedJob, plan_jobs
from callwarden.errors import DatabaseUnavailable
from callwarden.providers.kinds import KINDS
from callwarden.providers.outcomes import PollOutcome
from callwarden.providers.registry import poll_task
from callwarden.providers.simulator.core import RunningSimulator, Simulator, running_simulator
from callwarden.providers.simulator.model import Fault
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.claims import JobSpec
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from callwarden.service.app import ServiceConfig, build_webhook_app, runner
from callwarden.service.webhooks import WebhookConfig

__all__ = ["DEMO_RECONCILE", "Chaos", "DemoOptions", "DemoRun", "Tick", "run_demo"]

# Thresholds scaled from minutes to seconds; still validated like a production config. A
# job still waiting in the queue has no call and was created after the call columns were
# installed: it is the host's, never a legacy row, whatever the legacy threshold.
DEMO_RECONCILE = ReconcileConfig(
    thresholds_s={k: 4.0 for k in KINDS}, scan_interval_s=0.5, repoll_interval_s=1.0,
    attempt_cap=8, heartbeat_timeout_s=2.0, legacy_threshold_s=10.0, claim_lease_s=5.0,
    url_buffer_s=60.0, headroom_s=2.0)
DEMO_CALLS = CallConfig(finalize_lease_s=5.0, heartbeat_every_s=0.5, media_timeout_s=2.0,
                        store_timeout_s=1.0, lease_margin_s=1.0)
PROVIDERS = ("kie", "replicate", "elevenlabs", "anthropic")
# Callback retries come on the providers' own schedules (KIE 1, 5, 15 minutes; Replicate
# 5, 15, 40 seconds), compressed 50 times: a retried KIE callback lands 1.2, 6 and 18 s
# later, after the reconciler's 4 s threshold, so late callbacks race its recovery.
WEBHOOK_SCHEDULE_SCALE = 0.02
log = logging.getLogger("callwarden.demo")


class Tick(msgspec.Struct, kw_only=True):
    """What the live view shows at ``t`` seconds."""

    t: float
    states: dict[str, int]
    kills: int
    recovered: int
    restarts: int = 0
    cuts: int = 0
    database_down: bool = False


OnTick = Callable[[Tick], None]
Restart = Callable[[], None]


class DemoOptions(msgspec.Struct, kw_only=True):
    """``chaos``: also restart the database (immediate mode, when the demo has a
    ``restart`` handle on it) and cut every connection, alternately, every
    ``chaos_every_s`` (jittered) while the jobs run. ``queue``: run the jobs on Celery or
    arq workers over Redis (:mod:`callwarden.demo.queues`) instead of the reference queue."""

    jobs: int = 140
    workers: int = 3
    kill_rate: float = 0.5
    seed: int = 7
    duration: float = 100.0
    chaos: bool = False
    chaos_every_s: float = 6.0
    queue: str | None = None


class Chaos:
    """The database faults of ``--chaos``: a restart (``restart``: blocking, run in a
    thread) and a cut of every connection, alternately."""

    def __init__(self, pool: Pool, outage: Outage, restart: Restart | None) -> None:
        self.pool, self.outage, self.restart = pool, outage, restart
        self.restarts = self.cuts = 0

    async def _cut(self) -> None:
        async def cut() -> int:
            async with connection(self.pool) as conn:
                return int((await execute(conn, "demo_cut_connections", {}))[0]["n"])
        cut_now = await until_up(cut, self.outage)
        self.cuts += 1
        log.warning("chaos: cut %d connections", cut_now)

    async def run(self, every_s: float, rng: random.Random, stop: asyncio.Event) -> None:
        restart_next = self.restart is not None
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s * rng.uniform(0.6, 1.4))
                return
            if restart_next and self.restart is not None:
                log.warning("chaos: restarting the database (immediate mode)")
                await asyncio.to_thread(self.restart)
                self.restarts += 1
            else:
                await self._cut()
            restart_next = self.restart is not None and not restart_next


class DemoRun(msgspec.Struct, kw_only=True):
    summary: DemoSummary
    samples: list[Sample]
    latencies: list[tuple[float, bool]]
    kills: int
    seconds: float


def arm_faults(sim: Simulator) -> None:
    """Provider trouble: rate limits (HTTP and in-body), 5xx bursts, a hung request."""
    sim.faults.arm("kie", "create", Fault(kind="rate_limit_in_body", times=3))
    sim.faults.arm("kie", "poll", Fault(kind="http_status", status=500, times=4))
    sim.faults.arm("replicate", "poll", Fault(kind="http_status", status=503, times=4))
    sim.faults.arm("replicate", "create", Fault(kind="rate_limit", retry_after=1.0, times=2))
    sim.faults.arm("elevenlabs", "poll", Fault(kind="malformed_json", times=2))
    sim.faults.arm("anthropic", "call", Fault(kind="http_status", status=529, times=2))


def worker_env(db_url: str, rs: RunningSimulator, media_dir: Path,
               service_url: str, pricing_file: Path) -> dict[str, str]:
    env = {"DATABASE_URL": db_url, "CALLWARDEN_MEDIA_DIR": str(media_dir),
           "CALLWARDEN_CALLBACK_BASE_URL": service_url,
           "CALLWARDEN_PRICING_FILE": str(pricing_file)}
    for p in PROVIDERS:
        env[f"CALLWARDEN_{p.upper()}_URL"] = rs.url(p).rstrip("/")
    env.update(KIE_API_KEY=rs.sim.api_key, REPLICATE_API_TOKEN=rs.sim.api_key,
               ELEVENLABS_API_KEY=rs.sim.api_key, ANTHROPIC_API_KEY=rs.sim.api_key)
    return env


async def _enqueue(conn: Conn, job: PlannedJob) -> uuid.UUID:
    job_id = uuid.uuid4()
    workflow = None
    if job.in_workflow:
        workflow = uuid.uuid4()
        await execute(conn, "demo_workflow", {"id": workflow})
    request = {**job.request, "_job_ref": str(job_id)}
    return await create_job(
        conn, job_id=job_id, credits=job.credits, workflow_execution_id=workflow,
        node_id="node-1" if workflow else None, job_type=KINDS[job.kind].family,
        input_data={"provider_kind": job.kind, "request": request,
                    "operation": job.operation})


def creates_per_job(sim: Simulator, job_ids: list[uuid.UUID]) -> dict[str, int]:
    """Upstream creates (and sync calls) per job, from the simulator's journal: requests
    the provider processed (one rejected with 429/5xx before processing created nothing)."""
    counts = {str(j): 0 for j in job_ids}
    for e in sim.journal.entries():
        if e.method != "POST" or e.route.startswith("cancel") or not e.processed:
            continue
        for job in counts:
            if job.encode() in e.body:
                counts[job] += 1
                break
    return counts


@contextlib.asynccontextmanager
async def _service(pool: Pool, http: aiohttp.ClientSession, rs: RunningSimulator,
                   media: Path) -> AsyncIterator[str]:
    """``callwarden serve``'s webhook app on 127.0.0.1 (webhooks: the happy path); yields
    its URL."""
    finalizer = Finalizer(pool, LocalFolderStore(media), rs.settings,
                          owner=incarnation("webhook"), config=DEMO_CALLS,
                          pricing=DEMO_PRICING)
    config = ServiceConfig(webhooks=WebhookConfig(
        secrets={"replicate": rs.sim.webhook_secrets["replicate"]}))
    async def poll(kind: str, task_id: str, created_at: float | None) -> PollOutcome:
        return await poll_task(kind, task_id, http, rs.settings, created_at=created_at)

    served = runner(build_webhook_app(pool, finalizer, config, poll=poll))
    await served.setup()
    site = web.TCPSite(served, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{served.addresses[0][1]}"
    finally:
        await served.cleanup()
        await finalizer.aclose()


async def _states(pool: Pool) -> tuple[dict[str, int], int]:
    # A short wait for a connection: the live view shows an outage instead of freezing.
    async with connection(pool, wait_s=2.0) as conn:
        states = {r["state"]: r["n"] for r in await execute(conn, "demo_states", {})}
        recovered = (await execute(conn, "demo_recovered", {}))[0]["n"]
    return states, recovered


async def _watch(pool: Pool, fleet: Fleet, deadline: float, on_tick: OnTick,
                 samples: list[Sample], chaos: Chaos) -> None:
    start = time.monotonic()
    terminal = {"completed", "failed", "swept", "exhausted", "cancelled"}
    states: dict[str, int] = {}
    recovered = 0
    while True:
        try:
            states, recovered = await _states(pool)
            chaos.outage.up()
            pause = 0.5  # the live view's refresh period, not synchronisation
        except DatabaseUnavailable as exc:  # the view keeps its last figures meanwhile
            pause = chaos.outage.down(exc)
        t = time.monotonic() - start
        if not chaos.outage.is_down:
            samples.append(Sample(t, states))
        on_tick(Tick(t=t, states=states, kills=fleet.kills, recovered=recovered,
                     restarts=chaos.restarts, cuts=chaos.cuts,
                     database_down=chaos.outage.is_down))
        if (states and all(s in terminal for s in states)
                and not chaos.outage.is_down) or time.monotonic() > deadline:
            return
        await asyncio.sleep(pause)


async def _setup(pool: Pool, opts: DemoOptions, outage: Outage) -> list[uuid.UUID]:
    """Schema, the settlement audit and the planned jobs (enqueued), retried through an
    outage: the first two are idempotent, and the jobs go in one transaction — so an
    attempt that fails wrote none of them, and one whose commit was lost with its
    connection wrote all of them (the retry finds them and enqueues nothing)."""
    async def schema() -> None:
        async with connection(pool) as conn:
            await migrate(conn)
            await install_audit(conn)

    async def enqueue() -> list[uuid.UUID]:
        async with connection(pool) as conn:
            known = [r["id"] for r in await execute(conn, "demo_job_ids", {})]
            if known:  # an earlier attempt committed: the database is the demo's own
                return known
            async with transaction(conn):
                return [await _enqueue(conn, j) for j in plan_jobs(opts.jobs, opts.seed)]

    await until_up(schema, outage)
    return await until_up(enqueue, outage)


def _lost_messages(pool: Pool, fleet: Fleet) -> LostMessages | None:
    """Celery's watch for the messages its broker lost (:mod:`callwarden.demo.lost`)."""
    if not isinstance(fleet, QueueFleet):
        return None

    async def unstarted() -> set[str] | None:
        try:
            async with connection(pool, wait_s=2.0) as conn:
                return {r["id"] for r in await execute(conn, "demo_unstarted", {})}
        except DatabaseUnavailable:
            return None  # the next scan tries again

    return fleet.lost_messages(unstarted)


def _background(opts: DemoOptions, reconciler: Reconciler, fleet: Fleet, chaos: Chaos,
                lost: LostMessages | None, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """The reconciler's loop, the worker killer, (``--chaos``) the database faults and
    (Celery) the watch for lost messages."""
    tasks = [asyncio.create_task(reconciler.run(stop)),
             asyncio.create_task(fleet.kill_randomly(opts.kill_rate,
                                                     random.Random(opts.seed), stop))]
    if lost is not None:
        tasks.append(asyncio.create_task(lost.run(stop)))
    if opts.chaos:
        tasks.append(asyncio.create_task(chaos.run(opts.chaos_every_s,
                                                   random.Random(opts.seed + 1), stop)))
    return tasks


async def _fleet(opts: DemoOptions, pool: Pool, env: dict[str, str], work_dir: Path,
                 stack: contextlib.AsyncExitStack, outage: Outage) -> Fleet:
    """The reference fleet, or (``opts.queue``) a queue's, its jobs published at start."""
    if opts.queue is None:
        return WorkerFleet(opts.workers, env, work_dir)

    async def specs() -> list[tuple[uuid.UUID, JobSpec]]:
        async with connection(pool) as conn:
            return await job_specs(conn)

    jobs = await until_up(specs, outage)
    return await stack.enter_async_context(queue_fleet(
        opts.queue, opts.workers, {**env, **call_env(DEMO_CALLS)}, work_dir, jobs))


async def _verdict(pool: Pool, creates: dict[str, int], late: int, chaos: Chaos, *,
                   queue: str | None, kills: int, lost: int
                   ) -> tuple[DemoSummary, list[DictRow]]:
    """The summary (with SQL, retried through an outage) and the latencies."""
    async def read() -> tuple[DemoSummary, list[DictRow]]:
        async with connection(pool) as conn:
            return (await summarize(conn, creates, late),
                    await execute(conn, "demo_latencies", {}))
    summary, rows = await until_up(read, chaos.outage)
    return msgspec.structs.replace(
        summary, queue=queue or "reference", workers_killed=kills, messages_lost=lost,
        database_restarts=chaos.restarts, connections_cut=chaos.cuts,
        database_outages=chaos.outage.outages,
        database_down_s=round(chaos.outage.downtime_s, 1)), rows


async def run_demo(opts: DemoOptions, db_url: str, work_dir: Path,
                   on_tick: OnTick, restart: Restart | None = None) -> DemoRun:
    """Run the whole demo against the (empty) database at ``db_url`` (``restart``: how
    to restart that database, for ``opts.chaos``)."""
    started = time.monotonic()
    async with open_pool(db_url, max_size=12, check=True) as pool:
        chaos = Chaos(pool, Outage(log, "demo"), restart)
        job_ids = await _setup(pool, opts, chaos.outage)
        async with running_simulator(seed=opts.seed) as rs, aiohttp.ClientSession() as http, \
                contextlib.AsyncExitStack() as stack:
            arm_faults(rs.sim)
            rs.sim.webhooks.schedule_scale = WEBHOOK_SCHEDULE_SCALE
            pricing_file = work_dir / "pricing.json"
            pricing_file.write_bytes(msgspec.json.encode(DEMO_PRICING))
            media = work_dir / "media"
            service = await stack.enter_async_context(_service(pool, http, rs, media))
            env = worker_env(db_url, rs, media, service, pricing_file)
            fleet = await _fleet(opts, pool, env, work_dir, stack, chaos.outage)
            reconciler = Reconciler(pool, http, rs.settings, LocalFolderStore(media),
                                    config=DEMO_RECONCILE, call_config=DEMO_CALLS,
                                    pricing=DEMO_PRICING)
            stop, samples = asyncio.Event(), list[Sample]()
            lost = _lost_messages(pool, fleet)
            await fleet.start()
            tasks = _background(opts, reconciler, fleet, chaos, lost, stop)
            try:
                await _watch(pool, fleet, started + opts.duration, on_tick, samples, chaos)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                await fleet.stop()
            late = sum(1 for d in rs.sim.webhooks.deliveries
                       if d.attempt > 1 and d.status is not None)
            creates = creates_per_job(rs.sim, job_ids)
        summary, rows = await _verdict(pool, creates, late, chaos, queue=opts.queue,
                                       kills=fleet.kills,
                                       lost=0 if lost is None else lost.count)
    return DemoRun(summary=summary, samples=samples, kills=fleet.kills,
                   latencies=[(r["s"], bool(r["by_reconciler"])) for r in rows],
                   seconds=time.monotonic() - started)
