"""The host API's transition table, event versions, state statuses and redaction, and
(block GENERATED HOST) what each event writes and the settlement, are the declaration's
rendering (engine/database/declared.py), carried verbatim by the newest migration that
carries each block (0014, then 0016; 0017): a change to the declaration without a
migration that carries its new rendering fails here (the integration test then checks the
installed function on every (state, event) pair)."""

from __future__ import annotations

from callwarden.database.declared import (
    BEGIN,
    BEGIN_HOST,
    COLUMNS,
    END,
    END_HOST,
    OUTPUT,
    generated_block,
    generated_host_block,
    pg_regex,
)
from callwarden.database.migrate import available
from callwarden.events.states import LEGAL
from callwarden.events.types import VERSIONS
from callwarden.projections.columns import READ_COLUMNS
from callwarden.projections.fold import OBSERVED_FIELDS, CallProjection


def _carried(begin: str = BEGIN, end: str = END) -> str:
    """The block as the newest migration carrying one has it (migrations are immutable:
    a new rendering comes in a new one)."""
    texts = [m.sql for m in available() if begin in m.sql]
    start = texts[-1].index(begin)
    return texts[-1][start:texts[-1].index(end, start) + len(end)]


def test_the_migration_carries_the_declarations_rendering() -> None:
    assert _carried() == generated_block()


def test_the_migration_carries_the_projections_rendering() -> None:
    """apply_event, write_events and settle (0017): the rules of projections/writes.py
    and the write path's settle_ctes, rendered."""
    assert _carried(BEGIN_HOST, END_HOST) == generated_host_block()


def test_every_column_the_projection_reads_is_one_apply_event_writes() -> None:
    written = {c for c, _ in COLUMNS.values()} | {"call_output"}
    assert written == set(READ_COLUMNS)
    assert set(COLUMNS) | set(OUTPUT) == set(CallProjection.__struct_fields__) - OBSERVED_FIELDS


def test_the_rendering_names_every_legal_pair_and_every_event_version() -> None:
    block = generated_block()
    for (state, event), dest in LEGAL.items():
        where = "state IS NULL" if state is None else f"state = '{state.value}'"
        assert f"WHEN {where} AND event = '{event}' THEN '{dest.value}'" in block
    for name, version in VERSIONS.items():
        assert f"WHEN event = '{name}' THEN {version}" in block


def test_a_python_space_is_a_space_in_sql_too_inside_and_outside_brackets() -> None:
    assert pg_regex(r"a\sb") == (r"a[\s\u001c-\u001f\u0085\u00a0\u1680\u2000-\u200a\u2028"
                                 r"\u2029\u202f\u205f\u3000]b")
    assert pg_regex(r"[^\s,]\b") == (r"[^\s\u001c-\u001f\u0085\u00a0\u1680\u2000-\u200a"
                                     r"\u2028\u2029\u202f\u205f\u3000,]\y")
    assert pg_regex(r"[]\s]\s") == pg_regex(r"[]\s]") + pg_regex(r"\s")
