"""``callwarden demo --queue celery|arq``: the main job on a host's queue instead of the
reference one. The planned jobs are published to Redis (Celery ``send_task`` of
:data:`callwarden.queue.celery.TASK_NAME`; arq :func:`callwarden.queue.arq.enqueue_call`) and run by
``size`` real worker processes (``celery -A callwarden.demo.celery_app worker --pool prefork``,
or ``arq callwarden.demo.arq_app.WorkerSettings``), each in its own process group, SIGKILLed
whole at random and restarted, like the reference fleet (:mod:`callwarden.demo.fleet`).

Redis: ``CALLWARDEN_REDIS_URL``, else a private ``redis-server`` in the demo's folder
(:mod:`callwarden.demo.redis_server`). Each run uses a queue of its own name, so a shared Redis
is safe; its keys there are deleted at the end.

Redelivery is demo-scale, like the calls' settings (those of the reference fleet, given as
``CALLWARDEN_CALL_*``): a Celery message left unacked by a dead worker is restored after an
8 s visibility timeout, by the next worker to start (kombu's ``restore_visible``; the fleet
restarts every worker it kills); a dead arq worker's job is taken again 10 s after its
10 s ``job_timeout``. Both are past the reconciler's 4 s thresholds: the reconciler
usually finishes a dead worker's call first, and the redelivery then reports it terminal
without touching the provider. A call running past either (a hung sync call, a slow
finalization) is delivered twice or cancelled by arq: fenced and left to the reconciler.

celery and arq are imported only here and in the worker processes: the default demo needs
neither (:func:`check_queue` names the extra to install).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from callwarden.calls.config import ENV_PREFIX, CallConfig
from callwarden.database.db import Conn
from callwarden.database.write import execute
from callwarden.demo.fleet import WORKER_FLAGS, WorkerFleet
from callwarden.demo.lost import LostMessages
from callwarden.demo.redis_server import redis_binary, running_redis
from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS
from callwarden.queue.claims import JobSpec, parse_job

__all__ = ["QUEUES", "REDIS_ENV", "QueueFleet", "call_env", "check_queue", "job_specs",
           "queue_fleet"]

QUEUES = ("celery", "arq")
REDIS_ENV = "CALLWARDEN_REDIS_URL"
_EXTRA = {"celery": ("celery", "kombu", "redis"), "arq": ("arq", "redis")}
REDELIVER_S = {"celery": 8.0, "arq": 10.0}  # visibility timeout / job_timeout
CONCURRENCY = 4  # Celery: prefork children per worker; arq: jobs per worker (one loop)
Jobs = Sequence[tuple[uuid.UUID, JobSpec]]


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()


def _ping(url: str) -> str | None:
    """None if Redis at ``url`` answers, else why not."""
    import redis  # the extra's (celery[redis] and arq both bring it)

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, ValueError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


def check_queue(queue: str) -> None:
    """Before anything starts: the queue's extra is installed and a Redis is at hand
    (``CALLWARDEN_REDIS_URL`` answering, or ``redis-server`` installed); else a
    :class:`ConfigError` (exit 2) saying what to do."""
    for module in _EXTRA[queue]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"demo --queue {queue} needs the {queue} extra ({module}: "
                              f'{exc}): pip install "callwarden[{queue}]"') from exc
    need = f"demo --queue {queue} needs Redis: set {REDIS_ENV} or install redis-server"
    url = os.environ.get(REDIS_ENV)
    if url:
        problem = _ping(url)
        if problem is not None:
            raise ConfigError(f"{need} ({REDIS_ENV}={_redacted(url)} does not answer: "
                              f"{problem})")
    elif redis_binary() is None:
        raise ConfigError(f"{need} ({REDIS_ENV} is not set and redis-server is not on PATH)")


def call_env(config: CallConfig) -> dict[str, str]:
    """``CALLWARDEN_CALL_*`` for the reference fleet's call settings: ``config``'s
    leases and timeouts, and the fleet's per-kind poll interval and budget flags."""
    def flag(name: str) -> str:
        return WORKER_FLAGS[WORKER_FLAGS.index(name) + 1]

    env = {f"{ENV_PREFIX}{field.upper()}": str(getattr(config, field))
           for field in ("finalize_lease_s", "heartbeat_every_s", "media_timeout_s",
                         "store_timeout_s", "lease_margin_s")
           if getattr(config, field) is not None}
    for kind in KINDS:
        key = kind.upper().replace("-", "_")
        env[f"{ENV_PREFIX}POLL_INTERVAL_{key}"] = flag("--poll-interval")
        env[f"{ENV_PREFIX}POLL_BUDGET_{key}"] = flag("--poll-budget")
    return env


async def job_specs(conn: Conn) -> list[tuple[uuid.UUID, JobSpec]]:
    """Every job of the demo database and what to run for it (its ``input_data``)."""
    out = []
    for row in await execute(conn, "demo_job_specs", {}):
        spec = parse_job(row["input_data"])
        if isinstance(spec, str):
            raise RuntimeError(f"demo job {row['id']}: {spec}")
        out.append((row["id"], spec))
    return out


class QueueFleet(WorkerFleet):
    """``size`` Celery or arq worker processes on ``redis_url``; :meth:`start` publishes
    ``jobs`` first."""

    new_session = True  # a worker is a process group: Celery's main process and its pool

    def __init__(self, queue: str, size: int, env: dict[str, str], log_dir: Path,
                 redis_url: str, jobs: Jobs) -> None:
        self.queue, self.redis_url, self.jobs = queue, redis_url, jobs
        self.queue_name = f"callwarden-demo-{uuid.uuid4().hex[:8]}"
        super().__init__(size, {**env, REDIS_ENV: redis_url,
                                "CALLWARDEN_DEMO_QUEUE": self.queue_name,
                                "CALLWARDEN_DEMO_REDELIVER_S": str(REDELIVER_S[queue]),
                                "CALLWARDEN_DEMO_CONCURRENCY": str(CONCURRENCY)}, log_dir)
        self.name = queue

    def command(self) -> list[str]:
        if self.queue == "celery":
            return ["-m", "celery", "-A", "callwarden.demo.celery_app", "worker",
                    "--pool", "prefork", "--concurrency", str(CONCURRENCY),
                    "--loglevel", "INFO", "--without-mingle", "--without-gossip",
                    "--without-heartbeat", "-n", f"demo-{self.started}@%h"]
        return ["-m", "arq", "callwarden.demo.arq_app.WorkerSettings"]

    def kill(self, proc: asyncio.subprocess.Process) -> None:
        """SIGKILL the whole group (Celery's pool children too), as a lost host."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def start(self) -> None:
        if self.queue == "celery":
            await asyncio.to_thread(self._send_celery, None)
        else:
            await self._enqueue_arq()
        await super().start()

    def lost_messages(self, unstarted: Callable[[], Awaitable[set[str] | None]]
                      ) -> LostMessages | None:
        """Celery's watch for messages its Redis transport lost (:mod:`callwarden.demo.lost`);
        None for arq, which loses none."""
        if self.queue != "celery":
            return None
        return LostMessages(self.redis_url, self.queue_name, unstarted, self._send_celery)

    def _send_celery(self, only: set[str] | None = None) -> None:
        from celery import Celery

        from callwarden.queue.celery import TASK_NAME

        app = Celery("callwarden-demo-producer", broker=self.redis_url, set_as_current=False)
        try:
            with app.producer_or_acquire() as producer:
                for job_id, spec in self.jobs:
                    if only is not None and str(job_id) not in only:
                        continue
                    app.send_task(TASK_NAME, args=[str(job_id), spec.kind, spec.request,
                                                   spec.operation],
                                  queue=self.queue_name, task_id=str(job_id),
                                  producer=producer)
        finally:
            app.close()

    async def _enqueue_arq(self) -> None:
        from arq import create_pool
        from arq.connections import RedisSettings

        from callwarden.queue.arq import enqueue_call

        redis = await create_pool(RedisSettings.from_dsn(self.redis_url))
        try:
            for job_id, spec in self.jobs:
                await enqueue_call(redis, job_id, spec.kind, spec.request,
                                   operation=spec.operation, _queue_name=self.queue_name)
        finally:
            await redis.aclose()

    def forget(self) -> None:
        """Delete this run's keys from a shared Redis (best effort): its queue, arq's
        job keys, kombu's binding and the messages dead workers left unacked (kombu
        keeps ``[message, exchange, routing key]`` under ``unacked``)."""
        import redis

        keys = [self.queue_name, f"_kombu.binding.{self.queue_name}"]
        if self.queue == "arq":
            keys += [f"arq:{what}:callwarden:{job_id}" for job_id, _ in self.jobs
                     for what in ("job", "result", "in-progress", "retry")]
        with contextlib.suppress(redis.RedisError, OSError):
            client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2)
            try:
                client.delete(*keys)
                for tag, raw in client.hscan_iter("unacked"):
                    with contextlib.suppress(ValueError, TypeError, IndexError):
                        if json.loads(raw)[2] == self.queue_name:
                            client.hdel("unacked", tag)
                            client.zrem("unacked_index", tag)
            finally:
                client.close()


@contextlib.asynccontextmanager
async def queue_fleet(queue: str, size: int, env: dict[str, str], work_dir: Path,
                      jobs: Jobs) -> AsyncIterator[QueueFleet]:
    """A :class:`QueueFleet` on ``CALLWARDEN_REDIS_URL`` or a private server (stopped,
    with every worker, at the end)."""
    async with contextlib.AsyncExitStack() as stack:
        url = shared = os.environ.get(REDIS_ENV)
        if not url:
            server = running_redis(work_dir / "redis")
            try:
                url = await asyncio.to_thread(server.__enter__)
            except (OSError, RuntimeError) as exc:
                raise ConfigError(f"demo --queue {queue}: {exc}") from exc
            stack.push(server.__exit__)
        fleet = QueueFleet(queue, size, env, work_dir, url, jobs)
        try:
            yield fleet
        finally:
            await fleet.stop()  # a second stop is a no-op: nothing left running
            if shared:
                await asyncio.to_thread(fleet.forget)
