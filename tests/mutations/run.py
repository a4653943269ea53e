"""The mutation check: each deliberate bug, applied alone to a copy of the checkout, must
make the default run's tests that guard it fail (issue 14 item 5).

    .venv/bin/python -m tests.mutations            # every mutant; exit 1 if one survives
    .venv/bin/python -m tests.mutations --list     # the table, nothing run
    .venv/bin/python -m tests.mutations --only host-fence-dropped

How it works: the checkout's files (``git ls-files --cached --others --exclude-standard``:
tracked and new files, as they are in the working tree) are copied once to a temporary
folder, never touching the checkout. For each mutant, its edits (exact old text -> new
text; an old text that is not found exactly once is an error, so the table stays in step
with the code) are applied to the copy, its tests are run there with the venv's Python
(``cwd`` = the copy, ``PYTHONPATH`` = a link tree of the copy laid out as the wheel lays
``callwarden`` (:func:`tests.layout.link_tree`), then the copy itself, so the copy's code
shadows the editable install that points at the checkout; processes the tests start
inherit ``PYTHONPATH``), and the edits are undone. A mutant is *caught* when pytest
exits 1 (tests failed); any other non-zero exit (collection error, usage error, timeout)
is reported as an error, not as caught. Two sanity rows run first: the unmutated copy
must pass every test file the table names, and a trivially broken fold must be caught,
which shows the copy's code is what the tests import.

The tests named per mutant are the smallest set of the default run's files that catches it,
all run in the ``ci`` Hypothesis profile (derandomized, so a result reproduces).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tests.layout import link_tree

ROOT = Path(__file__).resolve().parents[2]
PER_MUTANT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once in ``path``) with ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    expect_caught: bool = True


FOLD = "tests/unit/test_fold.py"
DECIDE = "tests/unit/test_reconcile_decide.py"
WRITE = "tests/integration/test_write_path.py"
STALE = "tests/integration/test_stale_rule.py"
CALLS = "tests/integration/test_calls.py"
GUARDS = "tests/integration/test_mutation_guards.py"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "settle-without-cas",
        "a settling append moves the job's reservations whatever their status (no "
        "compare-and-set on status = 'reserved')",
        (Edit("engine/database/queries.sql",
              "    WHERE u.job_id = %(job_id)s::uuid AND u.status = 'reserved'\n), settle AS (",
              "    WHERE u.job_id = %(job_id)s::uuid\n), settle AS ("),
         Edit("engine/database/queries.sql",
              "    WHERE u.id = o.id\n      AND u.status = 'reserved'\n",
              "    WHERE u.id = o.id\n")),
        (WRITE,)),
    Mutant(
        "settle-cas-dropped",
        "only the settle's own compare-and-set (status = 'reserved' re-checked on the row "
        "it locks) is gone: a reservation the host settles while the append waits is moved "
        "again",
        (Edit("engine/database/queries.sql",
              "    WHERE u.id = o.id\n      AND u.status = 'reserved'\n",
              "    WHERE u.id = o.id\n"),),
        (GUARDS,)),
    Mutant(
        "terminal-not-absorbing",
        "the fold treats a terminal call like an empty one: a cancel or a host ending "
        "after a commit is accepted (and would refund)",
        (Edit("projections/fold.py",
              "        dest = table.get(previous)\n",
              "        dest = table.get(None if previous in TERMINAL else previous)\n"),),
        (FOLD,)),
    Mutant(
        "cancel-commits",
        "a cancelled call's reservation is committed instead of refunded",
        (Edit("events/states.py", "    S.CANCELLED: \"refunded\",\n",
              "    S.CANCELLED: \"committed\",\n"),),
        (FOLD,)),
    Mutant(
        "commit-ignores-cost",
        "a commit charges the whole reservation, not the Completed event's cost",
        (Edit("engine/database/appending.py", "        cost=_cost(new),\n",
              "        cost=None,\n"),),
        (WRITE,)),
    Mutant(
        "fold-takes-live-lease",
        "the fold lets a FinalizeClaimed take over a finalization lease that has not expired",
        (Edit("projections/fold.py",
              "    if a.state is CallState.FINALIZING and lease is not None and e.at < lease:",
              "    if False:"),),
        (FOLD,)),
    Mutant(
        "finalizer-takes-live-lease",
        "the finalizer claims a finalizing call whose lease is still live",
        (Edit("engine/calls/finalize.py",
              "            expired = p.finalize_lease_until is not None and now >= "
              "p.finalize_lease_until\n",
              "            expired = True\n"),),
        (GUARDS,)),
    Mutant(
        "live-lease-taken-over",
        "a live finalization lease is taken over end to end: the finalizer claims it and "
        "the fold's lease rule lets the claim through",
        (Edit("engine/calls/finalize.py",
              "            expired = p.finalize_lease_until is not None and now >= "
              "p.finalize_lease_until\n",
              "            expired = True\n"),
         Edit("projections/fold.py",
              "    if a.state is CallState.FINALIZING and lease is not None and e.at < lease:",
              "    if False:")),
        (GUARDS,)),
    Mutant(
        "fresh-heartbeat-ignored",
        "the reconciler's stale rule ignores a fresh heartbeat (ages the call from its "
        "start only)",
        (Edit("engine/rules/stale.py",
              "        if heartbeat_at is not None:\n",
              "        if False:\n"),),
        (DECIDE,)),
    Mutant(
        "fresh-heartbeat-ignored-sql",
        "the claim's SQL stale rule (callwarden_is_stale, migration 0007) ignores a fresh "
        "heartbeat",
        (Edit("migrations/0007_stale_rule.sql",
              "    WHEN heartbeat_at IS NOT NULL THEN\n",
              "    WHEN false THEN\n"),),
        (STALE,)),
    Mutant(
        "ambiguous-create-recreates",
        "a redelivered job left created without a task id creates upstream again "
        "(the default ambiguous_create='sweep' policy ignored)",
        (Edit("engine/calls/runner.py",
              "            if not started_here and self.config.policy_for(kind) == \"sweep\":\n",
              "            if False:\n"),),
        (CALLS,)),
    Mutant(
        "host-fence-dropped",
        "the append no longer checks the host's status it read (a host's cancel or "
        "completion racing the write is overwritten)",
        (Edit("engine/database/queries.sql",
              "      AND CASE WHEN %(host_status)s::text IS NULL\n"
              "               THEN COALESCE(status, 'pending') IN ('pending', 'processing')\n"
              "               ELSE status IS NOT DISTINCT FROM %(host_status)s::text END\n",
              "      AND true\n"),),
        (WRITE,)),
)

SANITY: tuple[Mutant, ...] = (
    Mutant("(unmutated copy)", "the copy passes every test file the table names", (),
           (), expect_caught=False),
    Mutant("(copy is what runs)", "a completed call refunds: proves the tests import the "
           "copy's code, not the checkout's",
           (Edit("events/states.py", "    S.COMPLETED: \"committed\",\n",
                 "    S.COMPLETED: \"refunded\",\n"),), (FOLD,)),
)


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    exit_code: int
    seconds: float
    tail: str

    @property
    def caught(self) -> bool:
        return self.exit_code == 1

    @property
    def ok(self) -> bool:
        return self.caught if self.mutant.expect_caught else self.exit_code == 0


_SKIP = {".git", ".venv", "__pycache__", ".hypothesis", ".mypy_cache", ".ruff_cache",
         ".pytest_cache", "dist", "build"}


def _files(src: Path) -> list[str]:
    """The checkout's tracked and new (not ignored) files; without git, every file outside
    the caches, the venv and build output."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(src)) for p in src.rglob("*")
                if p.is_file() and not _SKIP & set(p.relative_to(src).parts)]
    return list(filter(None, listed.decode().split("\0")))


def copy_checkout(src: Path, dest: Path) -> None:
    """The checkout's files, as in the working tree, copied to ``dest``."""
    for name in _files(src):
        source = src / name
        if not source.is_file():
            continue  # deleted in the working tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def apply_edits(copy: Path, edits: Sequence[Edit]) -> dict[Path, str]:
    """Apply ``edits``; the original texts (to undo them). Raises if an old text is not
    found exactly once."""
    originals: dict[Path, str] = {}
    for edit in edits:
        path = copy / edit.path
        text = path.read_text(encoding="utf-8")
        originals.setdefault(path, text)
        count = text.count(edit.old)
        if count != 1:
            raise SystemExit(f"mutant out of step with the code: {edit.path} holds the old "
                             f"text {count} times (expected once):\n{edit.old}")
        path.write_text(text.replace(edit.old, edit.new), encoding="utf-8")
    return originals


def run_tests(copy: Path, tests: Sequence[str], tmp: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE",
                                                            "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "build" / "package"), str(copy)])
    env["HYPOTHESIS_PROFILE"] = "ci"
    basetemp = tmp / "bt"
    shutil.rmtree(basetemp, ignore_errors=True)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           f"--basetemp={basetemp}", *tests]
    try:
        done = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True,
                              timeout=PER_MUTANT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {PER_MUTANT_TIMEOUT_S} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = [ln.split(" ", 1)[1] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return done.returncode, "\n".join(failed or lines[-12:])


def run_one(copy: Path, mutant: Mutant, tests: Sequence[str], tmp: Path) -> Outcome:
    originals = apply_edits(copy, mutant.edits)
    start = time.monotonic()
    try:
        code, tail = run_tests(copy, tests, tmp)
    finally:
        for path, text in originals.items():
            path.write_text(text, encoding="utf-8")
    return Outcome(mutant, code, time.monotonic() - start, tail)


def _table(rows: Sequence[Outcome | Mutant]) -> Table:
    table = Table(title="mutation check")
    for col in ("mutant", "bug", "tests", "caught", "caught by (first failure)", "s"):
        table.add_column(col, overflow="fold")
    for row in rows:
        m = row.mutant if isinstance(row, Outcome) else row
        tests = ", ".join(Path(t).name for t in m.tests) or "all of the table's"
        if isinstance(row, Outcome):
            verdict = ("yes" if row.caught else "no" if row.exit_code == 0
                       else f"error (exit {row.exit_code})")
            if not m.expect_caught:
                verdict = "passed" if row.exit_code == 0 else f"FAILED (exit {row.exit_code})"
            first = row.tail.splitlines()[0] if row.caught and row.tail else ""
            table.add_row(m.name, m.bug, tests, verdict, first.split(" - ")[0].split("::")[-1],
                          f"{row.seconds:.0f}")
        else:
            table.add_row(m.name, m.bug, tests, "", "", "")
    return table


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the table, run nothing")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this mutant (repeatable; skips the sanity rows)")
    parser.add_argument("--no-sanity", action="store_true", help="skip the sanity rows")
    args = parser.parse_args(argv)
    console = Console(width=160)
    known = {m.name for m in MUTANTS}
    unknown = set(args.only) - known
    if unknown:
        parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
    if args.list:
        console.print(_table([*SANITY, *MUTANTS]))
        return 0
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    every_test = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    sanity = () if args.only or args.no_sanity else SANITY
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="cw-mutants-") as folder:
        tmp = Path(folder)
        copy = tmp / "src"
        copy_checkout(ROOT, copy)
        link_tree(copy / "build" / "package", copy)
        for mutant in chosen:  # every edit must still match before anything runs
            for path, text in apply_edits(copy, mutant.edits).items():
                path.write_text(text, encoding="utf-8")
        for mutant in (*sanity, *chosen):
            tests = mutant.tests or every_test
            outcome = run_one(copy, mutant, tests, tmp)
            outcomes.append(outcome)
            mark = "ok" if outcome.ok else "NOT OK"
            console.print(f"{mutant.name}: exit {outcome.exit_code} in "
                          f"{outcome.seconds:.0f} s ({mark})")
            if not outcome.ok:
                console.print(outcome.tail, markup=False, highlight=False)
    console.print(_table(outcomes))
    scored = [o for o in outcomes if o.mutant in chosen]
    caught = sum(o.caught for o in scored)
    total_s = sum(o.seconds for o in outcomes)
    console.print(f"mutation score: {caught}/{len(scored)} caught "
                  f"({total_s:.0f} s of tests)")
    return 0 if all(o.ok for o in outcomes) else 1
