"""The main job end to end: `callwarden demo` as a user runs it (a real process, real
worker subprocesses killed with SIGKILL, the reconciler, the simulator), on a fresh
embedded Postgres. Invariant: it exits 0 only when every job is terminal, no job created
more than one upstream task, every reservation settled exactly once, no credit leaked and
the projections equal the fold of the log — and its JSON says so. Its price list charges
some completed calls less than their reservation (the rest released), and some callbacks
arrive late, on the providers' retry schedules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# One process runs every fleet test (README: the tests run in two), so two fleets of
# worker processes never compete for the cores against their deadlines.
pytestmark = pytest.mark.xdist_group("fleets")


def test_small_demo_with_killed_workers_keeps_every_invariant(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    report = tmp_path / "report.html"
    proc = subprocess.run(
        [sys.executable, "-m", "callwarden.cli", "--data-dir", str(tmp_path), "demo",
         "--jobs", "60", "--workers", "2", "--kill-rate", "0.7", "--seed", "3",
         "--duration", "120", "--json", "--report", str(report)],
        env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["jobs"] == 60
    assert summary["non_terminal"] == 0
    assert sum(summary["terminal"].values()) == 60
    assert summary["upstream_creates_max_per_job"] == 1
    assert summary["duplicate_settlements"] == 0
    assert summary["credits"]["leaked"] == 0
    assert summary["verify_mismatches"] == 0
    assert summary["recovered_by_reconciler"] > 0  # workers were killed; someone recovered
    assert summary["settled_by_webhook"] > 0  # the receiver took part (a third are dropped)
    assert summary["late_callbacks"] > 0  # retries on the providers' own schedules
    credits = summary["credits"]
    assert credits["partial_commits"] > 0  # the demo's price list charged below reserve
    assert credits["released"] > 0
    assert abs(credits["committed"] + credits["released"] + credits["refunded"]
               - credits["reserved"]) < 1e-6
    html = report.read_text()
    assert "<svg" in html
    assert "all invariants hold" in html
