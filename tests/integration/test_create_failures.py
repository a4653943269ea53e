"""Create failures through ``CallRunner.run`` (issue 14, item 6): a real job with a
reservation, the provider simulator over HTTP answering the create with 429, a 5xx, a
reset or no answer at all (it received the request: the task may exist), or nothing
listening on the port. For each: how many creates reached the simulator (its journal),
the call's state and events, and the reservation's final status and ``credits_charged``.

The rules proven (DESIGN §6, the seed's duplicate-billing failure mode):
- a 429 proves the request was not processed: the transport retries it within its
  attempt budget; recovered, the call completes and commits once; still throttled, the
  call fails at once and refunds;
- a 5xx, a reset or a timeout after sending is ambiguous (the task may exist upstream): no
  retry, the call is left ``created`` for the reconciler, a redelivered job does not create
  again (the default policy), and past the threshold it is swept and refunded — the journal
  never shows a second create; under ``ambiguous_create="recreate"`` the redelivery creates
  once more, and settles once;
- a refused connection is retried (nothing was sent) and, when it stays refused, the call
  fails at once and refunds (``code="not_sent"``: provably nothing upstream), never
  waiting out a threshold for the reconciler.

No real time is waited for but the client timeout (0.2 s) of the timeout cases, which
races nothing (the simulator holds the request for 60 s), and Replicate's own
``retry_after`` of 1 s in its recorded 429: the transport honours it with the client's
sleep, which ``CallRunner`` does not let a caller inject. Other retries back off 0 s.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from callwarden.calls.config import CallConfig
from callwarden.calls.runner import CallOutcome, CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import load_events
from callwarden.events.states import CallState
from callwarden.events.types import UpstreamFailed
from callwarden.providers.base import ProviderSettings, RetryPolicy
from callwarden.providers.simulator.core import Fault, RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeReconciler
from tests.support import no_sleep

ATTEMPTS = 2  # tries per request (each retry of Replicate's 429 waits its 1 s)
NOW_SCRIPT: dict[str, Any] = {"steps": [], "end": "succeeded"}
KINDS: dict[str, tuple[str, dict[str, Any]]] = {  # kind -> (provider, request)
    "kie-standard": ("kie", {"model": "nano-banana-pro",
                             "input": {"prompt": "a cat", "_sim": NOW_SCRIPT}}),
    "replicate-prediction": ("replicate", {"version": "owner/model",
                                           "input": {"prompt": "x", "_sim": NOW_SCRIPT}}),
}
PAST_EVERY_THRESHOLD = timedelta(hours=1)
COMPLETED = ["CallStarted", "TaskCreated", "UpstreamSucceeded", "FinalizeClaimed",
             "Completed"]
AMBIGUOUS: dict[str, Fault] = {
    "500": Fault(kind="http_status", status=500),
    "502": Fault(kind="http_status", status=502),
    "503": Fault(kind="http_status", status=503),
    "reset": Fault(kind="reset"),
    "timeout_after_sending": Fault(kind="hang", hang_s=60.0),
}


def settings_for(base_url: str, *, timeout_s: float = 30.0) -> ProviderSettings:
    """Every provider at ``base_url``; ``ATTEMPTS`` tries per request, no back-off wait."""
    return msgspec.structs.replace(
        ProviderSettings.for_simulator(base_url),
        retry=RetryPolicy(max_attempts=ATTEMPTS, base_delay_s=0.0, max_delay_s=0.0,
                          timeout_s=timeout_s))


def faulty_settings(sim: RunningSimulator, fault: str) -> ProviderSettings:
    """The settings of the run that meets ``fault``: a 0.2 s request timeout where the
    simulator holds the request (60 s), the default elsewhere (a later run gets the
    default: a loaded machine never turns its answers into timeouts)."""
    return settings_for(sim.base_url,
                        timeout_s=0.2 if fault == "timeout_after_sending" else 30.0)


def runner_for(pool: Pool, http: aiohttp.ClientSession, settings: ProviderSettings,
               tmp_path: Path, **config: Any) -> CallRunner:
    return CallRunner(pool, http, settings, LocalFolderStore(tmp_path / "media"),
                      config=CallConfig(**config), sleep=no_sleep)


async def reservation(conn: Conn, job: uuid.UUID) -> tuple[str, float]:
    row = await (await conn.execute(
        "SELECT status, credits_charged FROM usage_logs WHERE job_id = %s", (job,))).fetchone()
    assert row is not None
    return row["status"], float(row["credits_charged"] or 0)


async def event_types(conn: Conn, job: uuid.UUID) -> list[str]:
    return [type(e).__name__ for e in await load_events(conn, job)]


def creates(sim: RunningSimulator, provider: str) -> tuple[int, int]:
    """(create requests the simulator received, of which its handler processed)."""
    entries = sim.sim.journal.entries(provider, "create")
    return len(entries), sum(e.processed for e in entries)


async def run(runner: CallRunner, job: uuid.UUID, kind: str) -> CallOutcome:
    return await runner.run(job, kind, KINDS[kind][1])


@pytest.fixture(params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- 429: provably not processed -------------------------------------------------------------

THROTTLES = ["rate_limit", "rate_limit_in_body"]  # HTTP 429; the 429 in the answer's body


@pytest.mark.parametrize("throttle", THROTTLES)
async def test_a_429_is_retried_within_the_budget_and_the_call_completes_once(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path, kind: str, throttle: Any) -> None:
    provider = KINDS[kind][0]
    sim.sim.faults.arm(provider, "create", Fault(kind=throttle, times=ATTEMPTS - 1))
    job = await create_job(conn, credits=10)
    out = await run(runner_for(pool, http, settings_for(sim.base_url), tmp_path), job, kind)
    assert out.result == "completed"
    assert creates(sim, provider) == (ATTEMPTS, 1)  # throttled, then processed
    assert len(sim.sim.tasks.all()) == 1
    assert await event_types(conn, job) == COMPLETED
    assert await reservation(conn, job) == ("committed", 10.0)
    assert await verify_job(conn, job) == []


@pytest.mark.parametrize("throttle", THROTTLES)
async def test_a_429_past_the_budget_fails_the_call_and_refunds_at_once(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path, kind: str, throttle: Any, make_reconciler: MakeReconciler) -> None:
    provider = KINDS[kind][0]
    sim.sim.faults.arm(provider, "create", Fault(kind=throttle, times=ATTEMPTS))
    job = await create_job(conn, credits=10)
    out = await run(runner_for(pool, http, settings_for(sim.base_url), tmp_path), job, kind)
    assert out.result == "failed"
    assert creates(sim, provider) == (ATTEMPTS, 0)
    assert sim.sim.tasks.all() == []
    _, failed = await load_events(conn, job)
    assert isinstance(failed, UpstreamFailed)
    assert failed.code == "rate_limited"
    assert await reservation(conn, job) == ("refunded", 0.0)
    later = await make_reconciler().reconcile_once(utcnow() + PAST_EVERY_THRESHOLD)
    assert later.claimed == 0  # terminal: nothing left to recover
    assert await verify_job(conn, job) == []


# -- 5xx, reset, timeout after sending: ambiguous --------------------------------------------

@pytest.mark.parametrize("fault", list(AMBIGUOUS))
async def test_an_ambiguous_create_is_never_sent_again_and_is_swept_and_refunded(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path, kind: str, fault: str, make_reconciler: MakeReconciler) -> None:
    provider = KINDS[kind][0]
    sim.sim.faults.arm(provider, "create", AMBIGUOUS[fault])
    job = await create_job(conn, credits=10)
    out = await run(runner_for(pool, http, faulty_settings(sim, fault), tmp_path), job, kind)
    assert out.result == "left_for_reconciler"
    assert out.projection.state is CallState.CREATED
    assert "ambiguous" in (out.detail or "")
    received, processed = creates(sim, provider)
    assert (received, processed) == (1, int(fault == "timeout_after_sending"))  # no retry
    assert await reservation(conn, job) == ("reserved", 0.0)
    # The job is redelivered (a second worker, the queue's retry): no second create.
    again = await run(runner_for(pool, http, settings_for(sim.base_url), tmp_path), job, kind)
    assert again.result == "left_for_reconciler"
    assert creates(sim, provider)[0] == 1
    counts = await make_reconciler().reconcile_once(utcnow() + PAST_EVERY_THRESHOLD)
    assert (counts.claimed, counts.swept) == (1, 1)
    assert await event_types(conn, job) == ["CallStarted", "Swept"]
    assert await reservation(conn, job) == ("refunded", 0.0)
    assert creates(sim, provider)[0] == 1  # never created again, by anyone
    assert await verify_job(conn, job) == []


@pytest.mark.parametrize("fault", ["503", "timeout_after_sending"])
async def test_recreate_policy_creates_once_more_on_redelivery_and_settles_once(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path, kind: str, fault: str) -> None:
    """The opt-in policy: the redelivered job creates again (accepting that the first
    request may have created a task too) and commits once."""
    provider = KINDS[kind][0]
    sim.sim.faults.arm(provider, "create", AMBIGUOUS[fault])
    job = await create_job(conn, credits=10)
    first = runner_for(pool, http, faulty_settings(sim, fault), tmp_path,
                       ambiguous_create="recreate")
    assert (await run(first, job, kind)).result == "left_for_reconciler"
    runner = runner_for(pool, http, settings_for(sim.base_url), tmp_path,
                        ambiguous_create="recreate")
    assert (await run(runner, job, kind)).result == "completed"
    assert creates(sim, provider)[0] == 2
    assert await event_types(conn, job) == COMPLETED
    assert await reservation(conn, job) == ("committed", 10.0)
    assert (await run(runner, job, kind)).result == "completed"  # terminal: no third
    assert creates(sim, provider)[0] == 2
    assert await verify_job(conn, job) == []


# -- connection refused: nothing sent ---------------------------------------------------------

@pytest.fixture
def refused_url() -> Iterator[str]:
    """A URL on 127.0.0.1 whose port refuses connections: bound by this test (so no
    other process can listen there while it runs) but never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_a_refused_connection_is_retried_then_failed_and_refunded_at_once(
        conn: Conn, pool: Pool, sim: RunningSimulator, tmp_path: Path, kind: str,
        refused_url: str, make_reconciler: MakeReconciler) -> None:
    attempts: list[str] = []

    async def on_start(_: Any, __: Any, params: aiohttp.TraceRequestStartParams) -> None:
        attempts.append(str(params.url))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    job = await create_job(conn, credits=10)
    async with aiohttp.ClientSession(trace_configs=[trace]) as http:
        out = await run(runner_for(pool, http, settings_for(refused_url), tmp_path), job,
                        kind)
    assert out.result == "failed"
    assert out.projection.state is CallState.FAILED
    assert "cannot connect" in (out.projection.error_message or "")
    assert len(attempts) == ATTEMPTS  # nothing was sent: retried up to the budget
    assert all(a.startswith(refused_url) for a in attempts)
    assert await event_types(conn, job) == ["CallStarted", "UpstreamFailed"]
    assert await reservation(conn, job) == ("refunded", 0.0)
    counts = await make_reconciler().reconcile_once(utcnow() + PAST_EVERY_THRESHOLD)
    assert counts.swept == 0  # nothing left for the reconciler
    assert sim.sim.journal.count() == 0  # the reconciler never creates either
    assert await verify_job(conn, job) == []
