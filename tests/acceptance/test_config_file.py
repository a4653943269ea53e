"""A flat configuration file, as docs/reconciler.md documents it, read by real processes:
``callwarden reconcile --once`` and ``callwarden serve --check`` (issue 24.12)."""

from __future__ import annotations

from pathlib import Path

from callwarden.providers.simulator.core import RunningSimulator
from tests.support.processes import cli, environment


async def test_reconcile_reads_a_flat_file(db_url: str, sim: RunningSimulator,
                                           tmp_path: Path) -> None:
    flat = tmp_path / "reconcile.toml"
    flat.write_text("repoll_interval_s = 1200\nattempt_cap = 5\nscan_interval_s = 1\n")
    env = environment(db_url, sim, tmp_path / "media")
    code, out, err = await cli(["reconcile", "--once", "--config", str(flat)], env)
    assert code == 0, out + err
    assert "no such setting" not in err


async def test_a_typo_in_a_flat_file_is_named_and_refused(db_url: str, sim: RunningSimulator,
                                                        tmp_path: Path) -> None:
    flat = tmp_path / "reconcile.toml"
    flat.write_text("repoll_intervall_s = 600\n")
    env = environment(db_url, sim, tmp_path / "media")
    code, out, err = await cli(["reconcile", "--once", "--config", str(flat)], env)
    assert code == 2, out + err
    assert "repoll_intervall_s" in err
