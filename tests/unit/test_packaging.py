"""The distribution installs one import package, ``callwarden``, built from the design's
top-level folders, and ships its data files."""

from __future__ import annotations

import ast
import importlib.metadata as md
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import callwarden
from tests.layout import FOLDERS, ROOT, module_of

SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
    "tool"]["setuptools"]


def test_one_top_level_import_package() -> None:
    assert {name.split(".")[0] for name in SETUPTOOLS["packages"]} == {"callwarden"}
    assert {name.split(".")[0] for name in SETUPTOOLS["package-dir"]} == {"callwarden"}
    owners = md.packages_distributions()
    assert set(owners.get("callwarden", [])) == {"callwarden"}
    for generic in ("engine", "events", "projections", "providers", "migrations"):
        assert "callwarden" not in owners.get(generic, []), generic


def test_the_package_list_is_every_folder_with_an_init() -> None:
    """A new subpackage that pyproject does not list would be left out of the wheel."""
    found = {module_of(init) for folder in FOLDERS.values()
             for init in folder.rglob("__init__.py") if "__pycache__" not in init.parts}
    assert sorted(SETUPTOOLS["packages"]) == sorted(found)


def test_the_repository_keeps_the_design_folders() -> None:
    assert {f.relative_to(ROOT).as_posix() for f in FOLDERS.values()} == {
        "engine", "events", "projections", "providers", "migrations"}


def test_sql_files_ship_with_the_packages() -> None:
    assert sorted(p.name for p in resources.files("callwarden.migrations").iterdir()
                  if p.name.endswith(".sql"))[:3] == [
        "0001_host_baseline.sql", "0002_external_call_columns.sql", "0003_call_events.sql"]
    for package, sql in (("database", "queries.sql"), ("database", "reconcile.sql"),
                         ("database", "webhooks.sql"),
                         ("service", "service.sql"), ("replay", "audit.sql"),
                         ("queue", "queue.sql"), ("demo", "demo.sql")):
        assert resources.files("callwarden").joinpath(package, sql).is_file(), sql


def test_console_script_points_at_the_cli() -> None:
    scripts = {e.name: e.value for e in md.entry_points(group="console_scripts")}
    assert scripts.get("callwarden") == "callwarden.cli.main:console"


def test_python_dash_m_callwarden_is_the_cli_and_says_the_installed_version() -> None:
    done = subprocess.run([sys.executable, "-m", "callwarden", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"callwarden {callwarden.__version__}"
    assert callwarden.__version__ == md.version("callwarden")


def test_python_dash_m_callwarden_help_lists_the_commands() -> None:
    done = subprocess.run([sys.executable, "-m", "callwarden", "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: callwarden ")
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert {"migrate", "worker", "reconcile", "serve", "demo"} <= listed, done.stdout


#: What the wheel ships from the folders: modules, SQL, py.typed, the dashboard's assets.
SHIPPED = {".py", ".sql", ".typed", ".css", ".js"}


def test_the_installed_package_has_every_file_of_the_folders() -> None:
    """The README's editable install is setuptools' strict mode: a tree of links to the
    files that were there when it ran. A module or migration added since is not in the
    installed package (an ImportError, or a migration never applied) until the install is
    run again; this names them. (The wheel, and the mutation check's link tree of folders,
    have them all.)"""
    missing = []
    for folder in FOLDERS.values():
        for path in sorted(folder.rglob("*")):
            if path.suffix not in SHIPPED or "__pycache__" in path.parts:
                continue
            package = path.parent
            while not (package / "__init__.py").is_file():
                package = package.parent
            installed = resources.files(module_of(package / "__init__.py")).joinpath(
                *path.relative_to(package).parts)
            if not installed.is_file():
                missing.append(path.relative_to(ROOT).as_posix())
    assert missing == [], (
        "not in the installed package; run the README's install again "
        '(.venv/bin/pip install -e ".[test]" --config-settings editable_mode=strict): '
        f"{missing}")


def test_no_test_module_imports_another() -> None:
    """Shared helpers live in conftest.py or tests/support/, never in a test module that
    other test modules import (issue 23.9: 23 did, one of them a fixture library)."""
    tests = Path(__file__).parents[1]
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(tests)} imports {n}" for n in names
                      if n.split(".")[-1].startswith("test_")]
    assert found == []


def test_the_statements_every_call_runs_stay_in_psycopgs_parse_cache() -> None:
    """psycopg parses a statement once and caches it only up to 4,096 bytes and 50
    parameters (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH): the append had grown past
    it and was parsed on every execution, about 0.2 ms each (issue 26.1). The loader strips
    comments and indentation; the statements a happy call runs must fit (each append has
    a shape of its own for this too: ``callwarden.database.queries._shapes``; only the
    rare ``append_completion_host_seed``, a legacy row's completion, is over it)."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    from callwarden.database.queries import QUERIES

    for name in ("append_start", "append_event", "append_move", "append_completion",
                 "load_projection", "heartbeat",
                 "reconcile_claim", "load_events", "webhook_find_job"):
        assert len(QUERIES[name].encode()) <= MAX_CACHED_STATEMENT_LENGTH, name
