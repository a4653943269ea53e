"""The two statements that write projection columns — the append (engine/store/queries.sql)
and the rebuild (engine/replay/audit.sql) — assign the same columns, and together cover every
column the fold produces (projections.columns.to_columns). A column added to one and not
the other would make rebuild silently leave it stale."""

from __future__ import annotations

import re

from engine.store.queries import QUERIES
from projections.columns import to_columns
from projections.fold import EMPTY

_ASSIGN = re.compile(r"^\s*(\w+) = ", re.MULTILINE)


def _assigned(sql: str) -> set[str]:
    update = sql[sql.index("UPDATE jobs SET"):sql.index("WHERE id")]
    return set(_ASSIGN.findall(update.replace("UPDATE jobs SET", "")))


def test_append_and_rebuild_write_the_same_projection_columns() -> None:
    assert _assigned(QUERIES["append_event"]) == _assigned(QUERIES["audit_rebuild_projection"])


def test_every_folded_column_is_written() -> None:
    written = _assigned(QUERIES["append_event"])
    folded = set(to_columns(EMPTY)) - {"new_version"}
    assert folded <= written | {"call_version"}, folded - written
