"""The example host (docs/examples/acme_host), run as a host runs it (issue 25 item 7): its
web app (``app.py``) and two prefork Celery workers (``worker.py``) as processes from the
host's folder — where its own ``events.py``, ``vendors.py`` and ``providers.py`` live —
calling Acme Render (a kind callwarden does not know) and Replicate (a built-in kind)
through the host's own clients. Every worker is SIGKILLed with its calls in flight;
``callwarden reconcile``, a separate process, finishes them through the same clients.

What the host's glue counts (``bench/glue.py``) is what runs here: each process is started
from its ``Procfile`` line (``release`` first), with its ``callwarden.env`` (only the
media folder is the test's own), and its migrations (``db/``) applied as its own tool applies
them (its ``accounts``, and the settlement hook on ``usage_logs``).

Invariants, read by SQL and from the providers' own counts: one upstream task per job,
every reservation settled exactly once (committed, or refunded for the render Acme fails),
none left reserved, every job terminal (completed with its file stored, at the URL the
host serves it at), the balance back to what was held and not charged (the hook), the
projections equal to the log; and every request to Replicate, the reconciler's included,
made by the host's client (its User-Agent)."""

from __future__ import annotations

import asyncio
import os
import shlex
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
BALANCE = 100

pytestmark = pytest.mark.xdist_group("fleets")


@pytest.fixture
async def acme() -> AsyncIterator[Acme]:
    async with running_acme() as server:
        yield server


def procfile() -> dict[str, list[str]]:
    """The host's ``Procfile``: each process's command line, ``$PORT`` left to fill."""
    lines = (HOST / "Procfile").read_text(encoding="utf-8").splitlines()
    return {name.strip(): shlex.split(command) for name, command in
            (line.split(":", 1) for line in lines if line.strip())}


def settings_file() -> dict[str, str]:
    """The host's ``callwarden.env``: ``NAME=value`` lines."""
    lines = (HOST / "callwarden.env").read_text(encoding="utf-8").splitlines()
    return dict(line.strip().split("=", 1) for line in lines
                if line.strip() and not line.startswith("#"))


class Host:
    """The host's processes (each in its own process group), killed at teardown."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.media = Path(env["CALLWARDEN_MEDIA_DIR"])
        self.procs: list[QueueWorker] = []

    async def start(self, process: str, *args: str, **extra: str) -> QueueWorker:
        """The ``Procfile``'s ``process`` (its programs found in this Python's folder),
        with ``args`` after its own."""
        log = self.logs / f"host-{len(self.procs) + 1}.log"
        command = [a.replace("$PORT", "0") for a in procfile()[process]]
        program = Path(sys.executable) if command[0] == "python" else \
            Path(sys.executable).parent / command[0]
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                str(program), *command[1:], *args, env={**self.env, **extra}, cwd=HOST,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True)
        self.procs.append(QueueWorker(proc, log))
        return self.procs[-1]

    async def celery(self, name: str) -> QueueWorker:
        return await self.start(
            "worker", "--concurrency", str(PER_KIND + 1), "--loglevel", "INFO",
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-n", f"{name}@%h")

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
    env.update(settings_file())
    env.update({"DATABASE_URL": db_url, "REDIS_URL": redis_url,
                "CALLWARDEN_ACME_URL": acme.url, "ACME_API_KEY": KEY,
                "CALLWARDEN_REPLICATE_URL": sim.url("replicate"),
                "REPLICATE_API_TOKEN": sim.sim.api_key,
                "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media")})
    running = Host(env, tmp_path)
    try:
        yield running
    finally:
        await running.stop()


async def order(http: aiohttp.ClientSession, base: str, kind: str, request: dict[str, object],
                user: str = "u-7") -> uuid.UUID:
    async with http.post(f"{base}/renders", json={"user_id": user, "kind": kind,
                                                  "request": request}) as resp:
        assert resp.status == 202, await resp.text()
        return uuid.UUID((await resp.json())["job_id"])


async def migrated(host: Host, conn: Conn) -> None:
    """The host's release: ``callwarden migrate`` (its ``Procfile``), then its own
    migrations in order, as its own tool runs them."""
    release = await host.start("release")
    assert await release.exited() == 0, release.logs()
    for migration in sorted((HOST / "db").glob("*.sql")):
        await conn.execute(migration.read_text(encoding="utf-8").encode())
    await conn.execute("INSERT INTO accounts (user_id, balance) VALUES ('u-7', %s), "
                       "('u-8', 1)", (BALANCE,))


async def test_the_example_host_loses_nothing_when_its_workers_are_killed(
        host: Host, conn: Conn, sim: RunningSimulator, acme: Acme) -> None:
    await migrated(host, conn)
    app = await host.start("web")
    line = await app.line(r"acme_host on (http://\S+)", "the app's address")
    base = line[0].group(1)
    workers = [await host.celery("w1"), await host.celery("w2")]
    acme.failing.add("a fox that will not render")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}/renders", json={
                "user_id": "u-8", "kind": "acme-render", "request": {"prompt": "x"}}) as resp:
            assert resp.status == 402  # the balance holds less than the price: no job
        jobs = [await order(http, base, "acme-render", {"prompt": f"fox {i}"})
                for i in range(PER_KIND)]
        jobs += [await order(http, base, "replicate-prediction", {
            "version": "owner/model", "input": {"prompt": f"owl {i}", "_sim": RUNNING}})
            for i in range(PER_KIND)]
        failing = await order(http, base, "acme-render", {"prompt": "a fox that will not render"})

        async def all_polling() -> bool:
            polling = await value(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) "
                                        "AND call_state = 'polling'", [*jobs, failing])
            return bool(polling == len(jobs) + 1)
        await until("every call to be polling", all_polling)
        for worker in workers:
            worker.kill()  # the whole group: the main process and its pool children
            await worker.exited()

        acme.release()
        sim.sim.clock.advance(601)  # both providers finish after the workers died
        reconciler = await host.start(
            "reconciler",
            CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S="1",
            CALLWARDEN_CALL_HEARTBEAT_EVERY_S="0.5",
            CALLWARDEN_RECONCILE_SCAN_INTERVAL_S="0.2")

        async def all_ended() -> bool:
            assert reconciler.proc.returncode is None, reconciler.logs()
            ended = await value(conn, "SELECT count(*) FROM jobs WHERE id = ANY(%s) "
                                      "AND status NOT IN ('pending', 'processing')",
                                [*jobs, failing])
            return bool(ended == len(jobs) + 1)
        await until("the reconciler to finish every call", all_ended, deadline_s=90)
        reconciler.proc.send_signal(signal.SIGTERM)
        assert await reconciler.exited() == 0, reconciler.logs()
        async with http.get(f"{base}/renders/{jobs[0]}") as resp:
            read = await resp.json()  # what the host's app reads: its rows
        assert read["status"] == "completed"
        assert read["files"] == [f"{settings_file()['CALLWARDEN_MEDIA_BASE_URL']}/"
                                 f"{jobs[0]}/0.png"]  # the URL the host serves the file at
        assert (host.media / str(jobs[0]) / "0.png").is_file()

    statuses = await value(conn, "SELECT array_agg(DISTINCT status) FROM jobs "
                                 "WHERE id = ANY(%s)", jobs)
    assert statuses == ["completed"]
    settled = await value(conn, "SELECT array_agg(status ORDER BY job_id) FROM usage_logs "
                                "WHERE job_id = ANY(%s)", jobs)
    assert settled == ["committed"] * len(jobs)  # one reservation each, settled once
    assert await value(conn, "SELECT count(*) FROM usage_logs WHERE status = 'reserved'") == 0
    assert await value(conn, "SELECT status FROM usage_logs WHERE job_id = %s",
                       failing) == "refunded"
    # the hook: each settlement gave back what was held and not charged (all of the
    # refunded render's price), once
    charged = await value(conn, "SELECT sum(credits_charged) FROM usage_logs "
                                "WHERE job_id = ANY(%s)", [*jobs, failing])
    assert charged == PER_KIND * (5 + 8)
    assert await value(conn, "SELECT balance FROM accounts WHERE user_id = 'u-7'") \
        == BALANCE - charged
    assets = await value(conn, "SELECT count(DISTINCT job_id) FROM assets "
                               "WHERE job_id = ANY(%s)", jobs)
    assert assets == len(jobs)
    assert len(acme.renders) == PER_KIND + 1  # one Acme render per job
    assert sim.sim.journal.count("replicate", "create") == PER_KIND
    agents = {e.headers.get("user-agent") for e in sim.sim.journal.entries("replicate")}
    assert agents == {"acme-host/1.0"}  # the host's client, on every path
    recovered = await value(conn, "SELECT count(DISTINCT job_id) FROM callwarden.call_events "
                                  "WHERE job_id = ANY(%s) AND type = 'UpstreamSucceeded' "
                                  "AND actor LIKE 'reconciler%%'", jobs)
    assert recovered == len(jobs)  # none finished before the kill: all were recovered
    summary, _ = await verify(conn)
    assert summary.ok, summary
