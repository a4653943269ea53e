"""Actors racing on the same jobs through the real write path, on a real Postgres.

Rules are groups of actors (worker, a second worker after a stall, two reconcilers, a
webhook, a user cancel) acting *concurrently* on one job, each on its own connection,
either re-deciding on conflict (``transition``) or writing from a stale read (``append``
after everyone has read). Any actor may simply stop (a crash): nothing forces a sequence
to finish. A logical clock advances so finalization leases expire and get taken over.

A **host** actor races them with plain SQL, as host code does: it completes and commits,
fails and refunds, cancels, refunds alone, adds a second reservation, or writes the seed's
columns — at any moment, concurrently with the others.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, transition
from callwarden.events.states import SETTLEMENT, CallState
from callwarden.events.types import (
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    FinalizeFailed,
    ReconcileAttempted,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import CallProjection
from callwarden.replay.verify import verify_job
from tests.support.paths import HOST_TERMINAL, HOST_WRITES

S = CallState
T0 = datetime(2026, 5, 19, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=60)
CAP = 3
ACTORS = ["worker", "worker-retry", "reconciler-a", "reconciler-b", "webhook", "user"]


AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS usage_audit (usage_id bigint, job_id uuid, old_status text,
                                        new_status text);
CREATE OR REPLACE FUNCTION usage_audit_fn() RETURNS trigger AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        INSERT INTO usage_audit VALUES (NEW.id, NEW.job_id, OLD.status, NEW.status);
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS usage_audit_trg ON usage_logs;
CREATE TRIGGER usage_audit_trg AFTER UPDATE ON usage_logs
    FOR EACH ROW EXECUTE FUNCTION usage_audit_fn();
"""


class Job:
    def __init__(self, job_id: uuid.UUID, succeeds: bool, sync: bool) -> None:
        self.id, self.succeeds, self.sync = job_id, succeeds, sync


def _worker(name: str, job: Job, now: datetime) -> Callable[[CallProjection], Event | None]:
    def decide(p: CallProjection) -> Event | None:
        if p.state is None:
            return CallStarted(at=now, actor=name, kind="kie-standard", sync=job.sync)
        if p.state is S.CREATED and not job.sync:
            return TaskCreated(at=now, actor=name, task_id=f"task-{job.id}")
        if p.state in (S.CREATED, S.POLLING):
            return _outcome(name, job, now)
        return _finalize(name, p, now)
    return decide


def _outcome(name: str, job: Job, now: datetime) -> Event:
    if job.succeeds:
        return UpstreamSucceeded(at=now, actor=name,
                                 result=UpstreamResult(media_urls=("u",), cost=2.0))
    return UpstreamFailed(at=now, actor=name, error="upstream said no")


def _finalize(name: str, p: CallProjection, now: datetime) -> Event | None:
    lease = p.finalize_lease_until
    if p.state is S.UPSTREAM_SUCCEEDED or (
            p.state is S.FINALIZING and lease is not None and now >= lease):
        return FinalizeClaimed(at=now, actor=name, owner=name, lease_until=now + LEASE)
    if p.state is S.FINALIZING and p.finalize_owner == name:
        return Completed(at=now, actor=name, cost=p.upstream_result.cost
                         if p.upstream_result else None)
    return None


def _reconciler(name: str, job: Job, now: datetime,
                flaky: bool) -> Callable[[CallProjection], Event | None]:
    def decide(p: CallProjection) -> Event | None:
        if p.state is None or p.terminal:
            return None
        if p.reconcile_attempts >= CAP:
            return Exhausted(at=now, actor=name, attempts=p.reconcile_attempts)
        if p.state is S.CREATED:
            return Swept(at=now, actor=name)
        if p.state is S.POLLING:
            if flaky:
                return ReconcileAttempted(at=now, actor=name, outcome="error", error="502")
            return _outcome(name, job, now)
        if p.state is S.FINALIZING and p.finalize_owner == name and flaky:
            return FinalizeFailed(at=now, actor=name, error="s3 unavailable")
        return _finalize(name, p, now)
    return decide


def _webhook(job: Job, now: datetime) -> Callable[[CallProjection], Event | None]:
    def decide(p: CallProjection) -> Event | None:
        if p.state is S.POLLING:
            return _outcome("webhook", job, now)
        return _finalize("webhook", p, now) if p.state is not None else None
    return decide


def _user(now: datetime) -> Callable[[CallProjection], Event | None]:
    return lambda p: None if p.terminal else Cancelled(at=now, actor="user", by="user")


class RaceMachine(RuleBasedStateMachine):
    """Invariants checked after every step, from the database itself:
    a reservation is never committed twice, refunded twice, or both, and only ever moves
    from ``reserved`` (every UPDATE of a usage_logs row is audited by a trigger, the
    host's included); every terminal call has no reservation left reserved that existed
    when it ended, and a call callwarden settled settled as its terminal state prescribes;
    a status the host wrote (completed, failed, cancelled) is never overwritten, and a
    call the host ended is never completed by callwarden afterwards; terminal states are
    absorbing; call_version equals the number of events; the projection columns equal the
    fold of the log."""

    loop: ClassVar[asyncio.AbstractEventLoop]
    conns: ClassVar[list[Conn]]
    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.known: list[Job] = []
        self.terminal: dict[uuid.UUID, tuple[CallState, int]] = {}
        self.host_status: dict[uuid.UUID, str] = {}  # the terminal status the host wrote

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    @initialize()
    def reset_clock(self) -> None:
        self.now = T0

    @rule(target=jobs, succeeds=st.booleans(), sync=st.booleans(),
          credits=st.sampled_from([None, 1, 5, 10]))
    def new_job(self, succeeds: bool, sync: bool, credits: int | None) -> Job:
        job_id = self.run(create_job(self.conns[0], credits=credits))
        job = Job(job_id, succeeds, sync)
        self.known.append(job)
        return job

    @rule(seconds=st.sampled_from([1, 30, 61, 600]))
    def tick(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    def _decider(self, actor: str, job: Job, flaky: bool) -> Callable[
            [CallProjection], Event | None]:
        if actor.startswith("worker"):
            return _worker(actor, job, self.now)
        if actor.startswith("reconciler"):
            return _reconciler(actor, job, self.now, flaky)
        return _webhook(job, self.now) if actor == "webhook" else _user(self.now)

    async def _host(self, job: Job, write: str) -> None:
        """The host's statements, on its own connection, in one transaction."""
        conn = self.conns[-1]
        async with conn.transaction():
            first, *rest = HOST_WRITES[write]
            ended = (await conn.execute(first, {"job": job.id})).rowcount > 0
            if write in HOST_TERMINAL and not ended:
                return  # the job was no longer in flight: the host's flow stops there
            for sql in rest:
                await conn.execute(sql, {"job": job.id})
        if write in HOST_TERMINAL:
            self.host_status.setdefault(job.id, HOST_TERMINAL[write])

    @rule(job=jobs, write=st.sampled_from(sorted(HOST_WRITES)))
    def host_writes(self, job: Job, write: str) -> None:
        """Alone (not racing): a second reservation is only ever added to an open job,
        never racing the transition that ends it (that one cannot settle a row inserted
        after it)."""
        if job.id in self.host_status and write in HOST_TERMINAL:
            return  # the host ends a job once
        self.run(self._host(job, write))

    @rule(job=jobs, actors=st.lists(st.sampled_from(ACTORS), min_size=1, max_size=3,
                                    unique=True), flaky=st.booleans(),
          host=st.one_of(st.none(), st.sampled_from(sorted(set(HOST_WRITES)
                                                           - {"second_reservation"}))))
    def race_redeciding(self, job: Job, actors: list[str], flaky: bool,
                        host: str | None) -> None:
        deciders = [self._decider(a, job, flaky) for a in actors]
        if host is not None and job.id in self.host_status and host in HOST_TERMINAL:
            host = None

        async def go() -> None:
            writes = [transition(self.conns[i], job.id, d) for i, d in enumerate(deciders)]
            host_write = [self._host(job, host)] if host is not None else []
            await asyncio.gather(*writes, *host_write)
        self.run(go())

    @rule(job=jobs, actors=st.lists(st.sampled_from(ACTORS), min_size=2, max_size=4,
                                    unique=True), flaky=st.booleans())
    def race_from_stale_reads(self, job: Job, actors: list[str], flaky: bool) -> None:
        async def go() -> None:
            reads = await asyncio.gather(*(
                load(self.conns[i], job.id) for i in range(len(actors))))
            writes = []
            for i, (actor, p) in enumerate(zip(actors, reads, strict=True)):
                event = self._decider(actor, job, flaky)(p)
                if event is not None:
                    writes.append(append(self.conns[i], job.id, p, event))
            results = await asyncio.gather(*writes)
            assert sum(r.ok for r in results) <= 1, "two writers won from the same read"
        self.run(go())

    @invariant()
    def ledger_and_log_agree(self) -> None:
        if self.known:
            self.run(self._check())

    async def _check(self) -> None:
        c = self.conns[0]
        for job in self.known:
            row = await (await c.execute(
                "SELECT status, call_state, call_version, "
                " (SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id) AS "
                "n_events, "
                " (SELECT array_agg(type ORDER BY seq) FROM callwarden.call_events e "
                "   WHERE e.job_id = j.id) AS types, "
                " (SELECT array_agg(a.old_status || '>' || a.new_status) FROM usage_audit a "
                "   WHERE a.job_id = j.id GROUP BY a.usage_id HAVING count(*) > 1 LIMIT 1) "
                "   AS twice, "
                " (SELECT array_agg(old_status) FROM usage_audit a WHERE a.job_id = j.id "
                "   AND a.old_status <> 'reserved') AS bad_moves, "
                " (SELECT count(*) FROM usage_logs u WHERE u.job_id = j.id "
                "   AND u.status = 'reserved') AS left_reserved "
                "FROM jobs j WHERE id = %s", (job.id,))).fetchone()
            assert row is not None
            assert row["twice"] is None, f"a reservation settled more than once: {row}"
            assert row["bad_moves"] is None, f"a move not from reserved: {row}"
            assert row["call_version"] == row["n_events"]
            state = CallState(row["call_state"]) if row["call_state"] else None
            if state in SETTLEMENT:
                assert row["left_reserved"] == 0, f"terminal call left credits reserved: {row}"
            if job.id in self.host_status:
                assert row["status"] == self.host_status[job.id], "host status overwritten"
                types = row["types"] or []
                if "HostEnded" in types:
                    assert "Completed" not in types[types.index("HostEnded"):]
            if job.id in self.terminal:
                assert self.terminal[job.id] == (state, row["call_version"])
            elif state in SETTLEMENT:
                assert state is not None
                self.terminal[job.id] = (state, row["call_version"])
            assert await verify_job(c, job.id) == []


def test_racing_actors_settle_every_reservation_exactly_once(db_url: str) -> None:
    loop = asyncio.new_event_loop()

    async def setup() -> list[Conn]:
        conns = [await connect(db_url) for _ in range(5)]  # the last one is the host's
        await conns[0].execute(AUDIT_SQL.encode())
        return conns

    conns = loop.run_until_complete(setup())
    RaceMachine.loop, RaceMachine.conns = loop, conns
    try:
        run_state_machine_as_test(RaceMachine)
    finally:
        for c in conns:
            loop.run_until_complete(c.close())
        loop.close()
