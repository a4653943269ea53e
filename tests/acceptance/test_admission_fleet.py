"""Admission control held across a fleet (issue 42 item 4, the issue's proof): three real
``callwarden worker`` processes, one of them SIGKILLed mid-run, and a ``callwarden
reconcile`` process run 200 ``kie-standard`` jobs against an account limited to 5 calls in
flight (a row of ``callwarden.limits`` written by plain SQL, as a host may). The simulated
KIE account enforces the same cap itself (``max_in_flight=5``): a create past it is
refused with KIE's 429, which the worker fails and refunds, so any overshoot of the fleet
shows as a refused create and a job not completed.

What it proves, read from the provider's own counters and journal and by SQL:

- at most 5 tasks in flight upstream at any moment (the simulator's ``max_in_flight_seen``),
  and at most 5 open calls in the database whenever the test looked (sampled through the
  run);
- 0 creates refused by the provider (neither its rate nor its concurrency limit);
- the cap bound: the workers were refused starts (their ``waiting`` log lines) and deferred
  the jobs, none failed for it;
- the killed worker's open call held its slot until it was recovered (by the reconciler,
  or by the job's redelivery to a survivor), and no slot leaked: every job completed;
- every job completed with exactly one create upstream (the journal's processed creates,
  per job), its reservation committed once (one ``usage_logs`` row, ``committed``, one
  settling event), no job left waiting, and the projections equal to the log (``verify``).

The run's figures (wall time, ``max_in_flight_seen``, refusals) are printed (``-s``) and
quoted in docs/admission.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from callwarden.database.db import Conn, connect
from callwarden.providers.simulator.core import Limits, RunningSimulator
from callwarden.replay.verify import verify
from tests.acceptance.conftest import ROOT, WorkerProcess, Workers
from tests.support.processes import environment
from tests.support.queues import until, value

# One process runs every fleet test (README: the tests run in two), so two fleets of
# worker processes never compete for the cores against their deadlines.
pytestmark = pytest.mark.xdist_group("fleets")

JOBS = 200
CAP = 5
KIND = "kie-standard"
# A few polls each (0.1 s apart), so that a call holds its slot long enough for the
# cap to bind: 200 jobs at 5 at a time take about 40 slot turns.
SCRIPT = {"steps": [{"phase": "running", "polls": 3}], "end": "succeeded"}
# The victim runs one call at a time, so the SIGKILL (its own failpoint, on the 20th
# poll: during its fifth or so job) lands while its one call is polling, never between a
# create and its TaskCreated (an ambiguous create is swept and refunded by design,
# which is not what this test is about).
VICTIM_FAILPOINT = "mid_poll@20"
OPEN = ("created", "polling", "upstream_succeeded", "finalizing")
SETTLING = ["Completed", "UpstreamFailed", "Swept", "Exhausted", "Cancelled"]
RUN_DEADLINE_S = 180.0
WAITING_LINE = re.compile(rf"job \S+ kind={KIND} waiting: ")


def worker_args(concurrency: int, media: Path) -> list[str]:
    """Short leases and beats, so a dead worker's job and call come back within seconds;
    timeouts with room for a loaded machine. The visibility is longer than the
    reconciler's heartbeat timeout: the reconciler is normally first to the dead call."""
    return ["--concurrency", str(concurrency), "--visibility", "5", "--poll-empty", "0.1",
            "--grace", "10", "--poll-interval", "0.1", "--finalize-lease", "5",
            "--heartbeat-every", "0.5", "--media-timeout", "5", "--store-timeout", "2",
            "--lease-margin", "1", "--max-deliveries", "10", "--media-dir", str(media)]


async def enqueue(conn: Conn, n: int) -> list[uuid.UUID]:
    """``n`` pending jobs and their reservations, inserted as a host's own API does (plain
    SQL: the reference worker reads the job's ``input_data``), oldest first; each prompt
    names its job, so the journal's creates can be counted per job."""
    jobs = [uuid.uuid4() for _ in range(n)]
    await conn.execute(
        "INSERT INTO jobs (id, user_id, status, input_data, created_at) "
        "SELECT t.id, 'u-' || (t.n %% 4), 'pending', jsonb_build_object("
        "  'provider_kind', %s::text, 'request', jsonb_build_object("
        "    'model', 'nano-banana-pro', 'input', jsonb_build_object("
        "      'prompt', 'job ' || t.id, '_sim', %s::jsonb))), "
        "  now() + t.n * interval '1 millisecond' "
        "FROM unnest(%s::uuid[]) WITH ORDINALITY AS t(id, n)", (KIND, Jsonb(SCRIPT), jobs))
    await conn.execute(
        "INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
        "SELECT j.id, j.user_id, 'reserved', 10 FROM jobs j WHERE j.id = ANY(%s)", (jobs,))
    return jobs


class Watch:
    """What the test saw of the database while the fleet ran, sampled: the most open
    calls of the kind, the most jobs waiting in ``callwarden.waiting``, the most refusals
    one job had."""

    def __init__(self) -> None:
        self.open_max = self.waiting_max = self.refusals_max = self.samples = 0

    async def run(self, url: str, stop: asyncio.Event) -> None:
        async with await connect(url) as conn:
            while not stop.is_set():
                row = await (await conn.execute(
                    "SELECT (SELECT count(*) FROM jobs WHERE provider_kind = %s "
                    "        AND call_state = ANY(%s)) AS open, "
                    "       (SELECT count(*) FROM callwarden.waiting) AS waiting, "
                    "       (SELECT coalesce(max(refusals), 0) FROM callwarden.waiting) "
                    "        AS refusals", (KIND, list(OPEN)))).fetchone()
                assert row is not None
                self.open_max = max(self.open_max, int(row["open"]))
                self.waiting_max = max(self.waiting_max, int(row["waiting"]))
                self.refusals_max = max(self.refusals_max, int(row["refusals"]))
                self.samples += 1
                # a sampling cadence, not a synchronisation: the test waits on conditions
                await asyncio.sleep(0.1)


@asynccontextmanager
async def reconciler(env: dict[str, str], log: Path) -> AsyncIterator[WorkerProcess]:
    """``callwarden reconcile`` (its loop) with thresholds scaled to seconds (the one kind
    deployed, so its attempt budget is bounded by that kind's threshold alone), stopped
    with SIGTERM (exit 0) at the end of the block; killed if the block failed."""
    env = {**env, "CALLWARDEN_RECONCILE_KINDS": KIND,
           "CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDARD": "30",
           "CALLWARDEN_RECONCILE_HEADROOM_S": "5",
           "CALLWARDEN_RECONCILE_REPOLL_INTERVAL_S": "0.3",
           "CALLWARDEN_RECONCILE_ATTEMPT_CAP": "200",
           "CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S": "2",
           "CALLWARDEN_RECONCILE_SCAN_INTERVAL_S": "0.2",
           "CALLWARDEN_RECONCILE_CLAIM_LEASE_S": "10",
           "CALLWARDEN_CALL_HEARTBEAT_EVERY_S": "0.5"}
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "callwarden.cli", "reconcile", env=env, cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out)
    process = WorkerProcess(proc, log)
    try:
        yield process
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    assert proc.returncode is None, process.logs()
    assert await process.terminate(30.0) == 0, process.logs()


def creates_per_job(sim: RunningSimulator) -> tuple[Counter[str], int]:
    """Processed KIE creates per job (the job named by the prompt), and every create the
    journal holds (refused or faulted ones included)."""
    entries = sim.sim.journal.entries("kie", "create")
    per_job: Counter[str] = Counter()
    for e in entries:
        if e.processed:
            per_job[str(e.json()["input"]["prompt"]).removeprefix("job ")] += 1
    return per_job, len(entries)


@pytest.mark.timeout(RUN_DEADLINE_S + 60)
async def test_a_fleet_with_a_killed_worker_holds_the_cap_with_no_refusal_and_one_create_each(
        db_url: str, conn: Conn, workers: Workers, sim: RunningSimulator,
        tmp_path: Path) -> None:
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight) "
                       "VALUES ('kie-main', ARRAY[%s], %s)", (KIND, CAP))
    sim.sim.accounts["kie"].limits = Limits(max_in_flight=CAP)
    media = tmp_path / "media"
    jobs = await enqueue(conn, JOBS)

    began = time.monotonic()
    watch, stop = Watch(), asyncio.Event()
    watching = asyncio.create_task(watch.run(db_url, stop))
    try:
        async with reconciler(environment(db_url, sim, media),
                              tmp_path / "reconcile.log") as rec:
            victim = await workers.start(worker_args(1, media), failpoints=VICTIM_FAILPOINT)
            survivors = [await workers.start(worker_args(3, media)) for _ in range(2)]

            # the victim dies mid-run, by SIGKILL, with its one call open upstream
            assert await victim.exited(RUN_DEADLINE_S) == -signal.SIGKILL, victim.logs()
            killed_after_s = time.monotonic() - began
            owner = re.search(r"worker (\S+) started", victim.logs())
            assert owner is not None, victim.logs()
            orphan = await value(conn, "SELECT id FROM jobs WHERE queue_owner = %s "
                                       "AND call_state = 'polling'", owner.group(1))
            assert orphan is not None  # its call, open: it holds a slot until recovered
            done_at_kill = await value(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) "
                                             "AND status = 'completed'", jobs)
            assert 0 < done_at_kill < JOBS  # mid-run

            async def all_completed() -> bool:
                for w in (rec, *survivors):
                    assert w.proc.returncode is None, w.logs()
                ended = await value(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) "
                                          "AND status NOT IN ('pending', 'processing')", jobs)
                return bool(ended == JOBS)
            await until("every job to end", all_completed,
                        deadline_s=RUN_DEADLINE_S - (time.monotonic() - began))
            run_s = time.monotonic() - began
            for w in survivors:
                assert await w.terminate(30.0) == 0, w.logs()
    finally:
        stop.set()
        await watching

    account = sim.sim.accounts["kie"].to_json()
    refusals = sum(len(WAITING_LINE.findall(w.logs())) for w in workers.started)
    recovered_by = await value(conn, "SELECT actor FROM callwarden.call_events "
                                     "WHERE job_id = %s AND type = 'UpstreamSucceeded'", orphan)
    figures: dict[str, Any] = {
        "jobs": JOBS, "cap": CAP, "run_s": round(run_s, 1),
        "victim_killed_after_s": round(killed_after_s, 1), "completed_at_kill": done_at_kill,
        "orphan_recovered_by": str(recovered_by).split(":")[0],
        "max_in_flight_seen": account["max_in_flight_seen"],
        "creates_accepted": account["creates_accepted"],
        "creates_refused_rate": account["creates_refused_rate"],
        "creates_refused_concurrency": account["creates_refused_concurrency"],
        "waiting_log_lines": refusals, "open_calls_max_sampled": watch.open_max,
        "waiting_jobs_max_sampled": watch.waiting_max,
        "refusals_of_one_job_max_sampled": watch.refusals_max, "samples": watch.samples}
    print(json.dumps(figures))  # shown with -s: the run's figures (docs/admission.md)

    # the provider's view: the cap held upstream, nothing refused, one create per job
    assert account["max_in_flight_seen"] <= CAP, figures
    assert (account["creates_refused_rate"], account["creates_refused_concurrency"]) == (0, 0)
    per_job, journaled = creates_per_job(sim)
    assert journaled == JOBS  # no create was refused, faulted or repeated
    assert per_job == Counter({str(j): 1 for j in jobs})
    assert account["creates_accepted"] == JOBS
    # the database's view, sampled through the run: never more than the cap open
    assert watch.samples > 0
    assert watch.open_max <= CAP, figures
    # the cap bound: starts were refused and the jobs waited (deferred, never failed)
    assert refusals > 0, figures
    assert recovered_by is not None

    # every job completed once: one reservation committed by one settling event, its
    # media stored, none left waiting, the projections equal to the log
    row = await (await conn.execute(
        "SELECT count(*) FILTER (WHERE j.status = 'completed' AND j.call_state = 'completed')"
        "   AS completed,"
        " count(*) FILTER (WHERE (SELECT array_agg(u.status) FROM usage_logs u"
        "   WHERE u.job_id = j.id) = ARRAY['committed']) AS committed_once,"
        " count(*) FILTER (WHERE (SELECT count(*) FROM callwarden.call_events e"
        "   WHERE e.job_id = j.id AND e.type = ANY(%s)) = 1) AS settled_once,"
        " count(*) FILTER (WHERE (SELECT count(*) FROM assets a WHERE a.job_id = j.id) = 1)"
        "   AS one_asset "
        "FROM jobs j WHERE j.id = ANY(%s)", (SETTLING, jobs))).fetchone()
    assert row is not None
    assert dict(row) == {"completed": JOBS, "committed_once": JOBS, "settled_once": JOBS,
                         "one_asset": JOBS}
    assert await value(conn, "SELECT count(*) FROM callwarden.waiting") == 0
    summary, _ = await verify(conn)
    assert summary.ok, summary
