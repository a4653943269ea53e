"""The example host (docs/examples/acme_host), run as a host runs it (issue 25 item 7): its
web app (``app.py``) and two prefork Celery workers (``worker.py``) as processes from the
host's folder — where its own ``events.py`` and ``providers.py`` live — calling Acme Render
(a kind callwarden does not know) and Replicate (a built-in kind) through the host's own
clients. Every worker is SIGKILLed with its calls in flight; ``callwarden reconcile``, a
separate process, finishes them through the same clients.

Invariants, read by SQL and from the providers' own counts: one upstream task per job,
every reservation settled exactly once (committed), none left reserved, every job terminal
(completed, its file stored), the projections equal to the log; and every request to
Replicate, the reconciler's included, made by the host's client (its User-Agent)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from callwarden.database.db import Conn
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.replay.verify import verify
from tests.acceptance.conftest import KEY_VARS, ROOT
from tests.support.acme import KEY, Acme, running_acme
from tests.support.queues import QueueWorker, until, value

HOST = ROOT / "docs" / "examples" / "acme_host"
RUNNING = {"steps": [{"phase": "running", "seconds": 600}], "end": "succeeded"}
PER_KIND = 3

pytestmark = pytest.mark.xdist_group("fleets")


@pytest.fixture
async def acme() -> AsyncIterator[Acme]:
    async with running_acme() as server:
        yield server


class Host:
    """The host's processes (each in its own process group), killed at teardown."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: list[QueueWorker] = []

    async def start(self, *args: str, **extra: str) -> QueueWorker:
        log = self.logs / f"host-{len(self.procs) + 1}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *args, env={**self.env, **extra}, cwd=HOST,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True)
        self.procs.append(QueueWorker(proc, log))
        return self.procs[-1]

    async def celery(self, name: str) -> QueueWorker:
        return await self.start(
            "-m", "celery", "-A", "worker", "worker", "--pool", "prefork", "--concurrency",
            str(PER_KIND), "--loglevel", "INFO", "--without-mingle", "--without-gossip",
            "--without-heartbeat", "-n", f"{name}@%h")

    async def stop(self) -> None:
        for p in self.procs:
            if p.proc.returncode is None:
                p.kill()
                await p.proc.wait()


@pytest.fixture
async def host(db_url: str, redis_url: str, sim: RunningSimulator, acme: Acme,
               tmp_path: Path) -> AsyncIterator[Host]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALLWARDEN_", "AWS_")) and k not in KEY_VARS}
    env.update({"DATABASE_URL": db_url, "REDIS_URL": redis_url,
                "CALLWARDEN_PROVIDERS": "providers:PROVIDERS",
                "CALLWARDEN_ACME_URL": acme.url, "ACME_API_KEY": KEY,
                "CALLWARDEN_REPLICATE_URL": sim.url("replicate"),
                "REPLICATE_API_TOKEN": sim.sim.api_key,
                "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media")})
    running = Host(env, tmp_path)
    try:
        yield running
    finally:
        await running.stop()


async def order(http: aiohttp.ClientSession, base: str, kind: str, request: dict[str, object]
                ) -> uuid.UUID:
    async with http.post(f"{base}/renders", json={"user_id": "u-7", "kind": kind,
                                                  "request": request}) as resp:
        assert resp.status == 202, await resp.text()
        return uuid.UUID((await resp.json())["job_id"])


async def test_the_example_host_loses_nothing_when_its_workers_are_killed(
        host: Host, conn: Conn, sim: RunningSimulator, acme: Acme) -> None:
    app = await host.start("app.py", "--port", "0")
    line = await app.line(r"acme_host on (http://\S+)", "the app's address")
    base = line[0].group(1)
    workers = [await host.celery("w1"), await host.celery("w2")]
    async with aiohttp.ClientSession() as http:
        jobs = [await order(http, base, "acme-render", {"prompt": f"fox {i}"})
                for i in range(PER_KIND)]
        jobs += [await order(http, base, "replicate-prediction", {
            "version": "owner/model", "input": {"prompt": f"owl {i}", "_sim": RUNNING}})
            for i in range(PER_KIND)]

        async def all_polling() -> bool:
            polling = await value(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) "
                                        "AND call_state = 'polling'", jobs)
            return bool(polling == len(jobs))
        await until("every call to be polling", all_polling)
        for worker in workers:
            worker.kill()  # the whole group: the main process and its pool children
            await worker.exited()

        acme.release()
        sim.sim.clock.advance(601)  # both providers finish after the workers died
        reconciler = await host.start(
            "-m", "callwarden.cli", "reconcile",
            CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S="1",
            CALLWARDEN_CALL_HEARTBEAT_EVERY_S="0.5",
            CALLWARDEN_RECONCILE_SCAN_INTERVAL_S="0.2")

        async def all_ended() -> bool:
            assert reconciler.proc.returncode is None, reconciler.logs()
            ended = await value(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) "
                                      "AND status NOT IN ('pending', 'processing')", jobs)
            return bool(ended == len(jobs))
        await until("the reconciler to finish every call", all_ended, deadline_s=90)
        reconciler.proc.send_signal(signal.SIGTERM)
        assert await reconciler.exited() == 0, reconciler.logs()
        async with http.get(f"{base}/renders/{jobs[0]}") as resp:
            assert (await resp.json())["status"] == "completed"  # what the host's app reads

    statuses = await value(conn, "SELECT array_agg(DISTINCT status) FROM jobs "
                                 "WHERE id = ANY(%s)", jobs)
    assert statuses == ["completed"]
    settled = await value(conn, "SELECT array_agg(status ORDER BY job_id) FROM usage_logs "
                                "WHERE job_id = ANY(%s)", jobs)
    assert settled == ["committed"] * len(jobs)  # one reservation each, settled once
    assert await value(conn, "SELECT count(*) FROM usage_logs WHERE status = 'reserved'") == 0
    assets = await value(conn, "SELECT count(DISTINCT job_id) FROM assets "
                               "WHERE job_id = ANY(%s)", jobs)
    assert assets == len(jobs)
    assert len(acme.renders) == PER_KIND  # one Acme render per job
    assert sim.sim.journal.count("replicate", "create") == PER_KIND
    agents = {e.headers.get("user-agent") for e in sim.sim.journal.entries("replicate")}
    assert agents == {"acme-host/1.0"}  # the host's client, on every path
    recovered = await value(conn, "SELECT count(DISTINCT job_id) FROM callwarden.call_events "
                                  "WHERE job_id = ANY(%s) AND type = 'UpstreamSucceeded' "
                                  "AND actor LIKE 'reconciler%%'", jobs)
    assert recovered == len(jobs)  # none finished before the kill: all were recovered
    summary, _ = await verify(conn)
    assert summary.ok, summary
