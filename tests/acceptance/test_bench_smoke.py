"""The benchmark scripts still run (tiny sizes, the test server's Postgres): a change to
the schema or the write path that breaks ``bench/`` fails here, not on the day someone
measures. Nothing is timed. ``append.py`` and ``lifecycle.py`` compare with peer
libraries installed by the ``bench`` extra only, so they are run by hand
(docs/benchmarks.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.acceptance.conftest import ROOT

RUNS = {
    "dashboard": ["--rows", "2000", "--requests", "3"],
    "capacity": ["--calls", "16", "--warmup", "8", "--beats", "2", "--probe-jobs", "10",
                 "--prefill", "50"],
    "replay": ["--events", "3000", "--batch", "200"],
    "reconcile": ["--rows", "2000", "--stale", "40", "--processes", "1", "--trials", "1"],
    "webhooks": ["--jobs", "20", "--concurrency", "1", "4"],
    "admission": ["--jobs", "10", "--rounds", "1", "--warmup", "2", "--burst", "6",
                  "--others", "2", "--hold", "0.05"],
}


@pytest.mark.parametrize("script", sorted(RUNS))
def test_benchmark_runs_and_prints_its_table(script: str, pg_admin_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": pg_admin_url}
    proc = subprocess.run([sys.executable, f"bench/{script}.py", *RUNS[script]], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "┃" in proc.stdout or "calls/s" in proc.stdout, proc.stdout[-2000:]
