"""Issue 13's measured disagreement, checked from outside: with
``CALLWARDEN_RECONCILE_THRESHOLD_ANTHROPIC_SYNC=60`` and a two-minute-old anthropic-sync
call written by the host's plain SQL, ``callwarden serve`` (``/metrics`` and the dashboard),
``callwarden stats`` and ``callwarden reconcile --once`` — each a real process reading the
same environment — all count that call as stale; with the default threshold (5 minutes)
all of them count nothing. They share one rule (``callwarden_is_stale``, migration 0007)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from callwarden.database.db import connect
from callwarden.providers.simulator.core import RunningSimulator
from tests.acceptance.conftest import ROOT
from tests.support.processes import cli, environment, seed_call

ENV = "CALLWARDEN_RECONCILE_THRESHOLD_ANTHROPIC_SYNC"


@asynccontextmanager
async def served(env: dict[str, str]) -> AsyncIterator[str]:
    """``callwarden serve`` on free ports as a process; its operator listener's URL (from
    its start line: dashboard and ``/metrics``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "serve", "--port", "0", "--operator-port", "0",
        env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        assert line.startswith("callwarden serve on "), line
        yield line.split("operator on ")[1].split()[0]
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=30)


async def observed(env: dict[str, str], job: str) -> dict[str, int]:
    """How many stale anthropic-sync calls each reader reports (the dashboard: whether it
    lists ``job`` among the stale calls)."""
    async with served(env) as base, aiohttp.ClientSession() as http:
        async with http.get(f"{base}/metrics") as resp:
            text = await resp.text()
        async with http.get(f"{base}/") as resp:
            page = await resp.text()
    metric = [s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "callwarden_calls_stale" and s.labels == {"kind": "anthropic-sync"}]
    stale_section = page.split("Stale calls", 1)[-1].split("<h2>", 1)[0]
    code, out, err = await cli(["stats", "--json"], env)
    assert code == 0, err
    stats = {s["kind"]: s["stale"] for s in json.loads(out)["stale"]}
    code, out, err = await cli(["reconcile", "--once", "--json"], env)
    assert code == 0, err
    return {"metrics": int(metric[0]) if metric else -1,
            "dashboard": int(job in stale_section),
            "stats": stats.get("anthropic-sync", 0),
            "reconciler": json.loads(out)["claimed"]}


async def test_every_reader_of_staleness_uses_the_configured_threshold(
        empty_db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
    env = environment(empty_db_url, sim, tmp_path / "media")
    code, _, err = await cli(["migrate"], env)
    assert code == 0, err
    async with await connect(empty_db_url) as conn:
        job = str(await seed_call(conn, "anthropic-sync", None, age="2 minutes"))
    # Default threshold (300 s): a two-minute-old call is not stale for anyone.
    assert await observed(env, job) == {"metrics": 0, "dashboard": 0, "stats": 0,
                                        "reconciler": 0}
    # 60 s configured: stale for everyone (and the reconciler claims it).
    assert await observed({**env, ENV: "60"}, job) == {"metrics": 1, "dashboard": 1,
                                                       "stats": 1, "reconciler": 1}
