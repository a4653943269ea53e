"""A pytest plugin for the mutation check (``-p tests.mutations.first``): the default run
with a mutant's own test files first, and what the run found, written for the runner.

``--run-first FILE`` (repeatable) moves FILE's tests to the front of the collection, in
the order the files are named, every other test keeping its place. Naming the files
before ``tests`` on the command line does not do it: pytest (9.x) drops a file argument
that a directory argument holds (``normalize_collection_arguments``) and collects the
directory in its own order. Under ``-n 2 --dist loadgroup`` the workers are fed in
collection order only with ``--no-loadscope-reorder`` (by default xdist hands out the
largest ``xdist_group`` first), which the runner passes.

``--mutation-report PATH``: the controller (not an xdist worker) writes
``{"exitstatus", "failed": [[nodeid, message], ...], "collection_errors": [...],
"passed"}`` to PATH as JSON when the session ends. The runner reads it because under
xdist ``-x`` ends a run that a test failed with exit status 2 (xdist raises
``Interrupted``), the status a collection error also gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Findings"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mutations", "the mutation check (tests/mutations)")
    group.addoption("--run-first", action="append", default=[], metavar="FILE",
                    help="run FILE's tests before all others (repeatable, in order)")
    group.addoption("--mutation-report", default=None, metavar="PATH",
                    help="write the failed tests and collection errors to PATH (JSON)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("mutation_report")
    if path and not hasattr(config, "workerinput"):  # the controller sees every report
        config.pluginmanager.register(Findings(Path(path)), "mutation-findings")


def _first_files(config: pytest.Config) -> dict[Path, int]:
    rank: dict[Path, int] = {}
    for name in config.getoption("run_first"):
        path = (config.invocation_params.dir / name).resolve()
        if not path.is_file():
            raise pytest.UsageError(f"--run-first {name}: no such file")
        rank.setdefault(path, len(rank))
    return rank


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = _first_files(config)
    if rank:
        items.sort(key=lambda item: rank.get(item.path.resolve(), len(rank)))  # stable


def _message(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = getattr(crash, "message", None) or str(report.longrepr or "")
    return " ".join(text.split())[:300]


class Findings:
    """What the run found, written to ``path`` when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed: dict[str, str] = {}
        self.collection_errors: list[str] = []
        self.passed = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.setdefault(report.nodeid, _message(report))
        elif report.passed and report.when == "call":
            self.passed += 1

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors.append(report.nodeid or "(collection)")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        found: dict[str, Any] = {
            "exitstatus": int(exitstatus), "failed": list(self.failed.items()),
            "collection_errors": self.collection_errors, "passed": self.passed}
        self.path.write_text(json.dumps(found, indent=1), encoding="utf-8")
