"""The projection's column list is checked in every place it is spelled out: the two
statements that write projection columns — the append (engine/database/queries.sql) and the
rebuild (engine/replay/audit.sql) — assign the same columns, and together cover every
column the fold produces (callwarden.projections.columns.to_columns); ``from_row`` reads exactly
``READ_COLUMNS``, and every statement whose rows become a projection returns all of them.
A column added in one place and not another would make rebuild silently leave it stale,
or a reader fail on a row."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

from callwarden.database.queries import QUERIES, _splice
from callwarden.projections.columns import READ_COLUMNS, from_row, to_columns
from callwarden.projections.fold import EMPTY
from tests.layout import FOLDERS

_ASSIGN = re.compile(r"^\s*(\w+) = ", re.MULTILINE)


def _assigned(sql: str) -> set[str]:
    update = sql[sql.index("UPDATE jobs SET"):sql.index("WHERE id")]
    return set(_ASSIGN.findall(update.replace("UPDATE jobs SET", "")))


#: Liveness, not projection: TaskCreated's append stamps the first heartbeat; a rebuild
#: leaves the heartbeat as the workers wrote it.
LIVENESS = {"heartbeat_at", "heartbeat_owner"}


def test_append_and_rebuild_write_the_same_projection_columns() -> None:
    assert _assigned(QUERIES["append_event"]) - LIVENESS == _assigned(
        QUERIES["audit_rebuild_projection"])


def test_every_folded_column_is_written() -> None:
    written = _assigned(QUERIES["append_event"])
    folded = set(to_columns(EMPTY)) - {"new_version"}
    assert folded <= written | {"call_version"}, folded - written


def test_from_row_reads_exactly_the_declared_columns() -> None:
    tree = ast.parse(inspect.getsource(from_row))
    read = {n.slice.value for n in ast.walk(tree) if isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name) and n.value.id == "row"
            and isinstance(n.slice, ast.Constant)}
    assert read == set(READ_COLUMNS)


@pytest.mark.parametrize("name", ["load_projection", "reconcile_claim", "audit_histories"])
def test_every_projection_read_returns_every_column(name: str) -> None:
    sql = QUERIES[name]
    listed = sql[sql.rindex("RETURNING"):] if "RETURNING" in sql else sql[:sql.index("FROM")]
    missing = [c for c in READ_COLUMNS if not re.search(rf"(\.|\s|AS ){c}\b", listed)]
    assert missing == []



def test_the_projection_set_list_is_written_once() -> None:
    """The append and the rebuild splice one fragment; no .sql file spells the list out
    again (``call_settlement = ...`` is one of its lines)."""
    root = FOLDERS["callwarden"]
    texts = {p.name: p.read_text(encoding="utf-8") for p in root.rglob("*.sql")}
    assert "{{projection_set}}" in texts["queries.sql"]
    assert "{{projection_set}}" in texts["audit.sql"]
    spelled = [n for n, t in texts.items() for _ in re.finditer(r"call_settlement = %\(", t)]
    assert spelled == ["queries.sql"]  # once: in the fragment itself
    assert "{{" not in QUERIES["append_event"] + QUERIES["audit_rebuild_projection"]


def test_an_unknown_fragment_fails_at_load() -> None:
    with pytest.raises(RuntimeError, match="unknown fragment"):
        _splice("q", "UPDATE jobs SET {{nope}}", {})


APPENDS = ("append_start", "append_move", "append_event", "append_completion",
           "append_completion_host_seed")


@pytest.mark.parametrize("name", APPENDS)
def test_every_append_shape_writes_the_same_columns(name: str) -> None:
    """The shapes derived from one fragment (callwarden.database.queries._shapes) leave
    no column out: each writes exactly what append_event writes."""
    assert _assigned(QUERIES[name]) == _assigned(QUERIES["append_event"])


def test_each_append_shape_carries_only_the_fences_its_events_need() -> None:
    """Only a start is fenced on a task already on the row, and only a start is not
    fenced on settled reservations; a completion (never a host's decision) is fenced on
    the host's open status, and writes the seed outright unless the seed stays the
    host's (append_completion_host_seed)."""
    start_fence, settled_fence = "provider_task_id IS NULL", "AND (SELECT count(*)"
    shapes = {n: QUERIES[n] for n in APPENDS}
    completions = ["append_completion", "append_completion_host_seed"]
    assert [n for n, q in shapes.items() if start_fence in q] == ["append_start"]
    assert [n for n, q in shapes.items() if settled_fence not in q] == ["append_start"]
    assert [n for n, q in shapes.items() if "%(host_status)s" not in q] == completions
    assert [n for n, q in shapes.items() if "%(owns_seed)s" not in q] == completions[:1]
    for name in completions:
        assert "COALESCE(status, 'pending') IN ('pending', 'processing')" in shapes[name]

