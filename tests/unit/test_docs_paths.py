"""The docs say what the code says today: every repository path a page names in backticks
exists, every ``callwarden.<module>...`` name it gives resolves, and every path an SQL
file's comment names exists (or, in a migration, which is immutable, is listed in
:data:`MOVED` with where it went). A file moved or renamed without its docs fails here."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import callwarden
from tests.layout import ROOT

#: The repository's top-level folders a path may start with.
TOP = ("engine", "events", "projections", "providers", "migrations", "tests", "bench", "docs",
       "clients", "ops", ".ci")
_TOPS = "|".join(re.escape(t) for t in TOP)
_TICKED = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(rf"^(?:{_TOPS})(?:/[\w.-]+)*/?$")
_IN_TEXT = re.compile(rf"(?<![\w/.-])((?:{_TOPS})/[\w./-]*\w)")
_MODULE = re.compile(r"^callwarden(?:\.[A-Za-z_]\w*)+$")
#: Paths an immutable migration's comment names that have moved since: where they are now.
MOVED = {"engine/reconciler/stale.py": "engine/rules/stale.py"}
#: Named paths that are not files of the repository (a pattern).
FOREIGN = {"migrations/NNNN_name.sql"}

PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md",
                ROOT / "clients" / "node" / "README.md"])
SQL = sorted([*(ROOT / "migrations").glob("*.sql"), *(ROOT / "engine").rglob("*.sql")])
# callwarden.X where X is a module of the package or an export; callwarden.call_events and
# the like are the SQL schema's objects
_PACKAGE_NAMES = {m.name for m in pkgutil.iter_modules(callwarden.__path__)} | set(
    callwarden.__all__)


def _exists(named: str, page: Path) -> bool:
    named = named.rstrip("/")
    return (ROOT / named).exists() or (page.parent / named).exists()


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


def _ticked(page: Path) -> list[str]:
    return [re.sub(r"(:\d+|::\w+|#.*)$", "", m[1].strip())
            for m in _TICKED.finditer(page.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_a_page_names_exists(page: Path) -> None:
    missing = [t for t in _ticked(page) if _PATH.match(t) and not _exists(t, page)
               and t not in FOREIGN]
    unresolved = [t for t in _ticked(page) if _MODULE.match(t)
                  and t.split(".")[1] in _PACKAGE_NAMES and not _resolves(t)]
    assert missing == []
    assert unresolved == []


def test_every_path_an_sql_comment_names_exists_or_is_listed_as_moved() -> None:
    missing = []
    for file in SQL:
        for named in _IN_TEXT.findall(file.read_text(encoding="utf-8")):
            if named in FOREIGN or _exists(named, file):
                continue
            if named in MOVED and file.parent.name == "migrations":
                assert (ROOT / MOVED[named]).exists(), f"{named} moved to {MOVED[named]}"
                continue
            missing.append(f"{file.relative_to(ROOT)}: {named}")
    assert missing == []


def test_the_checks_see_what_they_check() -> None:
    """Not vacuous: the pages name hundreds of paths and dozens of modules."""
    named = [t for page in PAGES for t in _ticked(page)]
    assert sum(bool(_PATH.match(t)) for t in named) > 300
    assert sum(bool(_MODULE.match(t)) and t.split(".")[1] in _PACKAGE_NAMES
               for t in named) > 20
    assert not _exists("engine/no_such_module.py", ROOT / "README.md")
    assert not _resolves("callwarden.database.no_such_name")


def test_the_architecture_pages_layer_table_is_the_packages_layers() -> None:
    """docs/architecture.md's table of layers names callwarden.LAYERS, in order."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| ((?:`\w+`(?:, )?)+) \|", text, flags=re.MULTILINE)
    assert [tuple(re.findall(r"`(\w+)`", units)) for _, units in rows] == list(
        callwarden.LAYERS)
    assert [int(n) for n, _ in rows] == list(range(len(callwarden.LAYERS)))
