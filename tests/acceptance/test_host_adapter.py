"""A fifth provider, end to end through the host's own adapter (issue 25 item 1).

The host is ``docs/examples/acme_host``: its root holds its own ``providers.py`` (the Acme
Render adapter: kind ``acme-render``, its threshold, media hosts and result-URL lifetime
declared there) and its own ``events.py``. Real processes run from that root:

* a ``callwarden worker`` that finds the adapter through ``CALLWARDEN_PROVIDERS``, creates
  the render through it and is SIGKILLed mid-poll (the ``mid_poll`` failpoint);
* a ``callwarden reconcile`` that finds it through the ``callwarden.providers`` entry point
  of the host's installed package (a ``.dist-info`` on its path, as pip leaves it), takes
  the call over after the heartbeat timeout and recovers it by polling the persisted
  render id through the same adapter.

Checked by SQL and by the Acme server's own counts: one render created for the job, the
reservation committed once, the asset stored, the projections equal to the log."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from callwarden.database.db import Conn
from callwarden.replay.verify import verify_job
from tests.acceptance.conftest import KEY_VARS, ROOT
from tests.support.acme import KEY, Acme, running_acme
from tests.support.queues import until, value

HOST = ROOT / "docs" / "examples" / "acme_host"


@pytest.fixture
async def acme() -> AsyncIterator[Acme]:
    async with running_acme() as server:
        yield server


def installed(tmp_path: Path) -> Path:
    """A folder holding the host package's metadata as pip installs it: its entry point
    ``acme = providers:PROVIDER`` in the group ``callwarden.providers``."""
    site = tmp_path / "site"
    info = site / "acme_host-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-host\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[callwarden.providers]\nacme = providers:PROVIDER\n")
    return site


def host_env(db_url: str, acme: Acme, media: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CALLWARDEN_", "AWS_")) and k not in KEY_VARS}
    env.update({"DATABASE_URL": db_url, "CALLWARDEN_MEDIA_DIR": str(media),
                "CALLWARDEN_ACME_URL": acme.url, "ACME_API_KEY": KEY})
    env.update(extra)
    return env


async def start(args: list[str], env: dict[str, str], log: Path
                ) -> asyncio.subprocess.Process:
    """``python -m callwarden.cli <args>`` in the host's root (its ``providers.py`` and
    ``events.py`` first on the path)."""
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "callwarden.cli", *args, env=env, cwd=HOST,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out)


async def render_job(conn: Conn, prompt: str, credits: float = 10) -> uuid.UUID:
    """A job of the host's kind and its reservation, inserted by plain SQL."""
    job = uuid.uuid4()
    await conn.execute(
        "INSERT INTO jobs (id, user_id, status, input_data) VALUES (%s, 'u-1', 'pending', %s)",
        (job, Jsonb({"provider_kind": "acme-render", "request": {"prompt": prompt}})))
    await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved) "
                       "VALUES (%s, 'u-1', 'reserved', %s)", (job, credits))
    return job


async def test_a_fifth_provider_is_created_polled_and_recovered_through_the_hosts_adapter(
        db_url: str, conn: Conn, acme: Acme, tmp_path: Path) -> None:
    job = await render_job(conn, "a red fox")
    media = tmp_path / "media"
    worker_log = tmp_path / "worker.log"
    worker = await start(
        ["worker", "--concurrency", "1", "--poll-interval", "0.05"],
        host_env(db_url, acme, media, CALLWARDEN_PROVIDERS="providers:PROVIDER",
                 CALLWARDEN_FAILPOINTS="mid_poll"), worker_log)
    assert await asyncio.wait_for(worker.wait(), 60) == -signal.SIGKILL, worker_log.read_text()
    assert list(acme.renders) == ["r_0"]  # created once
    assert acme.polls["r_0"] == 1  # and polled once
    assert await value(conn, "SELECT call_state FROM jobs WHERE id = %s", job) == "polling"
    assert await value(conn, "SELECT provider_task_id FROM jobs WHERE id = %s", job) == "r_0"

    acme.release()  # the render finished upstream after its worker died
    rec_log = tmp_path / "reconcile.log"
    reconciler = await start(
        ["reconcile"],
        host_env(db_url, acme, media, PYTHONPATH=os.pathsep.join(filter(None, [
                     str(installed(tmp_path)), os.environ.get("PYTHONPATH")])),
                 CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S="1",
                 CALLWARDEN_CALL_HEARTBEAT_EVERY_S="0.5",
                 CALLWARDEN_RECONCILE_SCAN_INTERVAL_S="0.2"), rec_log)
    try:
        async def settled() -> bool:
            status = await value(conn, "SELECT status FROM jobs WHERE id = %s", job)
            assert reconciler.returncode is None, rec_log.read_text()
            return status in ("completed", "failed")
        await until("the reconciler to finish the call", settled, deadline_s=60)
    finally:
        reconciler.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(reconciler.wait(), 30) == 0, rec_log.read_text()

    assert await value(conn, "SELECT status FROM jobs WHERE id = %s", job) == "completed", \
        rec_log.read_text()
    assert list(acme.renders) == ["r_0"]  # never a second render
    assert acme.polls["r_0"] >= 2  # the reconciler polled the persisted id
    assert await value(conn, "SELECT array_agg(status) FROM usage_logs WHERE job_id = %s",
                       job) == ["committed"]
    kinds = await value(conn, "SELECT array_agg(DISTINCT provider_kind) FROM jobs "
                              "WHERE id = %s", job)
    assert kinds == ["acme-render"]
    actors = await value(conn, "SELECT array_agg(actor ORDER BY seq) FROM callwarden.call_events "
                               "WHERE job_id = %s AND type = 'UpstreamSucceeded'", job)
    assert actors is not None
    assert actors[0].startswith("reconciler"), actors
    keys = await value(conn, "SELECT array_agg(storage_key) FROM assets WHERE job_id = %s", job)
    assert keys is not None
    assert len(keys) == 1
    stored = [p for p in media.rglob("*") if p.is_file() and ".meta" not in p.parts]
    assert [p.read_bytes()[:8] for p in stored] == [b"\x89PNG\r\n\x1a\n"]
    assert await verify_job(conn, job) == []


async def test_an_adapter_that_does_not_load_stops_the_command_with_exit_2_naming_it(
        db_url: str, acme: Acme, tmp_path: Path) -> None:
    log = tmp_path / "reconcile.log"
    proc = await start(["reconcile", "--once"],
                       host_env(db_url, acme, tmp_path / "media",
                                CALLWARDEN_PROVIDERS="providers:NO_SUCH"), log)
    assert await asyncio.wait_for(proc.wait(), 60) == 2
    said = log.read_text()
    assert "CALLWARDEN_PROVIDERS providers:NO_SUCH" in said, said
    assert "AttributeError" in said, said
