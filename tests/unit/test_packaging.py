"""The distribution's import packages are ours alone and ship their data files."""

from __future__ import annotations

import importlib.metadata as md
from importlib import resources

PACKAGES = ["engine", "events", "projections", "providers", "migrations"]


def test_no_other_distribution_claims_our_top_level_names() -> None:
    owners = md.packages_distributions()
    for name in PACKAGES:
        assert set(owners.get(name, ["callwarden"])) == {"callwarden"}, (name, owners.get(name))


def test_sql_files_ship_with_the_packages() -> None:
    assert sorted(p.name for p in resources.files("migrations").iterdir()
                  if p.name.endswith(".sql"))[:3] == [
        "0001_host_baseline.sql", "0002_external_call_columns.sql", "0003_call_events.sql"]
    for package, sql in (("store", "queries.sql"), ("reconciler", "reconcile.sql"),
                         ("service", "service.sql"), ("replay", "audit.sql"),
                         ("queue", "queue.sql"), ("demo", "demo.sql")):
        assert resources.files("engine").joinpath(package, sql).is_file(), sql


def test_console_script_points_at_the_cli() -> None:
    scripts = {e.name: e.value for e in md.entry_points(group="console_scripts")}
    assert scripts.get("callwarden") == "engine.cli.main:main"
