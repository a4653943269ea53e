"""The real actors under generated schedules, on a real Postgres and the simulator.

Not deciders written for the test: every rule runs callwarden's own code —
``CallRunner.run`` (a worker; against the simulator over HTTP, with a fault armed for that
run: create answered 429, 503 or reset, a create that hangs past the client's timeout
after the provider received it, a refused connection, poll errors), ``Finalizer.finalize``,
``Reconciler.reconcile_once`` (two reconcilers, alone or racing each other and a worker),
signed webhook deliveries POSTed over HTTP to the real receiver (dropped, duplicated,
reordered: the simulator records each delivery with its real body and signature and
this machine decides whether, when and how often it arrives), the admin force-fail
endpoint (with and without the token), crashes at the engine's failpoints (the actor
stops right there), and a **host** that writes ``jobs``/``usage_logs`` with plain SQL:
completes and commits, fails and refunds, cancels, refunds alone, adds a second
reservation, or puts its own upstream task on a row (the seed's columns, which the
reconciler adopts). Time is one logical clock: every actor's ``clock`` and the
simulator's clock (frozen between ticks) move together; a worker's poll ``sleep``
advances it by its poll interval.

What happened is labelled (``hypothesis.event``) and counted; the run fails if the
default profile produced none of a label in :data:`REQUIRED_LABELS`
(``CALLWARDEN_LABELS_FILE=path`` writes the counts as JSON).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import msgspec
from aiohttp import web
from hypothesis import event, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from callwarden.calls import failpoints
from callwarden.calls.config import CallConfig
from callwarden.calls.finalize import Finalizer
from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn, Pool, connect, open_pool
from callwarden.database.jobs import create_job
from callwarden.providers.base import Endpoint, ProviderSettings, RetryPolicy
from callwarden.providers.kinds import KINDS
from callwarden.providers.simulator.core import Fault, RunningSimulator, running_simulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from callwarden.service.app import RECEIVER, ServiceConfig, build_apps
from callwarden.service.webhooks import WebhookConfig
from tests.service import listening
from tests.support.paths import HOST_TERMINAL, HOST_WRITES

KIND, PROVIDER = "replicate-prediction", "replicate"
TOKEN = "machine-admin-token"
POLL_S = 5.0
CALL_CONFIG = CallConfig(finalize_lease_s=60.0, poll_interval_s={KIND: POLL_S},
                         media_timeout_s=5.0, store_timeout_s=5.0)
RECONCILE = ReconcileConfig(thresholds_s=dict.fromkeys(KINDS, 120.0), repoll_interval_s=60.0,
                            attempt_cap=3, claim_lease_s=30.0, heartbeat_timeout_s=60.0,
                            headroom_s=60.0)
TERMINAL = ("completed", "failed", "swept", "exhausted", "cancelled")
HORIZON_STEP_S = 200.0  # past a re-poll interval, a claim lease and a finalize lease

#: Every label a default-profile run must have produced at least once.
REQUIRED_LABELS = (
    "commit", "refund", "two reservations committed", "takeover", "exhausted",
    "host won", "swept", "adopted", "webhook settled", "finalize failed", "admin cancel",
    "crash", "ambiguous create", "worker created", "reconciler recovered",
)
LABELS: Counter[str] = Counter()

AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS usage_audit (usage_id bigint, job_id uuid, op text,
                                        old_status text, new_status text);
CREATE INDEX IF NOT EXISTS usage_audit_job ON usage_audit (job_id);
CREATE OR REPLACE FUNCTION usage_audit_fn() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_audit VALUES (NEW.id, NEW.job_id, 'INSERT', NULL, NEW.status);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO usage_audit VALUES (OLD.id, OLD.job_id, 'DELETE', OLD.status, NULL);
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO usage_audit VALUES (NEW.id, NEW.job_id, 'UPDATE', OLD.status, NEW.status);
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS usage_audit_trg ON usage_logs;
CREATE TRIGGER usage_audit_trg AFTER INSERT OR UPDATE OR DELETE ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION usage_audit_fn();
"""

# One query answers every ledger invariant for a set of jobs.
LEDGER_SQL = """
SELECT j.id, j.status, j.call_state, j.call_version,
  (SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id) AS n_events,
  (SELECT array_agg(type ORDER BY seq) FROM callwarden.call_events e
   WHERE e.job_id = j.id) AS types,
  (SELECT count(*) FROM usage_audit a WHERE a.job_id = j.id AND a.op = 'UPDATE'
     GROUP BY a.usage_id ORDER BY 1 DESC LIMIT 1) AS most_moves,
  (SELECT array_agg(a.op || ':' || coalesce(a.old_status, '-') || '>'
                    || coalesce(a.new_status, '-'))
     FROM usage_audit a WHERE a.job_id = j.id AND (a.op = 'DELETE'
       OR (a.op = 'UPDATE' AND a.old_status <> 'reserved')
       OR (a.op = 'INSERT' AND a.new_status <> 'reserved'))) AS bad_moves,
  (SELECT count(*) FROM usage_logs u WHERE u.job_id = j.id AND u.status = 'reserved')
     AS left_reserved,
  (SELECT json_agg(json_build_object('seq', e.seq, 'cost', e.payload->'cost'))
     FROM callwarden.call_events e WHERE e.job_id = j.id AND e.type = 'Completed') AS completions,
  (SELECT json_agg(json_build_object('seq', u.settled_by_seq, 'status', u.status,
                                     'reserved', u.credits_reserved,
                                     'charged', u.credits_charged))
     FROM usage_logs u WHERE u.job_id = j.id) AS ledger
FROM jobs j WHERE j.id = ANY(%s)
"""


# The host commits one of a job's reservations itself (its own flow charged it) while the
# job stays open: callwarden's commit then counts that charge towards min(cost, reserved).
COMMIT_ONE = (
    "UPDATE usage_logs SET status = 'committed', credits_charged = credits_reserved, "
    "settled_at = now() WHERE id = (SELECT min(u.id) FROM usage_logs u JOIN jobs j ON "
    "j.id = u.job_id WHERE u.job_id = %(job)s AND u.status = 'reserved' "
    "AND j.status IN ('pending', 'processing'))")


class Crash(BaseException):
    """An actor stopped at a failpoint, or in its poll sleep (a kill, a recycle)."""


def _refusing_port(stack: AsyncExitStack) -> int:
    """A port bound but never listening, held for the run: connecting is refused, and no
    other process can take the port meanwhile."""
    sock = stack.enter_context(socket.socket())
    sock.bind(("127.0.0.1", 0))
    return int(sock.getsockname()[1])


class LogicalClock:
    """The one clock of every actor; only :meth:`World.advance` moves it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@dataclass
class World:
    """What outlives one example: the loop, the database, the simulator, the service."""

    loop: asyncio.AbstractEventLoop
    pool: Pool
    conn: Conn
    host: Conn
    http: aiohttp.ClientSession
    sim: RunningSimulator
    service_url: str  # the webhook listener
    operator_url: str  # the operator listener (admin actions)
    app: web.Application
    media: LocalFolderStore
    clock: LogicalClock
    refusing_port: int

    @property
    def refused(self) -> ProviderSettings:
        return msgspec.structs.replace(self.settings, replicate=Endpoint(
            base_url=f"http://127.0.0.1:{self.refusing_port}/replicate", api_key="sim-key"))

    @property
    def settings(self) -> ProviderSettings:
        return msgspec.structs.replace(self.sim.settings, retry=RetryPolicy(
            max_attempts=2, base_delay_s=0.001, max_delay_s=0.002, max_total_s=1.0,
            timeout_s=0.5))

    @property
    def now(self) -> datetime:
        return self.clock.now

    def advance(self, seconds: float) -> None:
        self.clock.now += timedelta(seconds=seconds)
        self.sim.sim.clock.advance(seconds)


class Pricing:
    """The host's price: one credit per second the prediction ran (Replicate's metric);
    ``None`` (charge the reservation) when the answer carries none."""

    def charge(self, kind: str, usage: dict[str, float | str],
               reported_cost: float | None) -> float | None:
        seconds = usage.get("predict_time_s")
        return float(seconds) if isinstance(seconds, (int, float)) else None


PRICING = Pricing()


class Job:
    def __init__(self, job_id: uuid.UUID, script: dict[str, Any]) -> None:
        self.id, self.script = job_id, script

    def request(self) -> dict[str, Any]:
        return {"version": "owner/model",
                "input": {"prompt": str(self.id), "_sim": self.script}}

    def __repr__(self) -> str:
        return f"Job({str(self.id)[:8]}, {self.script})"


STEP_SECONDS = st.sampled_from([0, 5, 30, 300])
SCRIPTS = st.fixed_dictionaries({
    "steps": st.tuples(STEP_SECONDS, STEP_SECONDS).map(lambda s: [
        {"phase": "queued", "seconds": s[0]}, {"phase": "running", "seconds": s[1]}]),
    "end": st.sampled_from(["succeeded", "succeeded", "succeeded", "failed", "stuck",
                            "vanished"]),
    "webhook": st.just({"drop": True}),
}, optional={"media_status": st.sampled_from([404, 503])})
SUCCEEDING = st.fixed_dictionaries({
    "steps": st.tuples(STEP_SECONDS, STEP_SECONDS).filter(lambda s: s != (0, 0)).map(
        lambda s: [{"phase": "queued", "seconds": s[0]}, {"phase": "running", "seconds": s[1]}]),
    "end": st.just("succeeded"),
    "webhook": st.just({"drop": True}),
})
CREATE_FAULTS: dict[str, Fault | None] = {
    "none": None,
    "create 429": Fault(kind="rate_limit", retry_after=1),
    "create 503": Fault(kind="http_status", status=503, times=2),
    "create reset": Fault(kind="reset", times=2),
    "create timeout after sending": Fault(kind="late", hang_s=1.0),
    "poll 503": Fault(kind="http_status", status=503, times=3),
    "poll reset": Fault(kind="reset"),
}
CRASH_POINTS = ("before_create", "after_create", "mid_poll", "after_upstream_result",
                "after_claim", "after_upload", "reconciler_after_claim")


class ActorMachine(RuleBasedStateMachine):
    """Invariants, checked from the database after every step (and at the horizon):

    - no reservation is moved twice, moved from anything but ``reserved``, inserted in
      another status, or deleted (a trigger audits every INSERT, UPDATE and DELETE of
      ``usage_logs``, the host's statements included);
    - a commit by callwarden charges ``min(cost, reserved)`` in total over the
      reservations it settled (the charge the ``Completed`` event carries; the
      reservations when it carries none), and a refund charges nothing;
    - one upstream create per job: the simulator holds at most one task for a job, and
      its journal at most one create request it processed;
    - a terminal call leaves nothing reserved that callwarden settles; terminal states
      are absorbing (state and version never change again);
    - a status the host wrote is never overwritten, and a call the host ended is never
      completed by callwarden after its ``HostEnded``;
    - ``call_version`` is the number of events and the projection columns equal the fold
      of the log (``verify``);
    - after the horizon (every lease, threshold and attempt spent) every call is terminal.
    """

    world: ClassVar[World]
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.known: list[Job] = []
        self.terminal: dict[uuid.UUID, tuple[str, int]] = {}
        self.host_status: dict[uuid.UUID, str] = {}
        self.versions: dict[uuid.UUID, int] = {}
        self.labels: set[str] = set()

    # -- plumbing ---------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.world.loop.run_until_complete(coro)

    def label(self, name: str) -> None:
        self.labels.add(name)

    async def survive(self, *coros: Awaitable[Any]) -> list[Any]:
        """Run actors concurrently; one that crashed simply stopped."""
        results = await asyncio.gather(*coros, return_exceptions=True)
        for r in results:
            if isinstance(r, Crash):
                self.label("crash")
            elif isinstance(r, BaseExceptionGroup):
                _, rest = r.split(Crash)
                if rest is not None:
                    raise rest
                self.label("crash")
            elif isinstance(r, BaseException):
                raise r
        return results

    def sleeper(self, polls: int) -> Callable[[float], Awaitable[None]]:
        """A worker's poll sleep: time passes; after ``polls`` sleeps the worker dies."""
        left = [polls]

        async def sleep(seconds: float) -> None:
            if left[0] <= 0:
                raise Crash("worker killed while polling")
            left[0] -= 1
            self.world.advance(seconds)
            await asyncio.sleep(0)
        return sleep

    def runner(self, name: str, polls: int, refused: bool = False) -> CallRunner:
        w = self.world
        return CallRunner(w.pool, w.http, w.refused if refused else w.settings, w.media,
                          owner=name, clock=w.clock, config=CALL_CONFIG,
                          sleep=self.sleeper(polls), pricing=PRICING,
                          callback_url=lambda job, kind: f"{w.service_url}/webhooks/replicate")

    def reconciler(self, name: str) -> Reconciler:
        w = self.world

        async def no_sleep(_: float) -> None:
            await asyncio.sleep(0)
        return Reconciler(w.pool, w.http, w.settings, w.media, config=RECONCILE,
                          owner=name, clock=w.clock, call_config=CALL_CONFIG,
                          sleep=no_sleep, pricing=PRICING)

    @contextmanager
    def crash_at(self, point: str | None) -> Iterator[None]:
        def crash(name: str) -> None:
            raise Crash(name)
        failpoints.arm(point, action=crash)
        try:
            yield
        finally:
            failpoints.arm(None)

    # -- rules ------------------------------------------------------------------------

    @initialize()
    def a_new_day(self) -> None:
        """Each example starts a day after the last one (its jobs all ended there), on a
        simulator that forgot the last one's tasks, requests and deliveries."""
        self.world.sim.sim.reset()
        self.world.advance(86400)

    @initialize(target=jobs, script=SCRIPTS, credits=st.sampled_from([None, 1, 5, 10, 50]))
    def first_job(self, script: dict[str, Any], credits: int | None) -> Job:
        return self.fresh(script, credits)

    @rule(target=jobs, script=SCRIPTS, credits=st.sampled_from([None, 1, 5, 10, 50]))
    def host_creates_job(self, script: dict[str, Any], credits: int | None) -> Job:
        return self.fresh(script, credits)

    @rule(seconds=st.sampled_from([1, 30, 61, 130, 400]))
    def tick(self, seconds: int) -> None:
        self.world.advance(seconds)

    @rule(job=jobs, fault=st.sampled_from(sorted(CREATE_FAULTS)),
          polls=st.integers(0, 4), crash=st.one_of(st.none(), st.sampled_from(CRASH_POINTS)),
          refused=st.booleans())
    def worker_runs(self, job: Job, fault: str, polls: int, crash: str | None,
                    refused: bool) -> None:
        armed = CREATE_FAULTS[fault]
        if armed is not None:
            route = "poll" if fault.startswith("poll") else "create"
            self.world.sim.sim.faults.arm(PROVIDER, route, armed)
        runner = self.runner(f"worker-{len(self.labels)}", polls,
                             refused=refused and fault == "none")
        with self.crash_at(crash):
            self.run(self.survive(runner.run(job.id, KIND, job.request())))
        self.world.sim.sim.faults.clear()

    @rule(job=jobs, polls=st.integers(0, 3), which=st.sampled_from(["a", "b"]))
    def worker_races_reconciler(self, job: Job, polls: int, which: str) -> None:
        runner = self.runner("worker-retry", polls)
        self.run(self.survive(runner.run(job.id, KIND, job.request()),
                              self.reconciler(f"reconciler-{which}").reconcile_once(
                                  self.world.now)))

    @rule(who=st.sampled_from(["a", "b", "both"]),
          crash=st.one_of(st.none(), st.sampled_from(CRASH_POINTS[4:])))
    def reconcilers_pass(self, who: str, crash: str | None) -> None:
        names = ["a", "b"] if who == "both" else [who]
        with self.crash_at(crash):
            self.run(self.survive(*(self.reconciler(f"reconciler-{n}").reconcile_once(
                self.world.now) for n in names)))

    @rule(job=jobs, crash=st.one_of(st.none(), st.sampled_from(["after_claim",
                                                                 "after_upload"])))
    def finalizer_runs(self, job: Job, crash: str | None) -> None:
        w = self.world
        finalizer = Finalizer(w.pool, w.media, w.settings, owner="finalizer", clock=w.clock,
                              config=CALL_CONFIG, pricing=PRICING)
        with self.crash_at(crash):
            self.run(self.survive(finalizer.finalize(job.id)))

    # -- stories: a fresh job through a sequence that is rare by chance alone ----------

    def fresh(self, script: dict[str, Any], credits: int | None = 10) -> Job:
        """A job the host inserted by SQL, with its reservation (none for ``None``)."""
        job = Job(self.run(create_job(self.world.host, credits=credits)), script)
        self.known.append(job)
        return job

    @rule(target=jobs, script=SUCCEEDING, copies=st.integers(1, 2),
          wait=st.sampled_from([61, 400, 700]))
    def worker_dies_then_provider_calls_back(self, script: dict[str, Any], copies: int,
                                             wait: int) -> Job:
        """A worker killed while polling; later the provider's callback arrives."""
        job = self.fresh(script)
        self.worker_runs(job, "none", 0, None, refused=False)
        self.world.advance(wait)
        self.provider_delivers_webhooks(job, copies, reverse=False)
        return job

    @rule(target=jobs, script=SCRIPTS, wait=st.sampled_from([130, 400, 700]))
    def worker_dies_then_reconciler_recovers(self, script: dict[str, Any], wait: int) -> Job:
        """A worker killed while polling; a reconciler finds the call stale later."""
        job = self.fresh(script)
        self.worker_runs(job, "none", 0, None, refused=False)
        self.world.advance(wait)
        self.reconcilers_pass("a", None)
        return job

    @rule(target=jobs, script=SCRIPTS,
          how=st.sampled_from(["create 503", "create reset", "create timeout after sending",
                               "after_create"]))
    def create_ends_ambiguously_then_reconciler(self, script: dict[str, Any], how: str) -> Job:
        """The worker cannot know whether its create made a task; later a reconciler."""
        job = self.fresh(script)
        crash = how if how == "after_create" else None
        self.worker_runs(job, "none" if crash else how, 4, crash, refused=False)
        self.world.advance(130)
        self.reconcilers_pass("b", None)
        return job

    @rule(target=jobs, script=SCRIPTS, write=st.sampled_from(sorted(HOST_TERMINAL)))
    def host_ends_a_running_call(self, script: dict[str, Any], write: str) -> Job:
        """A worker killed while polling; the host ends the job by SQL meanwhile."""
        job = self.fresh(script)
        self.worker_runs(job, "none", 0, None, refused=False)
        self.host_writes(job, write)
        return job

    @rule(target=jobs, script=SUCCEEDING, wait=st.sampled_from([61, 130]))
    def finalizer_dies_then_another_takes_over(self, script: dict[str, Any],
                                               wait: int) -> Job:
        """A worker killed holding the finalization claim; its lease runs out."""
        job = self.fresh(script)
        self.worker_runs(job, "none", 4, "after_claim", refused=False)
        self.world.advance(wait)
        self.finalizer_runs(job, None)
        return job

    @rule(target=jobs, script=SUCCEEDING)
    def host_commits_one_of_two_then_a_worker_runs(self, script: dict[str, Any]) -> Job:
        """The host settles the first of two reservations itself; the call's commit
        charges the rest so that the job's total is min(cost, reserved)."""
        job = self.fresh(script, 5)
        self.host_writes(job, "second_reservation")
        self.host_writes(job, "commit_one")
        self.worker_runs(job, "none", 4, None, refused=False)
        return job

    @rule(target=jobs, script=SCRIPTS, with_token=st.booleans())
    def admin_force_fails_a_running_call(self, script: dict[str, Any],
                                         with_token: bool) -> Job:
        """A worker killed while polling; an operator force-fails the call."""
        job = self.fresh(script)
        self.worker_runs(job, "none", 0, None, refused=False)
        self.admin_force_fails(job, with_token)
        return job

    @rule(target=jobs, script=SUCCEEDING, credits=st.sampled_from([1, 10]))
    def host_adds_a_reservation_then_a_worker_runs(self, script: dict[str, Any],
                                                   credits: int | None) -> Job:
        job = self.fresh(script, credits)
        self.host_writes(job, "second_reservation")
        self.worker_runs(job, "none", 4, None, refused=False)
        return job

    @rule(target=jobs, script=SCRIPTS, credits=st.sampled_from([None, 5]))
    def host_runs_its_own_task(self, script: dict[str, Any], credits: int | None) -> Job:
        """Host code created the upstream task itself and wrote the seed's columns."""
        job = self.fresh(script, credits)
        self.host_writes(job, "own_task")
        return job

    @rule(job=jobs, copies=st.integers(1, 2), reverse=st.booleans())
    def provider_delivers_webhooks(self, job: Job, copies: int, reverse: bool) -> None:
        self.run(self._deliver(job, copies, reverse))

    async def _deliver(self, job: Job, copies: int, reverse: bool) -> None:
        sim = self.world.sim.sim
        tasks = [t for t in sim.tasks.all(PROVIDER) if t.input.get("prompt") == str(job.id)]
        if not tasks:
            return
        task = tasks[0]
        if task.callback_url and task.peek(sim.clock.now()).name in ("succeeded", "failed"):
            # The simulator's driver records the terminal delivery as it sees the phase:
            # wait for it on the deliveries' condition (another task's may come first).
            while not any(b'"status":"succeeded"' in d.body or b'"status":"failed"' in d.body
                          for d in self._dropped(task.id)):
                await sim.webhooks.wait_for(len(sim.webhooks.deliveries) + 1)
        deliveries = self._dropped(task.id)
        if reverse:
            deliveries.reverse()
        for d in deliveries:
            for _ in range(copies):
                async with self.world.http.post(d.url, data=d.body,
                                                headers=d.headers) as resp:
                    assert resp.status < 500, (resp.status, await resp.text())
        assert await self.world.app[RECEIVER].drain() == 0

    def _dropped(self, task_id: str) -> list[Any]:
        return [d for d in self.world.sim.sim.webhooks.deliveries
                if d.outcome == "dropped" and task_id.encode() in d.body]

    @rule(job=jobs, with_token=st.booleans())
    def admin_force_fails(self, job: Job, with_token: bool) -> None:
        self.run(self._force_fail(job, with_token))

    async def _force_fail(self, job: Job, with_token: bool) -> None:
        before = await self._version(job.id)
        headers = {"Authorization": f"Bearer {TOKEN}"} if with_token else {}
        async with self.world.http.post(
                f"{self.world.operator_url}/admin/jobs/{job.id}/force-fail",
                headers=headers) as resp:
            if not with_token:
                assert resp.status == 403
                assert await self._version(job.id) == before, "refused, yet it wrote"
            else:
                assert resp.status in (200, 409)

    async def _version(self, job_id: uuid.UUID) -> int:
        row = await (await self.world.conn.execute(
            "SELECT call_version FROM jobs WHERE id = %s", (job_id,))).fetchone()
        assert row is not None
        return int(row["call_version"])

    @rule(job=jobs, write=st.sampled_from([*sorted(HOST_WRITES), *sorted(HOST_TERMINAL),
                                           "own_task", "commit_one"]))
    def host_writes(self, job: Job, write: str) -> None:
        if job.id in self.host_status and write in HOST_TERMINAL:
            return  # the host ends a job once
        self.run(self._host(job, write))

    async def _host(self, job: Job, write: str) -> None:
        host = self.world.host
        if write == "own_task":
            await self._host_own_task(job)
            return
        if write == "commit_one":  # settles one reservation itself, the job still open
            await host.execute(COMMIT_ONE, {"job": job.id})
            return
        async with host.transaction():
            first, *rest = HOST_WRITES[write]
            if write == "seed_columns":
                first = first.replace("'kie-standard'", f"'{KIND}'")
            ended = (await host.execute(first, {"job": job.id})).rowcount > 0
            if write in HOST_TERMINAL and not ended:
                return
            for sql in rest:
                await host.execute(sql, {"job": job.id})
        if write in HOST_TERMINAL:
            self.host_status.setdefault(job.id, HOST_TERMINAL[write])


    async def _host_own_task(self, job: Job) -> None:
        """The host's own code created the upstream task (no callwarden call on the row)
        and wrote the seed's columns by SQL: the reconciler adopts it."""
        row = await (await self.world.host.execute(
            "SELECT status, call_state, provider_task_id FROM jobs WHERE id = %s",
            (job.id,))).fetchone()
        if (row is None or row["call_state"] is not None or row["provider_task_id"]
                or row["status"] not in ("pending", "processing")):
            return  # only a job in flight, that no call owns, gets the host's own task
        async with self.world.http.post(self.world.sim.url(PROVIDER, "/v1/predictions"),
                                        headers={"Authorization": "Bearer sim-key"},
                                        json=job.request()) as resp:
            assert resp.status == 201
            task_id = (await resp.json())["id"]
        await self.world.host.execute(
            "UPDATE jobs SET provider_kind = %s, provider_task_id = %s, status = 'processing',"
            " provider_call_started_at = %s WHERE id = %s AND call_state IS NULL"
            " AND status IN ('pending', 'processing')",
            (KIND, task_id, self.world.now, job.id))


    # -- invariants -------------------------------------------------------------------

    @invariant()
    def ledger_and_log_agree(self) -> None:
        if self.known:
            self.run(self.check())

    async def check(self) -> None:
        c = self.world.conn
        rows = await (await c.execute(LEDGER_SQL, ([j.id for j in self.known],))).fetchall()
        sim = self.world.sim.sim
        for row in rows:
            job_id: uuid.UUID = row["id"]
            assert row["bad_moves"] is None, f"a reservation moved wrongly: {row}"
            assert (row["most_moves"] or 0) <= 1, f"a reservation moved twice: {row}"
            assert row["call_version"] == row["n_events"], row
            self._check_charges(row)
            tasks = [t for t in sim.tasks.all(PROVIDER) if t.input.get("prompt") == str(job_id)]
            assert len(tasks) <= 1, f"{len(tasks)} upstream tasks for job {job_id}"
            creates = [e for e in sim.journal.entries(PROVIDER, "create")
                       if e.processed and str(job_id).encode() in e.body]
            assert len(creates) <= 1, f"{len(creates)} creates processed for job {job_id}"
            state = row["call_state"]
            types = row["types"] or []
            host_commits = "HostEnded" in types and self.host_status.get(job_id) == "completed"
            if state in TERMINAL and not host_commits:  # a host's completion is its to settle
                assert row["left_reserved"] == 0, f"terminal, still reserved: {row}"
            if job_id in self.host_status:
                assert row["status"] == self.host_status[job_id], f"host overwritten: {row}"
                if "HostEnded" in types:
                    assert "Completed" not in types[types.index("HostEnded"):]
            if job_id in self.terminal:
                assert self.terminal[job_id] == (state, row["call_version"]), \
                    f"a terminal call moved: {self.terminal[job_id]} -> {row}"
            elif state in TERMINAL:
                self.terminal[job_id] = (state, row["call_version"])
            if self.versions.get(job_id) != row["call_version"]:
                assert await verify_job(c, job_id) == [], row
                self.versions[job_id] = row["call_version"]

    @staticmethod
    def _check_charges(row: dict[str, Any]) -> None:
        """Only a ``Completed`` event commits; it charges ``min(cost, H + R) - H`` over
        the R it settled, H being what rows the host committed itself already charged
        (at least 0; R when it carries no cost); anything else refunds, charging 0."""
        ledger = row["ledger"] or []
        completions = {done["seq"]: done["cost"] for done in row["completions"] or []}
        host = sum(float(u["charged"] if u["charged"] is not None else u["reserved"])
                   for u in ledger if u["status"] == "committed" and u["seq"] is None)
        for u in ledger:
            if u["status"] == "committed" and u["seq"] is not None:
                assert u["seq"] in completions, f"committed by a non-Completed event: {row}"
        for seq, cost in completions.items():
            settled = [u for u in ledger if u["seq"] == seq]
            reserved = sum(float(u["reserved"]) for u in settled)
            charged = sum(float(u["charged"]) for u in settled)
            owed = reserved if cost is None else max(0.0, min(float(cost), host + reserved)
                                                     - host)
            assert abs(charged - owed) < 1e-6, f"charged {charged}, owed {owed}: {row}"
            assert all(u["status"] == "committed" for u in settled), row
        terminal_refunds = [u for u in ledger if u["status"] == "refunded"
                            and u["seq"] is not None]
        assert all(float(u["charged"] or 0) == 0 for u in terminal_refunds), row

    # -- the horizon ------------------------------------------------------------------

    def teardown(self) -> None:
        if self.known:
            self.run(self._past_the_horizon())
        for name in self.labels:
            LABELS[name] += 1
            event(name)
        target(float(len(self.labels)), label="distinct outcomes in one example")
        LABELS["examples"] += 1
        _write_labels()

    async def _past_the_horizon(self) -> None:
        """Every lease, threshold and attempt spent: the reconcilers end every call."""
        open_calls: list[Any] = []
        for _ in range(RECONCILE.attempt_cap + 6):
            self.world.advance(HORIZON_STEP_S)
            await self.survive(self.reconciler("reconciler-a").reconcile_once(self.world.now))
            await self.check()
            open_calls = await (await self.world.conn.execute(
                "SELECT id, call_state FROM jobs WHERE id = ANY(%s) AND call_state IN "
                "('created', 'polling', 'upstream_succeeded', 'finalizing')",
                ([j.id for j in self.known],))).fetchall()
            if not open_calls:
                break
        assert not open_calls, f"calls still open past the horizon: {open_calls}"
        await self._label_outcomes()

    async def _label_outcomes(self) -> None:
        rows = await (await self.world.conn.execute(
            "SELECT j.id, (SELECT array_agg(type ORDER BY seq) FROM callwarden.call_events e "
            "   WHERE e.job_id = j.id) AS types, "
            " (SELECT array_agg(DISTINCT actor) FROM callwarden.call_events e WHERE e.job_id = "
            "j.id "
            "   AND e.type IN ('UpstreamSucceeded', 'UpstreamFailed')) AS outcome_actors, "
            " (SELECT count(*) FROM usage_logs u WHERE u.job_id = j.id "
            "   AND u.status = 'committed' AND u.settled_by_seq IS NOT NULL) AS commits, "
            " (SELECT count(*) FROM usage_logs u WHERE u.job_id = j.id "
            "   AND u.status = 'refunded' AND u.settled_by_seq IS NOT NULL) AS refunds, "
            " (SELECT count(DISTINCT payload->>'owner') FROM callwarden.call_events e "
            "   WHERE e.job_id = j.id AND e.type = 'FinalizeClaimed') AS claimers, "
            " (SELECT bool_or(actor = 'admin') FROM callwarden.call_events e WHERE e.job_id = j.id "
            "   AND e.type = 'Cancelled') AS admin, "
            " (SELECT bool_or(actor LIKE 'worker%%') FROM callwarden.call_events e "
            "   WHERE e.job_id = j.id AND e.type = 'TaskCreated') AS worker_created "
            "FROM jobs j WHERE j.id = ANY(%s)", ([j.id for j in self.known],))).fetchall()
        names = {"Exhausted": "exhausted", "HostEnded": "host won", "Swept": "swept",
                 "Adopted": "adopted", "FinalizeFailed": "finalize failed"}
        for r in rows:
            types = r["types"] or []
            self.labels.update(label for t, label in names.items() if t in types)
            actors = r["outcome_actors"] or []
            if any("webhook" in a for a in actors) and "Completed" in types:
                self.labels.add("webhook settled")
            if any(a.startswith("reconciler") for a in actors) and "Completed" in types:
                self.labels.add("reconciler recovered")
            if r["commits"]:
                self.labels.add("commit")
            if r["commits"] >= 2:
                self.labels.add("two reservations committed")
            if r["refunds"]:
                self.labels.add("refund")
            if r["claimers"] >= 2:
                self.labels.add("takeover")
            if r["admin"]:
                self.labels.add("admin cancel")
            if r["worker_created"]:
                self.labels.add("worker created")
            if "CallStarted" in types and "TaskCreated" not in types and "Swept" in types:
                self.labels.add("ambiguous create")


DEFAULT_EXAMPLES = 60  # the default (ci) profile's; the deep profile's own count above it


def _write_labels() -> None:
    """The counts so far to ``CALLWARDEN_LABELS_FILE`` (after every example: a long run
    stopped early still leaves its figures)."""
    out = os.environ.get("CALLWARDEN_LABELS_FILE")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(LABELS.items())), indent=1) + "\n")


def _machine_settings() -> settings:
    """The profile's example count, at least :data:`DEFAULT_EXAMPLES`;
    ``CALLWARDEN_MACHINE_EXAMPLES`` overrides it (the deep run splits its examples over
    processes with it). At most 25 steps an example: volume comes from examples."""
    examples = os.environ.get("CALLWARDEN_MACHINE_EXAMPLES")
    current = settings()
    count = int(examples) if examples else max(current.max_examples, DEFAULT_EXAMPLES)
    return settings(current, max_examples=count,
                    stateful_step_count=min(current.stateful_step_count, 25))


async def _open_world(db_url: str, tmp_path: Path, stack: AsyncExitStack) -> World:
    conn = await stack.enter_async_context(await connect(db_url))
    await conn.execute(AUDIT_SQL.encode())
    host = await stack.enter_async_context(await connect(db_url))
    pool = await stack.enter_async_context(open_pool(db_url, max_size=8))
    http = await stack.enter_async_context(aiohttp.ClientSession())
    sim = await stack.enter_async_context(running_simulator(clock_factor=0.0))
    media = LocalFolderStore(tmp_path / "media")
    clock = LogicalClock(datetime.fromtimestamp(sim.sim.clock.now(), UTC))
    finalizer = Finalizer(pool, media, sim.settings, owner="webhook-finalizer",
                          clock=clock, config=CALL_CONFIG, pricing=PRICING)
    config = ServiceConfig(admin_token=TOKEN, webhooks=WebhookConfig(
        secrets={PROVIDER: sim.sim.webhook_secrets[PROVIDER]}))
    apps = build_apps(pool, finalizer, config, clock=sim.sim.clock.now, now=clock)
    service_url = await stack.enter_async_context(listening(apps.webhooks))
    operator_url = await stack.enter_async_context(listening(apps.operator))
    world = World(loop=asyncio.get_running_loop(), pool=pool, conn=conn, host=host, http=http,
                  sim=sim, service_url=service_url, operator_url=operator_url,
                  app=apps.webhooks, media=media, clock=clock,
                  refusing_port=_refusing_port(stack))
    return world


def test_the_real_actors_settle_every_reservation_exactly_once(
        db_url: str, tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    stack = AsyncExitStack()
    try:
        ActorMachine.world = loop.run_until_complete(_open_world(db_url, tmp_path, stack))
        LABELS.clear()
        run_state_machine_as_test(ActorMachine, settings=_machine_settings())
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
        failpoints.arm(None)
    _write_labels()
    missing = [name for name in REQUIRED_LABELS if LABELS[name] == 0]
    assert not missing, f"no example produced: {missing} (counts: {dict(LABELS)})"
