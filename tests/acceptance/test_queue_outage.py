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
import json
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psutil  # type: ignore[import-untyped]
import pytest
import redis.asyncio as aioredis
from arq.connections import ArqRedis
from psycopg.conninfo import conninfo_to_dict

from callwarden.calls.config import CallConfig
from callwarden.database.databases import create_database
from callwarden.database.db import Conn, EmbeddedServer, connect
from callwarden.database.jobs import create_job
from callwarden.database.migrate import migrate
from callwarden.database.write import execute_script
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.arq import CTX_KEY, OUTAGE_KEY, enqueue_call, run_job_call
from callwarden.queue.celery import TASK_NAME as CELERY_TASK
from callwarden.queue.process import RunnerOptions, open_runner
from tests.acceptance.conftest import ROOT, Workers
from tests.support.queues import (
    Queues,
    QueueWorker,
    completed_once,
    rooted,
    send_call,
    send_celery_task,
)

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
                    worker: QueueWorker, *, past_limit_lines: int | None = 1) -> None:
    """Once the database is back the job runs: exactly one call, completed and settled
    once. A job left with no call (``reserved`` forever) fails here, with its row.
    ``past_limit_lines``: the worker's "past the outage limit" lines for it (``None``: not
    checked)."""
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
    if past_limit_lines is not None:  # one line per job, not per try
        assert len(re.findall(PAST_LIMIT, worker.logs())) == past_limit_lines


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


# -- the review of issue 24.1: a broker hiccup during the outage, a read-only database ----

# What the code before the review logged when it dropped the job: Celery acked a retry
# whose publish failed (``reject requeue=False``), and both queues failed a job on a
# ``DatabaseError`` that was not ``DatabaseUnavailable``.
REJECTED = r"reject requeue=(True|False)"
FAILED = r"failed, DatabaseError|raised unexpected: DatabaseError"
OUTAGE_RETRY = r"; outage retry \d+ in"
HICCUP_TASK = "t-hiccup"


@asynccontextmanager
async def _redis_refusing(redis_url: str, pid: int) -> AsyncIterator[None]:
    """Inside the block, Redis has cut every connection of process ``pid`` and refuses new
    ones (``maxclients`` below the connections it keeps: everyone else's stay up)."""
    port = urlsplit(redis_url).port
    client = aioredis.Redis.from_url(redis_url)
    try:
        before = (await client.config_get("maxclients"))["maxclients"]
        ours = sorted(c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                      if c.raddr and c.raddr.port == port)
        assert ours, f"process {pid} holds no connection to Redis"
        await client.config_set("maxclients", 1)
        try:
            for local in ours:
                assert await client.client_kill(f"127.0.0.1:{local}")
            yield
        finally:
            await client.config_set("maxclients", before)
    finally:
        await client.aclose()


@pytest.mark.timeout(180)
async def test_celery_task_outlives_a_redis_hiccup_during_an_outage(
        server: EmbeddedServer, db: str, job: uuid.UUID, queues: Queues, redis_url: str,
        sim: RunningSimulator) -> None:
    """The database is down and the task is being retried; then the pool process loses
    its Redis connections and cannot make new ones, so the next retry cannot be
    published. Celery's ``retry`` then raises ``Reject(requeue=False)`` and the worker
    acked the message: the job was gone. Now the message is rejected with
    ``requeue=True`` (put back by the worker's own connection, or left unacked for the
    visibility timeout), and once Redis and the database answer, the job runs once."""
    worker = await queues.celery("hiccup", concurrency=1)
    [ready] = await worker.line(r"process (\d+) ready", "the pool process's runner")
    server.halt()
    try:
        await send_celery_task(redis_url, job, KIND, REQUEST, task_id=HICCUP_TASK)
        # the pool process has published a retry: it holds its connection to Redis
        await worker.line(rf"Task {CELERY_TASK}\[{HICCUP_TASK}\] retry: Retry in",
                          "a published outage retry")
        async with _redis_refusing(redis_url, int(ready.group(1))):
            await worker.line(REJECTED, "a retry whose publish failed")
    finally:
        server.start()
    await _ran_once(db, sim, job, worker, past_limit_lines=None)
    await worker.line(rf"job {job} kind={KIND} task={HICCUP_TASK} redelivered=\w+ pid=\d+ "
                      r"result=completed", "the task's outcome")
    assert "not published" in worker.logs()


async def _worker_for(queue: str, queues: Queues) -> QueueWorker:
    worker = await (queues.arq() if queue == "arq" else queues.celery(queue, concurrency=1))
    await worker.line(r"process \d+ ready", "the worker's runner")
    return worker


async def _send(queue: str, job: uuid.UUID, arq_redis: ArqRedis, redis_url: str) -> str:
    """Enqueue the job on ``queue``; the pattern of its outcome line once it completed."""
    delivery = await send_call(queue, job, KIND, REQUEST, arq_redis, redis_url)
    return rf"job {job} kind={KIND} {delivery} pid=\d+ "


@pytest.mark.timeout(180)
@pytest.mark.parametrize("queue", ["arq", "celery"])
async def test_a_read_only_database_drops_no_queued_job(
        queue: str, server: EmbeddedServer, db: str, job: uuid.UUID, queues: Queues,
        arq_redis: ArqRedis, redis_url: str, sim: RunningSimulator) -> None:
    """A failover moment: the database answers but refuses writes (read-only, as a
    standby or a primary being demoted does), its sessions cut. The job's tries meet
    ``cannot execute SELECT in a read-only transaction``: before, a plain
    ``DatabaseError``, on which arq failed the job and Celery acked it, leaving it with no
    call and its credits reserved. Now it is an outage: the job is retried, and runs once
    the database accepts writes again (the read-only sessions the worker's pool opened
    meanwhile are dropped, not lent again)."""
    worker = await _worker_for(queue, queues)
    name = conninfo_to_dict(db)["dbname"]
    async with await connect(server.url()) as admin:
        await admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        try:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                "WHERE datname = %s", (name,))
            outcome = await _send(queue, job, arq_redis, redis_url)
            await worker.line(f"{OUTAGE_RETRY}|{FAILED}", "the job's try on a read-only "
                              "database")
        finally:
            await admin.execute(
                f'ALTER DATABASE "{name}" SET default_transaction_read_only = off')
    await _ran_once(db, sim, job, worker, past_limit_lines=None)
    await worker.line(outcome + "result=completed", "the job's outcome")
    assert "database unavailable: cannot execute SELECT in a read-only transaction" in \
        worker.logs()


REFUSE_EVENTS = """
CREATE FUNCTION refuse_events() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'the test refuses every event'; END $$;
CREATE TRIGGER refuse_events BEFORE INSERT ON callwarden.call_events
  FOR EACH ROW EXECUTE FUNCTION refuse_events();
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("queue", ["arq", "celery"])
async def test_a_database_error_before_the_call_started_drops_no_queued_job(
        queue: str, db: str, job: uuid.UUID, queues: Queues, arq_redis: ArqRedis,
        redis_url: str, sim: RunningSimulator) -> None:
    """Any database error before the job's ``CallStarted`` was recorded (here a trigger
    refusing the append: ``RAISE EXCEPTION``, SQLSTATE P0001) leaves a job with no call,
    which nothing but its queue would run: before, arq failed it and Celery acked it. Now
    it is retried on the outage schedule, and runs once the database takes the event."""
    worker = await _worker_for(queue, queues)
    async with await connect(db) as admin:
        await admin.execute(REFUSE_EVENTS)
        try:
            outcome = await _send(queue, job, arq_redis, redis_url)
            await worker.line(f"{OUTAGE_RETRY}|{FAILED}", "the job's refused try")
        finally:
            await admin.execute("DROP TRIGGER refuse_events ON callwarden.call_events")
    await _ran_once(db, sim, job, worker, past_limit_lines=None)
    await worker.line(outcome + "result=completed", "the job's outcome")
    assert "database error before its call started" in worker.logs()


async def _run_eagerly(queues: Queues, job: uuid.UUID) -> tuple[str, str]:
    """The eager host (``tests/acceptance/celery_eager_host.py``) run on the job as a
    process of its own; its stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.acceptance.celery_eager_host", str(job),
        json.dumps(REQUEST), env=rooted(queues.env), cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=RUN_DEADLINE_S)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


@pytest.mark.timeout(120)
async def test_an_eager_celery_task_past_the_limit_names_the_job_it_leaves_reserved(
        server: EmbeddedServer, db: str, job: uuid.UUID, queues: Queues,
        sim: RunningSimulator) -> None:
    """Run eagerly (``task_always_eager``: no queue to keep the job in) with the database
    down, the task is retried within the outage limit, then fails, and the job is left as
    it is: reserved, with no call. Before, that was reported nowhere; now one error line
    names the job and says what the host must do. The host then runs it again, once the
    database is back, and it completes once."""
    server.halt()
    try:
        out, err = await _run_eagerly(queues, job)
    finally:
        server.start()
    assert "state=FAILURE result=DatabaseUnavailable" in out
    left = [line for line in err.splitlines() if line.startswith("ERROR") and str(job) in line]
    assert len(left) == 1, f"no error line names the job left reserved:\n{err}"
    assert "the job is left reserved, with no call" in left[0]
    assert "stays queued" not in err  # nothing is queued when a task runs eagerly
    async with await connect(db) as conn:
        row = await (await conn.execute(
            "SELECT call_state, (SELECT array_agg(u.status) FROM usage_logs u "
            "WHERE u.job_id = j.id) AS credits FROM jobs j WHERE j.id = %s",
            (job,))).fetchone()
        assert row is not None
        assert dict(row) == {"call_state": None, "credits": ["reserved"]}
        out, err = await _run_eagerly(queues, job)  # what the error line tells the host
        assert "state=SUCCESS result=dict" in out, err
        await completed_once(conn, sim, job)
