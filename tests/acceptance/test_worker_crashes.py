"""A real worker killed with SIGKILL at every failpoint; a second worker takes the job.

Invariant (DESIGN §8, issue 4): whatever point a worker process dies at, once the queue
has redelivered its job to a healthy worker and that worker has acked it,

- the provider saw at most one create (none when the crash came before the request;
  two only under ``ambiguous_create="recreate"`` after a create whose answer was lost —
  the risk that policy accepts);
- the reservation is settled exactly once if the call is terminal (one settling event in
  ``call_events``, one ``usage_logs`` row in the matching status), and still ``reserved``
  if not;
- the call ends where the design says: ``completed``, except a crash between
  ``CallStarted`` and ``TaskCreated`` under the default policy, or after a sync call, which
  leaves a ``created`` call — which the reconciler then sweeps and refunds, exactly once,
  without creating anything;
- the projection columns equal the fold of the log (``verify_job == []``).

Each case: the simulator runs in this process; worker 1 (``CALLWARDEN_FAILPOINTS=<point>``)
claims the job and dies with SIGKILL (exit -9) at the point, which is checked against the
state the log shows; the test waits on the database until its lease (and any finalization
lease) has expired; worker 2 claims the redelivered job (delivery 2), runs it and acks it;
SIGTERM stops it with exit 0.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import msgspec
import pytest

from callwarden.calls.failpoints import POINTS
from callwarden.database.db import Conn, open_pool
from callwarden.database.jobs import create_job
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.claims import input_data
from callwarden.reconciler.loop import Reconciler
from callwarden.replay.verify import verify_job
from tests.acceptance.conftest import Workers

VISIBILITY_S = 1.0
DEADLINE_S = 20.0
SCRIPT = {"steps": [{"phase": "running", "polls": 1}], "end": "succeeded"}
REQUESTS: dict[str, dict[str, Any]] = {
    "kie-standard": {"model": "nano-banana-pro", "input": {"prompt": "a cat", "_sim": SCRIPT}},
    "replicate-prediction": {"version": "owner/model",
                             "input": {"prompt": "a cat", "_sim": SCRIPT}},
    "elevenlabs-async": {"source_url": "https://example.com/clip.mp4", "target_lang": "es",
                         "_sim": SCRIPT},
    "anthropic-sync": {"model": "claude-sonnet-4-6", "max_tokens": 32,
                       "messages": [{"role": "user", "content": "hi"}]},
}
# (provider in the simulator's journal, the route that creates or makes the call)
CREATE_ROUTE = {"kie-standard": ("kie", "create"), "replicate-prediction": ("replicate", "create"),
                "elevenlabs-async": ("elevenlabs", "create"),
                "anthropic-sync": ("anthropic", "call")}
# A worker with no callback URL finalizes a success at once (media stored while the call
# is still polling, then one transaction); with one (a webhook may race it) it records the
# success with its claim, then stores the media. "+cb": the case runs with callbacks.
ASYNC_POINTS = ("before_call_started", "before_create", "after_create", "mid_poll",
                "success_seen", "after_upload", "after_claim+cb", "after_upload+cb")
SYNC_POINTS = ("before_call_started", "after_sync_call", "after_upstream_result")
AMBIGUOUS = ("before_create", "after_create")
# The call state the log shows right after the crash: proves where the worker died.
CRASH_STATE = {"before_call_started": None, "before_create": "created",
               "after_create": "created", "mid_poll": "polling", "success_seen": "polling",
               "after_upload": "polling", "after_claim+cb": "finalizing",
               "after_upload+cb": "finalizing", "after_upstream_result": "upstream_succeeded",
               "after_sync_call": "created"}
SETTLING = ("Completed", "UpstreamFailed", "Swept", "Exhausted", "Cancelled")


class Expect(msgspec.Struct, frozen=True, kw_only=True):
    state: str
    creates: int
    credits: str


def expected(point: str, policy: str) -> Expect:
    """What the design prescribes once the redelivered job is acked (pure)."""
    left = point == "after_sync_call" or (point in AMBIGUOUS and policy == "sweep")
    creates = 0 if (point == "before_create" and policy == "sweep") else 1
    if point == "after_create" and policy == "recreate":
        creates = 2  # the first task's answer was lost: recreate pays again, by design
    return Expect(state="created" if left else "completed", creates=creates,
                  credits="reserved" if left else "committed")


CASES = (
    [(k, p, "sweep") for k in ("kie-standard", "replicate-prediction", "elevenlabs-async")
     for p in ASYNC_POINTS
     if not (p.endswith("+cb") and k == "elevenlabs-async")]  # (it has no callbacks)
    + [(k, p, "recreate") for k in ("kie-standard", "replicate-prediction",
                                      "elevenlabs-async") for p in AMBIGUOUS]
    + [("anthropic-sync", p, "sweep") for p in SYNC_POINTS]
)


def test_every_failpoint_is_exercised() -> None:
    assert {p.removesuffix("+cb") for _, p, _ in CASES} == set(POINTS)


def _args(kind: str, policy: str, tmp: Any) -> list[str]:
    # (media and store timeouts with room for a loaded machine: a download past them is a
    # FinalizeFailed left to the reconciler, a path of its own, not the one tested here)
    return ["--concurrency", "1", "--visibility", str(VISIBILITY_S), "--poll-empty", "0.05",
            "--grace", "5", "--poll-interval", "0.05", "--finalize-lease", "2",
            "--media-timeout", "1", "--store-timeout", "0.5", "--lease-margin", "0.1",
            "--media-dir", str(tmp / "media"), "--ambiguous-create-for", f"{kind}={policy}"]


async def _one(conn: Conn, sql: str, job: uuid.UUID) -> Any:
    row = await (await conn.execute(sql, (job,))).fetchone()
    assert row is not None
    return next(iter(row.values()))


async def _wait_for(conn: Conn, sql: str, job: uuid.UUID, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await _one(conn, sql, job):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


LEASES_EXPIRED = ("SELECT queue_lease_until < now() AND (finalize_lease_until IS NULL OR "
                  "finalize_lease_until < now()) FROM jobs WHERE id = %s")
ACKED = "SELECT queue_acked_at IS NOT NULL FROM jobs WHERE id = %s"


async def _facts(conn: Conn, job: uuid.UUID) -> dict[str, Any]:
    row = await (await conn.execute(
        "SELECT j.call_state, j.queue_deliveries, "
        "(SELECT array_agg(u.status) FROM usage_logs u WHERE u.job_id = j.id) AS credits, "
        "(SELECT count(*) FROM callwarden.call_events e WHERE e.job_id = j.id "
        " AND e.type = ANY(%s)) AS settlements, "
        "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j WHERE j.id = %s", (list(SETTLING), job))).fetchone()
    assert row is not None
    return dict(row)


@pytest.mark.parametrize(("kind", "point", "policy"), CASES,
                         ids=[f"{k}-{p}-{pol}" for k, p, pol in CASES])
async def test_worker_killed_at_failpoint_recovers_on_redelivery(
        db_url: str, conn: Conn, workers: Workers, sim: RunningSimulator, tmp_path: Any, kind: str,
        point: str, policy: str) -> None:
    job = await create_job(conn, input_data=input_data(kind, REQUESTS[kind]), credits=10)
    args = _args(kind, policy, tmp_path)
    # (nothing listens at the callback base: the simulator's deliveries fail, as a
    # provider's to a service that is down; the workers' polls finish the calls)
    extra = ({"CALLWARDEN_CALLBACK_BASE_URL": "http://127.0.0.1:9"} if point.endswith("+cb")
             else None)
    crashing = await workers.start(args, failpoints=point.removesuffix("+cb"), env=extra)
    assert await crashing.exited(DEADLINE_S) == -9, crashing.logs()
    assert await _one(conn, "SELECT call_state FROM jobs WHERE id = %s", job) == \
        CRASH_STATE[point]
    await _wait_for(conn, LEASES_EXPIRED, job, "the dead worker's leases to expire")

    healthy = await workers.start(args, env=extra)
    await _wait_for(conn, ACKED, job, f"the redelivered job to be acked:\n{healthy.logs()}")
    assert await healthy.terminate() == 0, healthy.logs()

    want = expected(point.removesuffix("+cb"), policy)
    facts = await _facts(conn, job)
    provider, route = CREATE_ROUTE[kind]
    assert sim.sim.journal.count(provider, route) == want.creates
    assert (facts["call_state"], facts["credits"]) == (want.state, [want.credits])
    assert facts["settlements"] == (1 if want.state == "completed" else 0)
    assert facts["queue_deliveries"] == 2
    media = want.state == "completed" and kind != "anthropic-sync"
    assert facts["assets"] == (1 if media else 0)
    assert await verify_job(conn, job) == []
    if want.state == "created":  # left for the reconciler: it sweeps and refunds, once
        await _reconciler_sweeps(db_url, sim, tmp_path, conn, job, want.creates, kind)


async def _reconciler_sweeps(db_url: str, sim: RunningSimulator, tmp: Any, conn: Conn,
                             job: uuid.UUID, creates: int, kind: str) -> None:
    async with open_pool(db_url, max_size=2) as pool, aiohttp.ClientSession() as http:
        reconciler = Reconciler(pool, http, sim.settings, LocalFolderStore(tmp / "rec"))
        counts = await reconciler.reconcile_once(datetime.now(UTC) + timedelta(hours=2))
    assert counts.swept == 1
    facts = await _facts(conn, job)
    assert (facts["call_state"], facts["credits"], facts["settlements"]) == (
        "swept", ["refunded"], 1)
    provider, route = CREATE_ROUTE[kind]
    assert sim.sim.journal.count(provider, route) == creates  # sweeping never creates
    assert await verify_job(conn, job) == []


async def test_sigterm_lets_the_call_in_flight_finish_then_exits_0(
        conn: Conn, workers: Workers, sim: RunningSimulator, tmp_path: Any) -> None:
    slow = {"steps": [{"phase": "running", "polls": 15}], "end": "succeeded"}
    request = {"model": "nano-banana-pro", "input": {"prompt": "a cat", "_sim": slow}}
    job = await create_job(conn, input_data=input_data("kie-standard", request))
    worker = await workers.start(_args("kie-standard", "sweep", tmp_path))
    await _wait_for(conn, "SELECT call_state = 'polling' FROM jobs WHERE id = %s", job,
                    "the call to be polling")
    assert await worker.terminate() == 0, worker.logs()
    facts = await _facts(conn, job)
    assert (facts["call_state"], facts["credits"], facts["queue_deliveries"]) == (
        "completed", ["committed"], 1)
    assert await _one(conn, ACKED, job)
