"""Workers and reconcilers count what they do in their own /metrics: every append through
the store (transitions, settlements) and every reconcile outcome, scraped over HTTP from
the process's metrics port."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted
from callwarden.observe.metrics import start_metrics_server
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.loop import Reconciler
from tests.support import no_sleep


async def _scrape(http: aiohttp.ClientSession, port: int) -> dict[tuple[str, frozenset[
        tuple[str, str]]], float]:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


async def test_worker_and_reconciler_outcomes_are_counted(
        conn: Conn, pool: Pool, sim: RunningSimulator, http: aiohttp.ClientSession,
        tmp_path: Path) -> None:
    server, port = start_metrics_server(0)
    try:
        before = await _scrape(http, port)
        job = await create_job(conn)

        runner = CallRunner(pool, http, sim.settings, LocalFolderStore(tmp_path),
                            sleep=no_sleep)
        assert (await runner.run(job, "anthropic-sync", {
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        )).result == "completed"
        stale = await create_job(conn)
        await append(conn, stale, await load(conn, stale), CallStarted(
            at=datetime.now(UTC) - timedelta(hours=1), actor="worker:dead",
            kind="kie-llm", sync=True))
        counts = await Reconciler(pool, http, sim.settings, LocalFolderStore(tmp_path)
                                  ).reconcile_once()
        assert counts.swept == 1
        after = await _scrape(http, port)
    finally:
        server.shutdown()

    def grew(name: str, **labels: str) -> float:
        return _total(after, name, **labels) - _total(before, name, **labels)

    # The worker: CallStarted, UpstreamSucceeded, FinalizeClaimed, Completed, one commit.
    assert grew("callwarden_transitions_total", kind="anthropic-sync") == 4
    for event in ("CallStarted", "UpstreamSucceeded", "FinalizeClaimed", "Completed"):
        assert grew("callwarden_transitions_total", kind="anthropic-sync", event=event,
                    actor="worker") == 1, event
    # The dead worker's CallStarted (appended by this test through the store), then the
    # reconciler's Swept: one refund, one reconcile outcome.
    assert grew("callwarden_transitions_total", kind="kie-llm") == 2
    assert grew("callwarden_transitions_total", kind="kie-llm", event="Swept",
                actor="reconciler") == 1
    assert grew("callwarden_settlements_total") == 2
    assert grew("callwarden_settlements_total", kind="anthropic-sync",
                settlement="committed") == 1
    assert grew("callwarden_settlements_total", kind="kie-llm", settlement="refunded") == 1
    assert grew("callwarden_reconcile_outcomes_total") == 1
    assert grew("callwarden_reconcile_outcomes_total", kind="kie-llm", outcome="swept") == 1
