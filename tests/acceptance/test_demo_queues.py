"""``callwarden demo --queue celery|arq`` as a user runs it (issue 16): the main job on real
Celery (prefork) or arq worker processes over Redis, SIGKILLed at random and restarted,
with the demo's own invariants checked with SQL afterwards — every job terminal, at most
one upstream create per job, every reservation settled exactly once, no credit leaked,
the projections equal to the fold of the log — and exit status 0. An embedded Postgres
(``DATABASE_URL`` unset) in the test's folder: one outside pytest's numbered temp folders,
which a pytest session started meanwhile (by another engineer) may prune under a run.

Celery runs on a Redis of the test's (``CALLWARDEN_REDIS_URL``: what a host with a Redis
does), which the demo leaves as it found it; arq on the private ``redis-server`` the demo
starts itself. Without a Redis the demo exits 2 before anything starts, saying what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from tests.debian import binary
from tests.redis import MISSING, running_redis
from tests.support.processes import assert_invariants

# One process runs every fleet test (README: the tests run in two), so two fleets of
# worker processes never compete for the cores against their deadlines.
pytestmark = pytest.mark.xdist_group("fleets")

JOBS = 40
DEADLINE_S = 180
NEEDS_REDIS = "demo --queue celery needs Redis: set CALLWARDEN_REDIS_URL or install redis-server"


def _demo(data_dir: Path, queue: str, redis_url: str | None, *, lose_one: bool = False
          ) -> subprocess.CompletedProcess[str]:
    """The demo as a process. ``lose_one``: once the demo has published its jobs to the
    shared Redis, take one message off its queue and drop it, as a worker SIGKILLed
    between kombu's BRPOP and its unacked write does (engine/demo/lost.py)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "CALLWARDEN_REDIS_URL")}
    if redis_url is not None:
        env["CALLWARDEN_REDIS_URL"] = redis_url
    argv = [sys.executable, "-m", "callwarden.cli", "--data-dir", str(data_dir), "demo",
            "--queue", queue, "--jobs", str(JOBS), "--workers", "2", "--kill-rate", "0.3",
            "--seed", "3", "--json"]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        if lose_one:
            assert redis_url is not None
            _drop_one_message(redis_url, proc)
        try:
            out, err = proc.communicate(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _drop_one_message(redis_url: str, proc: subprocess.Popen[str]) -> None:
    """RPOP one message of the demo's queue (``callwarden-demo-*``) and throw it away.
    Waits on Redis for the queue to fill (bounded), not on a clock."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            for key in cast(list[bytes], client.keys("callwarden-demo-*")):
                if client.type(key) == b"list" and client.rpop(key.decode()) is not None:
                    return
            time.sleep(0.01)  # polling Redis for the condition
        raise AssertionError("the demo's queue never filled")
    finally:
        client.close()


def _passed(proc: subprocess.CompletedProcess[str], data_dir: Path, queue: str
            ) -> dict[str, object]:
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted((data_dir / "demo-files").glob(f"{queue}-*.log"))[:3])
    assert proc.returncode == 0, proc.stderr[-3000:] + logs
    summary: dict[str, object] = json.loads(proc.stdout)
    assert_invariants(summary, JOBS)
    assert summary["queue"] == queue
    assert isinstance(summary["workers_killed"], int)
    assert summary["workers_killed"] >= 1
    return summary


@pytest.fixture
def data_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="cw-demo-queues-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def shared_redis(data_dir: Path) -> Iterator[str]:
    with running_redis(data_dir / "shared-redis") as url:
        yield url


def test_demo_on_celery_passes_with_workers_killed(data_dir: Path, shared_redis: str) -> None:
    """One message is lost outright too (dropped from the queue from outside): the demo
    still ends with every job terminal, because its watch published that job again."""
    summary = _passed(_demo(data_dir, "celery", shared_redis, lose_one=True), data_dir,
                      "celery")
    assert cast(int, summary["messages_lost"]) >= 1
    # Its queue, binding and the messages its dead workers left unacked are gone; what
    # stays is kombu's shared pidbox binding, as after any Celery worker.
    client = redis.Redis.from_url(shared_redis)
    try:
        left = {k.decode() for k in cast(list[bytes], client.keys("*"))}
        assert left <= {"_kombu.binding.celery.pidbox", "unacked", "unacked_index"}, left
        assert client.hlen("unacked") == client.zcard("unacked_index") == 0
    finally:
        client.close()


def test_demo_on_arq_passes_with_workers_killed(data_dir: Path) -> None:
    assert binary(("redis-server",), "redis-server", paths=("/usr/bin/redis-server",)), MISSING
    summary = _passed(_demo(data_dir, "arq", None), data_dir, "arq")
    assert summary["messages_lost"] == 0  # arq loses none: no watch runs (lost.py)
    assert (data_dir / "demo-files" / "redis" / "redis.log").exists()  # its own server


def test_demo_queue_without_redis_exits_2_before_starting_anything(data_dir: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    proc = _demo(data_dir, "celery", f"redis://127.0.0.1:{closed}/0")
    assert proc.returncode == 2, proc.stderr
    assert NEEDS_REDIS in proc.stderr
    assert f"127.0.0.1:{closed}" in proc.stderr
    assert not (data_dir / "demo").exists()  # no database was started
