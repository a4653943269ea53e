"""The database port's contract (:mod:`callwarden.database.port`), on a real Postgres
(:class:`PostgresDatabase`): every fence the actors rely on, at the level of meaning, with
the host's writes made by plain SQL and the heartbeat stamped with a simulated clock."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal

import pytest

from callwarden.database.db import open_pool
from callwarden.database.port import ClaimRequest
from callwarden.database.postgres import PostgresDatabase
from callwarden.errors import JobNotFound, TaskAlreadyClaimed
from callwarden.events.states import CallState, InvalidTransition
from callwarden.events.types import (
    CallStarted,
    Cancelled,
    Completed,
    Event,
    FinalizeClaimed,
    StoredMedia,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import EMPTY, CallProjection
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from tests.simulation.host import EPOCH, PostgresHost, SimClock, adapters

KIND = "replicate-prediction"


class Env:
    def __init__(self, store: PostgresDatabase, host: PostgresHost, clock: SimClock) -> None:
        self.store, self.host, self.clock = store, host, clock

    async def job(self, *credits: str, status: str = "pending") -> uuid.UUID:
        job = uuid.uuid4()
        first = Decimal(credits[0]) if credits else None
        await self.store.create_job(job, credits=first, status=status)
        for more in credits[1:]:
            await self.store.add_reservation(job, Decimal(more))
        return job

    async def run(self, job: uuid.UUID, *events: Event,
                  p: CallProjection = EMPTY) -> CallProjection:
        for e in events:
            r = await self.store.append(job, p, e)
            assert r.ok, (e, r)
            p = r.projection
        return p

    async def succeeded(self, job: uuid.UUID, task: str = "t-1") -> CallProjection:
        """A call with a result in hand, finalization claimed (a lease to T0 + 10 min)."""
        t = self.clock()
        return await self.run(
            job, CallStarted(at=t, actor="w", kind=KIND),
            TaskCreated(at=t, actor="w", task_id=task),
            UpstreamSucceeded(at=t, actor="w", result=UpstreamResult(media_urls=("u",))),
            FinalizeClaimed(at=t, actor="w", owner="w/1", lease_until=t + timedelta(minutes=10)))


@pytest.fixture
async def env(db_url: str) -> AsyncIterator[Env]:
    clock = SimClock(EPOCH)
    async with open_pool(db_url, max_size=2) as pool:
        store, host = adapters(clock=clock, pool=pool)
        await host.install_audit()  # the reservation audit, as the simulation reads it
        yield Env(store, host, clock)


def _completed(cost: float | None) -> Completed:
    return Completed(at=EPOCH, actor="w", cost=cost,
                     media=(StoredMedia(key="k/0.png", url="s3://k/0.png",
                                        content_type="image/png", size=1),))


async def test_unknown_job_is_not_found(env: Env) -> None:
    with pytest.raises(JobNotFound):
        await env.store.load(uuid.uuid4())


async def test_lost_version_race_writes_nothing_and_returns_the_winner(env: Env) -> None:
    job = await env.job("5")
    started = await env.run(job, CallStarted(at=EPOCH, actor="a", kind=KIND))
    won = await env.store.append(job, started, TaskCreated(at=EPOCH, actor="a", task_id="A"))
    lost = await env.store.append(job, started, TaskCreated(at=EPOCH, actor="b", task_id="B"))
    assert won.ok
    assert not lost.ok
    assert lost.projection.provider_task_id == "A"
    assert lost.projection.version == 2
    assert [type(e).__name__ for e in await env.store.load_events(job)] == [
        "CallStarted", "TaskCreated"]


async def test_a_taken_seq_is_a_lost_race(env: Env) -> None:
    """The row's call_version was written back by host code: the event's seq is taken."""
    job = await env.job("5")
    await env.run(job, CallStarted(at=EPOCH, actor="a", kind=KIND))
    await env.host.write(job, call_version=0)
    r = await env.store.append(job, EMPTY, CallStarted(at=EPOCH, actor="b", kind=KIND))
    assert not r.ok
    assert len(await env.store.load_events(job)) == 1


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
async def test_host_ended_status_is_recorded_not_overwritten(env: Env, status: str) -> None:
    job = await env.job("5")
    p = await env.run(job, CallStarted(at=EPOCH, actor="w", kind=KIND),
                      TaskCreated(at=EPOCH, actor="w", task_id="t"))
    await env.host.set_status(job, status)
    stale = await env.store.append(job, p, Cancelled(at=EPOCH, actor="w", by="w"))
    assert not stale.ok  # the host status fence
    r = await env.store.transition(
        job, lambda q: None if q.terminal else Cancelled(at=EPOCH, actor="w", by="w"))
    assert r.host_ended
    assert r.projection.terminal
    assert (await env.host.row(job))["status"] == status
    assert type((await env.store.load_events(job))[-1]).__name__ == "HostEnded"
    statuses = [s for _, s, *_ in await env.host.reservations(job)]
    assert statuses == (["reserved"] if status == "completed" else ["refunded"])


async def test_host_ended_fence_for_a_job_that_never_had_a_call(env: Env) -> None:
    job = await env.job("5", status="cancelled")
    r = await env.store.transition(job, lambda q: CallStarted(at=EPOCH, actor="w", kind=KIND))
    assert r.host_ended
    assert not r.ok
    assert await env.store.load_events(job) == []


@pytest.mark.parametrize(("credits", "cost", "charged"), [
    ((), 3.0, []),
    (("5",), 3.0, ["3"]), (("5",), 5.0, ["5"]), (("5",), 9.0, ["5"]), (("5",), None, ["5"]),
    (("5", "4"), 3.0, ["3", "0"]), (("5", "4"), 9.0, ["5", "4"]),
    (("5", "4"), 7.0, ["5", "2"]), (("5", "4"), 12.0, ["5", "4"]),
    (("5", "4"), None, ["5", "4"]), (("5", "4"), 0.0, ["0", "0"]),
])
async def test_commit_settles_every_reservation_once_at_min_cost_reserved(
        env: Env, credits: tuple[str, ...], cost: float | None, charged: list[str]) -> None:
    job = await env.job(*credits)
    p = await env.succeeded(job)
    r = await env.store.append(job, p, _completed(cost))
    assert r.ok
    assert r.settlement == ("settled" if credits else "no_reservation")
    rows = await env.host.reservations(job)
    assert [s for _, s, *_ in rows] == ["committed"] * len(credits)
    assert [c for *_, c, _ in rows] == [Decimal(x) for x in charged]
    assert {seq for *_, seq in rows} <= {5}
    again = await env.store.append(job, p, _completed(cost))  # a stale second settlement
    assert not again.ok
    assert await env.host.reservations(job) == rows
    with pytest.raises(InvalidTransition):  # terminal is absorbing
        await env.store.append(job, r.projection, Cancelled(at=EPOCH, actor="x", by="x"))


async def test_refund_charges_nothing_and_skips_what_the_host_settled(env: Env) -> None:
    job = await env.job("5", "4")
    p = await env.run(job, CallStarted(at=EPOCH, actor="w", kind=KIND))
    assert await env.host.settle(job, "committed") == 2
    await env.store.add_reservation(job, Decimal("7"))
    stale = await env.store.append(job, p, Cancelled(at=EPOCH, actor="w", by="w"))
    assert not stale.ok  # the settled-reservations fence: re-read first
    r = await env.store.transition(
        job, lambda q: None if q.terminal else Cancelled(at=EPOCH, actor="w", by="w"))
    assert r.ok
    assert r.settlement == "settled"
    rows = await env.host.reservations(job)
    assert [(s, c) for _, s, _, c, _ in rows] == [
        ("committed", Decimal(5)), ("committed", Decimal(4)), ("refunded", Decimal(0))]
    assert [(old, new) for _, old, new in await env.host.audit()
            if _ == rows[2][0]] == [(None, "reserved"), ("reserved", "refunded")]


@pytest.mark.parametrize(("cost", "charged"), [(3.0, "0"), (7.0, "2"), (12.0, "4"),
                                               (None, "4")])
async def test_a_commit_counts_what_the_host_committed_itself(
        env: Env, cost: float | None, charged: str) -> None:
    """The host committed one row (5) itself, then reserved again (4): the call's commit
    charges what is left of the cost, never the host's row again."""
    job = await env.job("5")
    p = await env.succeeded(job)
    assert await env.host.settle(job, "committed") == 1
    await env.store.add_reservation(job, Decimal("4"))
    r = await env.store.transition(job, lambda q: _completed(cost) if not q.terminal
                                   else None, current=p)
    assert r.ok
    rows = await env.host.reservations(job)
    assert [(s, c) for _, s, _, c, _ in rows] == [
        ("committed", Decimal(5)), ("committed", Decimal(charged))]


async def test_terminal_absorbs_and_a_decider_sees_it(env: Env) -> None:
    job = await env.job("5")
    p = await env.run(job, CallStarted(at=EPOCH, actor="w", kind=KIND),
                      Cancelled(at=EPOCH, actor="w", by="w"))
    assert p.state is CallState.CANCELLED
    r = await env.store.transition(job, lambda q: None if q.terminal else Cancelled(
        at=EPOCH, actor="x", by="x"))
    assert not r.ok
    assert r.projection.version == 2


async def test_one_task_id_per_kind(env: Env) -> None:
    a, b = await env.job("1"), await env.job("1")
    await env.run(a, CallStarted(at=EPOCH, actor="w", kind=KIND),
                  TaskCreated(at=EPOCH, actor="w", task_id="same"))
    p = await env.run(b, CallStarted(at=EPOCH, actor="w", kind=KIND))
    with pytest.raises(TaskAlreadyClaimed):
        await env.store.append(b, p, TaskCreated(at=EPOCH, actor="w", task_id="same"))
    assert (await env.store.load(b)).provider_task_id is None
    found = await env.store.find_job([KIND], "same")
    assert found is not None
    assert found["id"] == a
    assert await env.store.find_job(["kie-standard"], "same") is None


async def test_a_start_is_refused_on_a_row_with_another_systems_task(env: Env) -> None:
    job = await env.job("1")
    await env.host.write(job, provider_kind=KIND, provider_task_id="theirs")
    r = await env.store.append(job, EMPTY, CallStarted(at=EPOCH, actor="w", kind=KIND))
    assert not r.ok


def _claim(env: Env, owner: str, now_s: float, config: ReconcileConfig) -> ClaimRequest:
    r = Reconciler(env.store, None, None, LocalFolderStore("/nonexistent"),  # type: ignore[arg-type]
                   config=config, owner=owner)
    return r.claim_request(EPOCH + timedelta(seconds=now_s))


async def test_claim_respects_staleness_and_leases(env: Env) -> None:
    # (TaskCreated is each call's first heartbeat: a timeout as long as the threshold
    # keeps the fresh call out of reach for this test's whole span)
    threshold = ReconcileConfig().stale.threshold_for(KIND)
    config = ReconcileConfig(claim_lease_s=120.0, heartbeat_timeout_s=threshold)
    old, fresh = await env.job("1"), await env.job("1")
    await env.run(old, CallStarted(at=EPOCH, actor="w", kind=KIND),
                  TaskCreated(at=EPOCH, actor="w", task_id="o"))
    later = EPOCH + timedelta(seconds=threshold)
    await env.run(fresh, CallStarted(at=later, actor="w", kind=KIND),
                  TaskCreated(at=later, actor="w", task_id="f"))
    now = threshold + 1
    first = await env.store.claim(_claim(env, "r1", now, config))
    assert [r["id"] for r in first] == [old]
    assert first[0]["call_state"] == "polling"
    assert await env.store.claim(_claim(env, "r2", now + 60, config)) == []  # live lease
    taken = await env.store.claim(_claim(env, "r2", now + 121, config))  # expired: taken
    assert [r["id"] for r in taken] == [old]
    assert not await env.store.renew(old, "r1", EPOCH + timedelta(seconds=now + 300))
    assert await env.store.renew(old, "r2", EPOCH + timedelta(seconds=now + 300))
    await env.store.release(old, "r1")  # not ours any more: nothing
    assert (await env.host.row(old))["reconcile_owner"] == "r2"
    await env.store.park(old, "r2", EPOCH + timedelta(seconds=now + 1000))
    assert await env.store.claim(_claim(env, "r3", now + 999, config)) == []
    assert [r["id"] for r in await env.store.claim(_claim(env, "r3", now + 1000, config))] \
        == [old]
    await env.store.release(old, "r3")
    assert (await env.host.row(old))["reconcile_owner"] is None
    row, events = await env.store.candidate_read(old)
    assert row is not None
    assert row["call_version"] == len(events) == 2


async def test_a_fresh_heartbeat_keeps_a_call_out_of_the_claim(env: Env) -> None:
    config = ReconcileConfig()
    threshold = config.stale.threshold_for(KIND)
    job = await env.job("1")
    await env.run(job, CallStarted(at=EPOCH, actor="w", kind=KIND),
                  TaskCreated(at=EPOCH, actor="w", task_id="h"))
    env.clock.advance(threshold)
    await env.store.heartbeat(job, "w", 40)
    assert (await env.host.row(job))["heartbeat_at"] == env.clock()
    assert await env.store.claim(_claim(env, "r", threshold + 1, config)) == []
    late = threshold + config.heartbeat_timeout_s
    assert [r["id"] for r in await env.store.claim(_claim(env, "r", late, config))] == [job]


async def test_a_heartbeat_on_a_call_that_is_not_running_writes_nothing(env: Env) -> None:
    job = await env.job("1")
    await env.store.heartbeat(job, "w", 10)
    assert (await env.host.row(job))["heartbeat_at"] is None


async def test_the_host_ended_job_is_claimed_at_once(env: Env) -> None:
    job = await env.job("1")
    await env.run(job, CallStarted(at=EPOCH, actor="w", kind=KIND))
    await env.host.set_status(job, "cancelled")
    claimed = await env.store.claim(_claim(env, "r", 1, ReconcileConfig()))
    assert [r["id"] for r in claimed] == [job]


async def test_delivery_dedupe(env: Env) -> None:
    job = await env.job("1")
    assert await env.store.record_delivery("replicate", "d1", job)
    assert not await env.store.record_delivery("replicate", "d1", job)
    assert await env.store.record_delivery("kie", "d1", job)
    await env.store.forget_delivery("replicate", "d1")
    assert await env.store.record_delivery("replicate", "d1", job)
    row = await env.store.job_by_id(job)
    assert row is not None
    assert row["call_state"] is None
    assert await env.store.job_by_id(uuid.uuid4()) is None
