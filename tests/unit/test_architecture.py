"""The layout's rules, read from the source: one error boundary (nothing outside
``engine/database`` catches or even names a driver error), no inline SQL outside the
``.sql`` files (database names are composed with ``psycopg.sql``), and one staleness
filter for every reader of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from callwarden.database.queries import QUERIES, _load_all, _splice

ROOT = Path(__file__).parents[2]
SOURCES = sorted(p for top in ("engine", "providers", "events", "projections", "migrations")
                 for p in (ROOT / top).rglob("*.py"))
STORE = ROOT / "engine" / "database"
DRIVER = {"psycopg", "psycopg_pool"}
SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|TRUNCATE|VACUUM|COPY)\s")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def driver_names(tree: ast.AST) -> list[str]:
    """Every driver error named in an ``except`` clause, and every driver import other
    than the row types (``psycopg.rows``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            text = ast.unparse(node.type)
            if re.search(r"\b(psycopg|psycopg_pool|PoolTimeout)\b", text):
                found.append(f"except {text} (line {node.lineno})")
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names
                      if a.name.split(".")[0] in DRIVER]
        elif (isinstance(node, ast.ImportFrom) and node.module is not None
              and node.module.split(".")[0] in DRIVER and node.module != "psycopg.rows"):
            found.append(f"from {node.module} import ...")
    return found


RAW = {"execute", "executemany", "cursor", "transaction"}


def raw_statements(tree: ast.AST) -> list[str]:
    """Statements sent past the store's named-query functions (``conn.execute(...)``,
    ``conn.transaction()``, a cursor): their driver errors would escape untranslated."""
    return [f"line {node.lineno}: .{node.func.attr}(...)" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in RAW]


def inline_sql(tree: ast.AST) -> list[str]:
    """String constants that are SQL statements (``psycopg.sql.SQL`` templates are the one
    allowed way to write a statement in Python: identifiers quoted by the driver;
    docstrings are prose)."""
    composed = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                and ast.unparse(node.func) in {"sql.SQL", "psycopg.sql.SQL"}
                for arg in node.args}
    composed |= {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [f"line {node.lineno}: {node.value[:40]!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and SQL_START.match(node.value) and id(node) not in composed]


@pytest.mark.parametrize("path", [p for p in SOURCES if STORE not in p.parents], ids=_rel)
def test_only_the_store_touches_driver_errors(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert driver_names(tree) == []
    assert raw_statements(tree) == []


@pytest.mark.parametrize("path", [*SOURCES, *sorted((ROOT / "bench").glob("*.py"))], ids=_rel)
def test_no_inline_sql_outside_the_sql_files(path: Path) -> None:
    """The engine's and the benchmarks' statements live in .sql files (tests write rows
    with plain SQL on purpose: they play the host)."""
    assert inline_sql(ast.parse(path.read_text(encoding="utf-8"))) == []


def test_the_checks_can_fail() -> None:
    bad = ast.parse("import psycopg\ntry:\n    pass\nexcept psycopg.Error:\n    pass\n"
                    "q = 'SELECT 1'\n")
    assert len(driver_names(bad)) == 2
    assert raw_statements(ast.parse("async def f(c):\n    await c.execute('x')\n"
                                    "    async with c.transaction():\n        pass\n")) == [
        "line 2: .execute(...)", "line 3: .transaction(...)"]
    assert inline_sql(bad) == ["line 6: 'SELECT 1'"]
    ok = ast.parse("from psycopg import sql\nq = sql.SQL('DROP DATABASE {}')\n")
    assert inline_sql(ok) == []
    assert driver_names(ok) == ["from psycopg import ..."]


def test_every_reader_of_staleness_counts_the_same_rows() -> None:
    """/metrics, the dashboard and ``stats`` select from one set of rows (the
    ``stale_jobs`` fragment, ``callwarden_stale_jobs`` written out: tests/integration/
    test_stale_fragment.py proves the two equal), with the same parameters, and no other
    filter of their own."""
    _, fragments = _load_all()
    stale_jobs = _splice("stale_jobs", fragments["stale_jobs"], fragments)
    rows = "FROM " + " ".join(stale_jobs.split()) + " j"
    for name in ("metrics_stale_calls", "dashboard_stale_calls", "audit_stats_stale"):
        flat = " ".join(QUERIES[name].split())
        assert rows in flat, name
        assert "WHERE" not in flat.replace(rows, ""), name
