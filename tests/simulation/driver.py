"""The deterministic simulation (VOPR-style): one seed -> one schedule of the real actors.

A schedule: a few jobs the host creates (one or two reservations each); the real
:class:`CallRunner` (with its :class:`Finalizer`), two real :class:`Reconciler` s
(``reconcile_once``: claim, fold-of-log candidate, the pure decision, act, renew/park/
release) and the real webhook :class:`Receiver` (signed Replicate deliveries, verified
and parsed by the real scheme, then ``Receiver.deliver``) run against the provider
simulator (real HTTP on 127.0.0.1, so the real provider clients run) and a real Postgres
database (:class:`PostgresDatabase`).

Determinism: exactly one actor runs at a time. Every store operation and every actor
``sleep`` is a *gate* (:class:`Scheduler.gate`): the actor parks there and the seeded
scheduler picks which parked actor moves next — or crashes it there (:class:`Crashed`, a
``BaseException`` no actor code catches: the coroutine simply stops, as a process kill
would stop it, leaving its claims and leases behind). Time is :class:`SimClock`, shared
by the store, every actor and the simulator, and moves only when an actor sleeps or the
scheduler ticks it; nothing reads real time. Faults are seeded too: create/poll errors
(5xx, 429, reset, a request answered after the client gave up), webhook drops and
duplicates, and host writes (cancel, complete + commit, fail + refund, a second
reservation, the flip to processing).

After every step, and at the horizon, :class:`Checker` checks the invariants
(:data:`INVARIANTS`); a violation raises :class:`Violation` with the seed, the
invariant, the step trace and the command that replays it.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import random
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, NoReturn

import aiohttp
import msgspec

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallRunner
from callwarden.database.port import Before, ClaimRequest, Row, SlowedDown, transition_via
from callwarden.database.postgres import PostgresDatabase
from callwarden.database.write import AppendResult, Decide, as_run
from callwarden.events.types import Event, StoredMedia
from callwarden.projections.fold import CallProjection, fold
from callwarden.projections.verify import compare, compare_settlement
from callwarden.providers.base import RetryPolicy
from callwarden.providers.outcomes import Usage
from callwarden.providers.registry import WEBHOOKS, media_url_test
from callwarden.providers.replicate.webhook import replicate_sign
from callwarden.providers.simulator import replicate as sim_replicate
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.simulator.model import Fault, FaultKind
from callwarden.providers.storage import ObjectNotFound, StoredObject
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from callwarden.service.webhooks import Receiver, Reply, WebhookConfig
from tests.simulation.host import Host, SimClock

__all__ = ["INVARIANTS", "Crashed", "Outcome", "Schedule", "Violation", "replay_commands"]

KIND = "replicate-prediction"
INVARIANTS = {
    "reservation_once": "no reservation moved twice, from a non-reserved status, or deleted",
    "charged": "a commit charges min(cost, reserved) across the job's rows (what the host "
               "committed itself counted, never charged again); a refund 0",
    "no_leak": "a call committed or refunded by callwarden leaves no reservation reserved",
    "one_create": "at most one upstream create per job (the simulator's journal)",
    "host_wins": "a status the host ended a job with is never overwritten",
    "projection": "the row's projection equals the fold of its log (and its settlement)",
    "terminal": "after the horizon every call is terminal",
    "crash": "an actor failed with an unexpected exception",
}
log = logging.getLogger("callwarden.simulation")
ACTOR: contextvars.ContextVar[str] = contextvars.ContextVar("sim_actor", default="?")


class Crashed(BaseException):
    """An actor killed at a gate (a process kill: no actor code catches it)."""


class Violation(AssertionError):
    def __init__(self, seed: int, invariant: str, detail: str, trace: Sequence[str]) -> None:
        self.seed, self.invariant, self.detail, self.trace = seed, invariant, detail, trace
        lines = [f"seed {seed}: invariant {invariant!r} violated "
                 f"({INVARIANTS.get(invariant, '')}): {detail}", "trace (last 60 steps):",
                 *("  " + t for t in trace[-60:]), "replay:",
                 *("  " + c for c in replay_commands(seed))]
        super().__init__("\n".join(lines))


def replay_commands(seed: int) -> list[str]:
    return [f"python -m tests.simulation --seed {seed}"]


# -- the scheduler --------------------------------------------------------------------------

class Scheduler:
    """Token passing: at most one actor runs; the others are parked at a gate."""

    def __init__(self, rng: random.Random, clock: SimClock) -> None:
        self.rng, self.clock = rng, clock
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.parked: dict[str, tuple[asyncio.Future[None], str]] = {}
        self.crashed: set[str] = set()
        self.failures: list[tuple[str, BaseException]] = []
        self.changed = asyncio.Event()
        self.trace: list[str] = []

    def note(self, text: str) -> None:
        self.trace.append(f"t+{self.clock.elapsed:>7.0f}s {text}")

    async def gate(self, what: str) -> None:
        name = ACTOR.get()
        if name in self.crashed:
            raise Crashed(name)
        if name not in self.tasks:  # not an actor of ours (never happens in a schedule)
            return
        assert name not in self.parked, f"{name} parked twice"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parked[name] = (fut, what)
        self.changed.set()
        await fut

    async def sleep(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.gate(f"sleep {seconds:g}s")

    def spawn(self, name: str, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        assert name not in self.tasks or self.tasks[name].done()

        async def body() -> None:
            ACTOR.set(name)
            try:
                await make()
            except Crashed:
                pass
            except BaseException as exc:  # reported as a violation
                if isinstance(exc, asyncio.CancelledError):
                    raise
                if isinstance(exc, BaseExceptionGroup):  # a crash inside a TaskGroup
                    _, rest = exc.split((Crashed, asyncio.CancelledError))
                    if rest is None:
                        return
                self.failures.append((name, exc))

        task = asyncio.get_running_loop().create_task(body(), context=contextvars.Context())
        task.add_done_callback(lambda _: self.changed.set())
        self.tasks[name] = task
        self.note(f"spawn {name}")

    def alive(self) -> list[str]:
        return sorted(n for n, t in self.tasks.items() if not t.done())

    async def quiesce(self) -> None:
        """Until every live actor is parked (or done)."""
        while any(n not in self.parked for n in self.alive()):
            self.changed.clear()
            if all(n in self.parked for n in self.alive()):
                break
            await self.changed.wait()

    def release(self, name: str, *, crash: bool = False) -> None:
        fut, what = self.parked.pop(name)
        if crash:
            self.crashed.add(name)
            self.note(f"CRASH {name} at {what}")
            fut.set_exception(Crashed(name))
        else:
            self.note(f"run {name}: {what}")
            fut.set_result(None)

    async def shutdown(self) -> None:
        """Kill every actor still alive (a schedule that stopped at a violation)."""
        for name in list(self.tasks):
            self.crashed.add(name)
        for name in list(self.parked):
            fut, _ = self.parked.pop(name)
            fut.set_exception(Crashed(name))
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def forget_done(self) -> None:
        for n in [n for n, t in self.tasks.items() if t.done()]:
            del self.tasks[n]
            self.crashed.discard(n)


class Gated:
    """A store whose every operation is a gate of the scheduler (then the real one)."""

    def __init__(self, inner: PostgresDatabase, sched: Scheduler,
                 label: Callable[[str], None] = lambda _: None) -> None:
        self.inner, self.sched, self.label = inner, sched, label

    async def load(self, job_id: uuid.UUID) -> CallProjection:
        await self.sched.gate("load")
        return await self.inner.load(job_id)

    async def load_events(self, job_id: uuid.UUID) -> list[Event]:
        await self.sched.gate("load_events")
        return await self.inner.load_events(job_id)

    async def append(self, job_id: uuid.UUID, current: CallProjection,
                     event: Event | Sequence[Event], *,
                     assets: Sequence[StoredMedia] | None = None,
                     before: Before | None = None) -> AppendResult:
        names = "+".join(type(e).__name__ for e in as_run(event))
        await self.sched.gate(f"append {names} (v{current.version})")
        return await self.inner.append(job_id, current, event, assets=assets, before=before)

    async def transition(self, job_id: uuid.UUID, decide: Decide, *,
                         current: CallProjection | None = None,
                         max_conflicts: int = 8) -> AppendResult:
        return await transition_via(self.load, self.append, job_id, decide, current=current,
                                    max_conflicts=max_conflicts)

    async def heartbeat(self, job_id: uuid.UUID, owner: str, progress: int | None) -> bool:
        await self.sched.gate("heartbeat")
        return await self.inner.heartbeat(job_id, owner, progress)

    async def sync_clock(self, clock: Callable[[], datetime]) -> None:
        return None

    async def slow_down(self, kind: str, retry_after_s: float | None) -> SlowedDown | None:
        await self.sched.gate("slow_down")
        return await self.inner.slow_down(kind, retry_after_s)

    async def claim(self, request: ClaimRequest) -> list[Row]:
        await self.sched.gate("claim")
        async with self.inner.pool.connection() as conn:
            cur = await conn.execute("SELECT id, reconcile_owner FROM jobs")
            held = {r["id"]: r["reconcile_owner"] for r in await cur.fetchall()}
        # SQL leaves a batch's order unspecified: by job id, so a seed replays the same.
        rows = sorted(await self.inner.claim(request), key=lambda r: r["id"])
        for r in rows:  # coverage: an expired claim of another reconciler taken over
            if held.get(r["id"]) not in (None, request.owner):
                self.label("lease_takeover")
        return rows

    async def candidate_read(self, job_id: uuid.UUID) -> tuple[Row | None, list[Event]]:
        await self.sched.gate("candidate_read")
        return await self.inner.candidate_read(job_id)

    async def renew(self, job_id: uuid.UUID, owner: str, lease_until: datetime) -> bool:
        await self.sched.gate("renew")
        return await self.inner.renew(job_id, owner, lease_until)

    async def release(self, job_id: uuid.UUID, owner: str) -> None:
        await self.sched.gate("release")
        await self.inner.release(job_id, owner)

    async def park(self, job_id: uuid.UUID, owner: str, until: datetime) -> None:
        await self.sched.gate("park")
        await self.inner.park(job_id, owner, until)

    async def ended_outside(self, since: datetime, batch_size: int) -> list[Row]:
        await self.sched.gate("ended_outside")
        return await self.inner.ended_outside(since, batch_size)

    async def leftovers(self, before: datetime, batch_size: int) -> list[uuid.UUID]:
        await self.sched.gate("leftovers")
        return await self.inner.leftovers(before, batch_size)

    async def find_job(self, kinds: Sequence[str], task_id: str) -> Row | None:
        await self.sched.gate("find_job")
        return await self.inner.find_job(kinds, task_id)

    async def job_by_id(self, job_id: uuid.UUID) -> Row | None:
        await self.sched.gate("job_by_id")
        return await self.inner.job_by_id(job_id)

    async def record_delivery(self, provider: str, delivery_id: str,
                              job_id: uuid.UUID) -> bool:
        await self.sched.gate("record_delivery")
        return await self.inner.record_delivery(provider, delivery_id, job_id)

    async def forget_delivery(self, provider: str, delivery_id: str) -> None:
        await self.sched.gate("forget_delivery")
        await self.inner.forget_delivery(provider, delivery_id)

    async def ping(self) -> None:
        await self.inner.ping()


class MemoryMedia:
    """A media store in memory (the finalizer's puts; no I/O)."""

    def __init__(self) -> None:
        self.objects: dict[str, StoredObject] = {}

    async def put(self, key: str, data: bytes, content_type: str) -> StoredObject:
        obj = StoredObject(key=key, uri=f"mem://{key}", size=len(data),
                           content_type=content_type, sha256="")
        self.objects[key] = obj
        return obj

    async def get(self, key: str) -> bytes:
        raise ObjectNotFound(key)

    async def head(self, key: str) -> StoredObject:
        try:
            return self.objects[key]
        except KeyError:
            raise ObjectNotFound(key) from None

    async def exists(self, key: str) -> bool:
        return key in self.objects


class ChargeTime:
    """Pricing: ``rate`` credits per second of upstream predict time (so a commit's cost
    falls below, at or above the reservation); ``None``: the reservation."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate

    def charge(self, kind: str, usage: Usage, reported_cost: float | None) -> float | None:
        seconds = usage.get("predict_time_s")
        if self.rate is None or seconds is None:
            return None
        return round(float(seconds) * self.rate, 2)


# -- one schedule -----------------------------------------------------------------------------

@dataclass
class Job:
    id: uuid.UUID
    credits: list[Decimal]
    webhooks: bool
    host_status: str | None = None  # the terminal status host code ended it with
    workers: int = 0
    crashed_worker: bool = False


@dataclass
class Outcome:
    seed: int
    steps: int
    jobs: int
    labels: dict[str, int] = field(default_factory=dict)
    digest: str = ""  # of the step trace: the same seed gives the same one every run


class Schedule:
    """One seed's run on ``store``/``host`` (fresh, empty) with the shared simulator."""

    CALLS = CallConfig(poll_interval_s={KIND: 30.0}, poll_budget_s={KIND: 150.0},
                       heartbeat_every_s=10.0, finalize_lease_s=120.0)
    RECONCILE = ReconcileConfig(attempt_cap=6, repoll_interval_s=900.0, concurrency=1,
                                batch_size=50, claim_lease_s=120.0, heartbeat_timeout_s=60.0)

    def __init__(self, seed: int, store: PostgresDatabase, host: Host,
                 rs: RunningSimulator, http: aiohttp.ClientSession, clock: SimClock) -> None:
        self.seed, self.store, self.host, self.rs, self.http = seed, store, host, rs, http
        self.rng = random.Random(seed)
        self.clock = clock
        self.sched = Scheduler(self.rng, clock)
        self.labels: dict[str, int] = {}
        self.db = Gated(store, self.sched, self.label)
        self.media = MemoryMedia()
        self.settings = msgspec.structs.replace(rs.settings, retry=RetryPolicy(
            max_attempts=2, base_delay_s=0.0, max_delay_s=0.0, max_total_s=0.9,
            timeout_s=0.25))
        self.jobs: list[Job] = []
        self.pricing = ChargeTime(self.rng.choice([None, 0.001, 0.01, 0.05, 0.5]))
        sim = rs.sim
        sim.reset()
        sim.rng.seed(seed)
        clock.attach(sim.clock)

    def label(self, name: str) -> None:
        self.labels[name] = self.labels.get(name, 0) + 1

    # -- actors ------------------------------------------------------------------------

    def _runner(self, name: str) -> CallRunner:
        return CallRunner(self.db, self.http, self.settings, self.media, owner=name,
                          clock=self.clock, config=self.CALLS, sleep=self.sched.sleep,
                          pricing=self.pricing, monotonic=self.clock.monotonic)

    def _reconciler(self, name: str) -> Reconciler:
        return Reconciler(self.db, self.http, self.settings, self.media,
                          config=self.RECONCILE, owner=name, clock=self.clock,
                          call_config=self.CALLS, sleep=self.sched.sleep,
                          pricing=self.pricing)

    def _request(self, job: Job) -> dict[str, Any]:
        rng = self.rng
        end = rng.choices(["succeeded", "failed", "stuck", "vanished"], [70, 12, 10, 8])[0]
        steps = [{"phase": "queued", "polls": rng.randint(0, 1)},
                 {"phase": "running", "polls": rng.choice([None, 1, 2, 4]),
                  "seconds": rng.choice([60.0, 600.0, 1800.0])}]
        script: dict[str, Any] = {"steps": steps, "end": end,
                                  "media_count": rng.choice([0, 1, 1, 2]),
                                  "media_ttl_s": rng.choice([None, None, 3600.0, 900.0])}
        return {"version": "sim/model", "input": {"prompt": "x", "job": str(job.id),
                                                  "_sim": script}}

    async def _work(self, job: Job, name: str) -> None:
        out = await self._runner(name).run(job.id, KIND, self._request(job))
        self.sched.note(f"{name} -> {out.result}")

    async def _reconcile(self, name: str) -> None:
        counts = await self._reconciler(name).reconcile_once()
        for key in ("completed", "failed", "swept", "exhausted", "adopted", "cancelled",
                    "host_ended", "lost_race", "recovered"):
            if getattr(counts, key):
                self.label(f"reconciler_{key}")

    async def _webhook(self, job: Job, copies: int) -> None:
        row = await self.store.job_by_id(job.id)
        task_id = row["provider_task_id"] if row else None
        task = self.rs.sim.tasks.get("replicate", task_id) if task_id else None
        if task is None:
            return
        phase = task.peek(self.rs.sim.clock.now())
        doc = sim_replicate.document(self.rs.sim, task, phase, collection="predictions")
        body = msgspec.json.encode(doc)
        scheme = WEBHOOKS["replicate"]
        secret = self.rs.sim.webhook_secrets["replicate"]
        msg_id = f"msg_{self.rng.getrandbits(64):016x}"
        finalizer = self._runner(f"{ACTOR.get()}-fin").finalizer
        receiver = Receiver(self.db, finalizer, WebhookConfig(secrets={"replicate": secret}),
                            clock=self.clock.unix, now=self.clock)
        for _ in range(copies):  # a redelivery: the same id, signed at its own time
            ts = int(self.clock.unix())
            headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts),
                       "webhook-signature": replicate_sign(secret, msg_id, ts, body)}
            replay = scheme.verify(secret, None, headers, body, now=self.clock.unix())
            parsed = scheme.parse(body, is_media=media_url_test(scheme.kinds, self.settings))
            if parsed is None:
                return
            try:
                outcome, _ = await receiver.deliver("replicate", replay, scheme.kinds, parsed)
            except Reply as reply:
                outcome = reply.outcome
            self.label(f"webhook_{outcome}")
            self.sched.note(f"webhook {job.id.hex[:6]} -> {outcome}")
            started = list(receiver.background)
            await receiver.drain(timeout=3600)
            for finalizing in started:  # a background finalize killed at a gate: a crash
                failed = None if finalizing.cancelled() else finalizing.exception()
                if failed is not None:
                    raise failed

    # -- the host ------------------------------------------------------------------------

    async def _host_action(self) -> None:
        job = self.rng.choice(self.jobs)
        if job.host_status is not None:
            return
        action = self.rng.choice(["cancel", "cancel_refund", "complete_commit",
                                  "fail_refund", "reserve_again", "processing"])
        p = await self.store.load(job.id)
        if p.terminal:
            return  # host code ends open jobs; what callwarden ended stays ended
        if action == "reserve_again":
            if p.terminal or p.settled_reservations or len(job.credits) > 1:
                return
            amount = Decimal(self.rng.choice(["1", "3", "4.5"]))
            await self.store.add_reservation(job.id, amount)
            job.credits.append(amount)
        elif action == "processing":
            if (await self.host.row(job.id))["status"] != "pending":
                return
            await self.host.set_status(job.id, "processing")
        else:
            status = {"cancel": "cancelled", "cancel_refund": "cancelled",
                      "complete_commit": "completed", "fail_refund": "failed"}[action]
            await self.host.set_status(job.id, status)
            if action != "cancel":
                await self.host.settle(job.id, "committed" if status == "completed"
                                       else "refunded")
            job.host_status = status
            self.label("host_" + action)
        self.sched.note(f"host {action} {job.id.hex[:6]}")

    def _arm_fault(self) -> None:
        rng = self.rng
        route = rng.choice(["create", "poll", "poll"])
        kind: FaultKind = rng.choice(["http_status", "http_status", "rate_limit", "reset",
                                      "malformed_json", "hang"])
        fault = Fault(kind=kind, status=rng.choice([500, 502, 503]), hang_s=0.3, retry_after=0.0,
                      times=rng.randint(1, 2))
        if kind == "hang" and rng.random() < 0.9:
            return  # a hang costs real time (the client's timeout): keep them rare
        self.rs.sim.faults.arm("replicate", route, fault)
        self.sched.note(f"fault {route} {kind}")
        self.label(f"fault_{route}_{kind}")

    # -- the run -------------------------------------------------------------------------

    async def run(self) -> Outcome:
        try:
            return await self._run()
        finally:
            await self.sched.shutdown()

    async def _run(self) -> Outcome:
        rng, sched = self.rng, self.sched
        for _ in range(rng.randint(1, 3)):
            job = Job(id=uuid.UUID(int=rng.getrandbits(128), version=4),
                      credits=[Decimal(rng.choice(["5", "2", "10"]))],
                      webhooks=rng.random() < 0.5)
            if rng.random() < 0.25:
                job.credits.append(Decimal(rng.choice(["1", "3"])))
            await self.store.create_job(job.id, credits=job.credits[0])
            for more in job.credits[1:]:
                await self.store.add_reservation(job.id, more)
            self.jobs.append(job)
        for job in self.jobs:  # only now: a spawned actor runs at the next real await
            self._spawn_worker(job)
        checker = Checker(self)
        steps = rng.randint(20, 80)
        for step in range(steps):
            await sched.quiesce()
            await checker.check(step)
            await self._step(crash_p=0.06)
        # The horizon: no more faults, crashes or host writes; every actor runs out.
        self.rs.sim.faults.clear()
        for _ in range(5000):
            await sched.quiesce()
            parked = sorted(sched.parked)
            if not parked:
                break
            sched.release(rng.choice(parked))
        horizon = self.RECONCILE.stale.threshold_for(KIND) + (
            self.RECONCILE.attempt_cap + 1) * self.RECONCILE.repoll_interval_s
        for n in range(60):
            await sched.quiesce()
            await checker.check(steps + n)
            if await checker.all_terminal():
                break
            self.clock.advance(horizon / 4)
            sched.forget_done()
            sched.spawn("rfinal", lambda: self._reconcile("rfinal"))
            for _ in range(5000):
                await sched.quiesce()
                if not sched.parked:
                    break
                sched.release(sorted(sched.parked)[0])
        await sched.quiesce()
        await checker.check(steps + 60, final=True)
        digest = hashlib.sha256("\n".join(sched.trace).encode()).hexdigest()[:16]
        return Outcome(seed=self.seed, steps=len(sched.trace), jobs=len(self.jobs),
                       labels=self.labels, digest=digest)

    def _spawn_worker(self, job: Job) -> None:
        job.workers += 1
        name = f"w{self.jobs.index(job)}.{job.workers}"
        self.sched.spawn(name, lambda: self._work(job, name))

    async def _step(self, crash_p: float) -> None:
        rng, sched = self.rng, self.sched
        sched.forget_done()
        r = rng.random()
        parked = sorted(sched.parked)
        if r < 0.08 or (not parked and r < 0.5):
            seconds = rng.choice([1, 5, 30, 60, 300, 900, 1500])
            self.clock.advance(seconds)
            sched.note(f"tick {seconds}s")
        elif r < 0.13:
            await self._host_action()
        elif r < 0.25:
            name = rng.choice(["r1", "r2"])
            if name not in sched.tasks:
                sched.spawn(name, lambda: self._reconcile(name))
        elif r < 0.30:
            job = rng.choice(self.jobs)
            if job.webhooks:
                name = f"wh{self.jobs.index(job)}.{rng.getrandbits(16)}"
                copies = rng.choice([1, 1, 2, 3])
                sched.spawn(name, lambda: self._webhook(job, copies))
        elif r < 0.33:
            job = rng.choice(self.jobs)  # the queue redelivers a job whose worker died
            if job.crashed_worker or rng.random() < 0.2:
                job.crashed_worker = False
                self._spawn_worker(job)
                self.label("redelivery")
        elif r < 0.37:
            self._arm_fault()
        elif parked:
            name = rng.choice(parked)
            crash = rng.random() < crash_p
            if crash:
                self.label("crash")
                index = name[1:].split(".")[0]
                if name.startswith("w") and not name.startswith("wh") and index.isdigit():
                    self.jobs[int(index)].crashed_worker = True
            sched.release(name, crash=crash)


class Checker:
    """The invariants, read from the store after each step."""

    def __init__(self, s: Schedule) -> None:
        self.s = s

    def fail(self, invariant: str, detail: str) -> NoReturn:
        raise Violation(self.s.seed, invariant, detail, self.s.sched.trace)

    async def stored(self, job_id: uuid.UUID) -> CallProjection:
        return await self.s.store.load_stored(job_id)

    def fold(self, job_id: uuid.UUID, events: list[Event]) -> CallProjection:
        try:
            return fold(events)
        except Exception as exc:  # an illegal history: the store let it in
            self.fail("projection", f"job {job_id}: the log does not replay: {exc}")

    async def all_terminal(self) -> bool:
        for job in self.s.jobs:
            events = await self.s.store.load_events(job.id)
            if events and not self.fold(job.id, events).terminal:
                return False
        return True

    async def check(self, step: int, *, final: bool = False) -> None:
        s = self.s
        for name, exc in s.sched.failures:
            self.fail("crash", f"{name}: {type(exc).__name__}: {exc}")
        moves: dict[int, list[tuple[str | None, str | None]]] = {}
        for row_id, old, new in await s.host.audit():
            moves.setdefault(row_id, []).append((old, new))
        for row_id, seq in moves.items():
            if seq[0] != (None, "reserved") or len(seq) > 2 or (
                    len(seq) == 2 and (seq[1][0] != "reserved"
                                       or seq[1][1] not in ("committed", "refunded"))):
                self.fail("reservation_once", f"usage_logs row {row_id}: {seq}")
        creates: dict[str, int] = {}
        for entry in s.rs.sim.journal.entries("replicate", "create"):
            if entry.fault not in (None, "hang", "malformed_json"):
                continue  # refused before the handler ran: no task was created
            job_key = msgspec.json.decode(entry.body).get("input", {}).get("job", "?")
            creates[job_key] = creates.get(job_key, 0) + 1
        for job_key, n in creates.items():
            if n > 1:
                self.fail("one_create", f"job {job_key}: {n} creates")
        for job in s.jobs:
            await self.check_job(job, final)

    async def check_job(self, job: Job, final: bool) -> None:
        s = self.s
        row = await s.host.row(job.id)
        if job.host_status is not None and row["status"] != job.host_status:
            self.fail("host_wins", f"job {job.id}: host wrote {job.host_status!r}, "
                                   f"the row says {row['status']!r}")
        events = await s.store.load_events(job.id)
        if not events:
            return
        folded = self.fold(job.id, events)
        stored = await self.stored(job.id)
        mismatches = compare(job.id, stored, folded)
        rows = await s.host.reservations(job.id)
        mismatches += compare_settlement(job.id, [r[1] for r in rows], folded,
                                         [r[4] for r in rows])
        if mismatches:
            self.fail("projection", f"job {job.id}: {mismatches}")
        if final and not folded.terminal:
            self.fail("terminal", f"job {job.id} is {folded.state} after the horizon")
        if not folded.terminal:
            return
        if final:
            s.label(f"end_{folded.state.value if folded.state else None}_{folded.settlement}")
        ours = [r for r in rows if r[4] is not None]
        if folded.settlement in ("committed", "refunded") and any(
                r[1] == "reserved" for r in rows):
            self.fail("no_leak", f"job {job.id}: {folded.settlement}, rows {rows}")
        if folded.settlement == "committed":
            reserved = sum((r[2] for r in ours), Decimal(0))
            host = sum((r[3] if r[3] is not None else r[2] for r in rows
                        if r[4] is None and r[1] == "committed"), Decimal(0))
            cost = (Decimal(f"{max(folded.provider_cost, 0.0):.15g}") - host
                    if folded.provider_cost is not None else reserved)
            charged = sum((r[3] or Decimal(0) for r in ours), Decimal(0))
            if charged != min(max(cost, Decimal(0)), reserved) or any(
                    (r[3] or 0) > r[2] or (r[3] or 0) < 0 for r in ours):
                self.fail("charged", f"job {job.id}: cost {cost}, rows {rows}")
            if len(ours) > 1 and final:
                s.label("commit_two_reservations")
        elif folded.settlement == "refunded" and any(r[3] != 0 for r in ours):
            self.fail("charged", f"job {job.id}: refunded but charged, rows {rows}")

