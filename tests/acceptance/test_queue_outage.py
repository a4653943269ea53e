"""A database outage longer than a queue's retry budget drops no job (issue 24, item 1).

Each case runs a real worker process (``arq tests.acceptance.arq_app.WorkerSettings``, or
``celery -A tests.acceptance.celery_app worker --pool prefork``) on a real
``redis-server``, against a Postgres server of the module's own, which the test halts
(immediate mode, every connection cut) before the job is enqueued, so that every try of
the job meets the outage. The workers' outage limit is small
(``CALLWARDEN_DB_OUTAGE_LIMIT_S=2``), and so is the host's own retry budget: arq gives a
job up after 2 deliveries, the Celery task has ``max_retries=2``. The server stays down
until the job has gone past both: the code before issue 24.1 logged its final failure
(arq: ``failed, DatabaseUnavailable``; Celery: ``raised unexpected: DatabaseUnavailable``)
and dropped the job; now the worker says the job went past the outage limit, and the test
sees it retried twice more.

Then the server is started again and the test reads SQL: the job must end with exactly
one call, completed, one upstream create, its reservation committed by one settling event
and one audited move from ``reserved``, and projections equal to the log. Never a job
left ``reserved`` with no call.

Also, in process: arq's give-up counts deliveries, not the tries deferred for an outage.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from arq.connections import ArqRedis

from callwarden.calls.config import CallConfig
from callwarden.database.databases import create_database
from callwarden.database.db import Conn, EmbeddedServer, connect
from callwarden.database.jobs import create_job
from callwarden.database.migrate import migrate
from callwarden.database.write import execute_script
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.arq import CTX_KEY, OUTAGE_KEY, enqueue_call, run_job_call
from callwarden.queue.process import RunnerOptions, open_runner
from tests.acceptance.conftest import Workers
from tests.support.queues import Queues, QueueWorker, completed_once, send_celery_task

pytestmark = pytest.mark.xdist_group("fleets")

LIMIT_S = 2.0
KIND = "kie-standard"
REQUEST = {"model": "nano-banana-pro",
           "input": {"prompt": "a cat",
                     "_sim": {"steps": [{"phase": "running", "polls": 1}],
                              "end": "succeeded"}}}
ENV = {"CALLWARDEN_DB_OUTAGE_LIMIT_S": str(LIMIT_S),
       "CALLWARDEN_TEST_MAX_DELIVERIES": "2",  # arq: the host's give-up after 2 tries
       "CALLWARDEN_TEST_MAX_RETRIES": "2",  # Celery: the host's max_retries on the task
       "CALLWARDEN_CALL_POLL_INTERVAL_KIE_STANDARD": "0.1",
       "CALLWARDEN_CALL_HEARTBEAT_EVERY_S": "0.2",
       "CALLWARDEN_TEST_VISIBILITY_S": "120", "CALLWARDEN_TEST_JOB_TIMEOUT_S": "120",
       "CALLWARDEN_TEST_MAX_JOBS": "1"}
# The budget ran out with the database down: the code before 24.1 failed the job ...
GAVE_UP = r"failed, DatabaseUnavailable|raised unexpected: DatabaseUnavailable"
# ... where a job must stay queued: one line when it goes past the limit, one per retry.
PAST_LIMIT = r"past the outage limit"
RETRIED = r"database unavailable; outage retry \d+"
# The code before 24.1 waited twice 30 s for a pooled connection on each of its 3 tries:
# its final failure came after ~190 s. Now the job is past its budget within seconds.
BUDGET_DEADLINE_S = 240.0
RUN_DEADLINE_S = 40.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """A Postgres of this module's own: the tests halt it."""
    s = EmbeddedServer(tmp_path_factory.mktemp("pg"), cleanup="delete")
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def db(server: EmbeddedServer) -> str:
    url = create_database(server.url(), f"outage_{uuid.uuid4().hex[:12]}")
    async with await connect(url) as conn:
        await migrate(conn)
        await execute_script(conn, "demo_audit_trigger")
    return url


@pytest.fixture
async def job(db: str) -> uuid.UUID:
    async with await connect(db) as conn:
        return await create_job(conn, input_data={"provider_kind": KIND, "request": REQUEST},
                                credits=10)


@pytest.fixture
async def queues(db: str, sim: RunningSimulator, redis_url: str,
                 tmp_path: Path) -> AsyncIterator[Queues]:
    env = Workers(db, sim, tmp_path).env(None, {
        **ENV, "CALLWARDEN_REDIS_URL": redis_url,
        "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media")})
    qs = Queues(env, tmp_path)
    try:
        yield qs
    finally:
        await qs.kill_leftovers()


async def _past_the_budget(worker: QueueWorker) -> None:
    """Wait until the job has run out of every retry budget with the database down: its
    final failure, or (once it went past the outage limit) two more retries."""
    [found] = await worker.line(f"{PAST_LIMIT}|{GAVE_UP}",
                                "the job to go past its retry budget",
                                deadline_s=BUDGET_DEADLINE_S)
    if re.match(GAVE_UP, found.group(0)):
        return  # dropped: what the job's row says next is the failure
    retried = len(re.findall(RETRIED, worker.logs()))
    await worker.line(RETRIED, "two retries past the outage limit", count=retried + 2)


async def _ran_once(db: str, sim: RunningSimulator, job: uuid.UUID,
                    worker: QueueWorker) -> None:
    """Once the database is back the job runs: exactly one call, completed and settled
    once. A job left with no call (``reserved`` forever) fails here, with its row."""
    async with await connect(db) as conn:
        deadline = time.monotonic() + RUN_DEADLINE_S
        while True:
            row = await (await conn.execute(
                "SELECT call_state, (SELECT array_agg(u.status) FROM usage_logs u "
                "WHERE u.job_id = j.id) AS credits FROM jobs j WHERE j.id = %s",
                (job,))).fetchone()
            assert row is not None
            if row["call_state"] == "completed":
                break
            if time.monotonic() > deadline:
                tail = "\n".join(worker.logs().splitlines()[-25:])
                pytest.fail(f"the job did not run once the database was back: "
                            f"call_state={row['call_state']} credits={row['credits']}\n"
                            f"worker log (tail):\n{tail}")
            await asyncio.sleep(0.1)  # a polling period, not synchronisation
        await completed_once(conn, sim, job)
    assert len(re.findall(PAST_LIMIT, worker.logs())) == 1  # one line per job, not per try


@pytest.mark.timeout(360)  # the deadlines above, a halt and a start of the server
async def test_arq_job_outlives_an_outage_longer_than_its_retry_budget(
        server: EmbeddedServer, db: str, job: uuid.UUID, queues: Queues,
        arq_redis: ArqRedis, sim: RunningSimulator) -> None:
    worker = await queues.arq()
    await worker.line(r"process \d+ ready", "the worker's runner")
    server.halt()
    down_at = time.monotonic()
    try:
        assert await enqueue_call(arq_redis, job, KIND, REQUEST) is not None
        await _past_the_budget(worker)
    finally:
        server.start()
    assert time.monotonic() - down_at > LIMIT_S
    await _ran_once(db, sim, job, worker)
    await worker.line(rf"job {job} kind={KIND} arq_job=callwarden:{job} try=\d+ pid=\d+ "
                      r"result=completed", "the job's outcome")


@pytest.mark.timeout(360)
async def test_celery_task_outlives_an_outage_longer_than_its_retry_budget(
        server: EmbeddedServer, db: str, job: uuid.UUID, queues: Queues, redis_url: str,
        sim: RunningSimulator) -> None:
    worker = await queues.celery("outage", concurrency=1)
    await worker.line(r"process \d+ ready", "the worker's runner")
    server.halt()
    down_at = time.monotonic()
    try:
        await send_celery_task(redis_url, job, KIND, REQUEST, task_id="t-outage")
        await _past_the_budget(worker)
    finally:
        server.start()
    assert time.monotonic() - down_at > LIMIT_S
    await _ran_once(db, sim, job, worker)
    await worker.line(rf"job {job} kind={KIND} task=t-outage redelivered=\w+ pid=\d+ "
                      r"result=completed", "the task's outcome")


async def test_arq_gives_a_job_up_after_deliveries_not_counting_outage_retries(
        db_url: str, conn: Conn, sim: RunningSimulator, arq_redis: ArqRedis,
        tmp_path: Path) -> None:
    """In process, on real Redis and Postgres: arq's ``job_try`` counts every start, the
    tries deferred for an outage too. Try 7 of a job two of whose tries met an outage is
    its 5th delivery, and runs (``max_deliveries`` 5); with one outage retry it is the
    6th, and the job is given up (refunded: no call ever started). Either way the count
    is cleared once the arq job ends."""
    options = RunnerOptions(database_url=db_url, settings=sim.settings,
                            media=LocalFolderStore(tmp_path / "media"),
                            config=CallConfig(poll_interval_s={KIND: 0.05}))
    ran_job, given_job = await create_job(conn, credits=5), await create_job(conn, credits=5)
    await arq_redis.set(OUTAGE_KEY + "a", 2)
    await arq_redis.set(OUTAGE_KEY + "b", 1)
    process = await open_runner(options, role="arq")
    try:
        ctx = {CTX_KEY: process, "redis": arq_redis, "job_try": 7}
        ran = await run_job_call({**ctx, "job_id": "a"}, ran_job, KIND, REQUEST)
        given = await run_job_call({**ctx, "job_id": "b"}, given_job, KIND, REQUEST)
    finally:
        await process.close()
    assert (ran.result, given.result) == ("completed", "cancelled")
    assert given.detail == "given up: delivered 6 times (7 tries)"
    assert sim.sim.journal.count("kie", "create") == 1
    assert await arq_redis.exists(OUTAGE_KEY + "a", OUTAGE_KEY + "b") == 0
