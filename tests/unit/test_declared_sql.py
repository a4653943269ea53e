"""The host API's transition table, event versions and state statuses are the
declaration's rendering (engine/database/declared.py), carried verbatim by migration 0014:
a change to the declaration without a migration that carries its new rendering fails here
(the integration test then checks the installed function on every (state, event) pair)."""

from __future__ import annotations

from importlib import resources

from callwarden.database.declared import BEGIN, END, generated_block
from callwarden.events.states import LEGAL
from callwarden.events.types import VERSIONS


def _carried() -> str:
    text = (resources.files("callwarden.migrations") / "0014_host_api.sql").read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def test_the_migration_carries_the_declarations_rendering() -> None:
    assert _carried() == generated_block()


def test_the_rendering_names_every_legal_pair_and_every_event_version() -> None:
    block = generated_block()
    for (state, event), dest in LEGAL.items():
        where = "state IS NULL" if state is None else f"state = '{state.value}'"
        assert f"WHEN {where} AND event = '{event}' THEN '{dest.value}'" in block
    for name, version in VERSIONS.items():
        assert f"WHEN event = '{name}' THEN {version}" in block
