"""The host API's transition table, event versions, state statuses and redaction are the
declaration's rendering (engine/database/declared.py), carried verbatim by the newest
migration that carries the block (0014, then 0016): a change to the declaration without a
migration that carries its new rendering fails here (the integration test then checks the
installed function on every (state, event) pair)."""

from __future__ import annotations

from callwarden.database.declared import BEGIN, END, generated_block, pg_regex
from callwarden.database.migrate import available
from callwarden.events.states import LEGAL
from callwarden.events.types import VERSIONS


def _carried() -> str:
    """The block as the newest migration carrying one has it (migrations are immutable:
    a new rendering comes in a new one)."""
    texts = [m.sql for m in available() if BEGIN in m.sql]
    start, end = texts[-1].index(BEGIN), texts[-1].index(END) + len(END)
    return texts[-1][start:end]


def test_the_migration_carries_the_declarations_rendering() -> None:
    assert _carried() == generated_block()


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
