"""The database port is one protocol, and it stays a port only because two adapters speak it."""

from __future__ import annotations

import inspect

from callwarden.database import port
from callwarden.database.port import Database
from callwarden.database.postgres import PostgresDatabase
from tests.simulation.driver import Gated


def _protocols() -> list[str]:
    return [name for name, obj in vars(port).items()
            if inspect.isclass(obj) and obj.__module__ == port.__name__
            and getattr(obj, "_is_protocol", False)]


def _members(cls: type) -> set[str]:
    return {name for name, obj in vars(cls).items()
            if not name.startswith("_") and inspect.iscoroutinefunction(obj)}


def test_the_database_is_described_by_one_protocol() -> None:
    assert _protocols() == ["Database"]


def test_both_adapters_speak_all_of_it_with_its_signatures() -> None:
    wanted = _members(Database)
    assert wanted >= {"load", "append", "transition", "claim", "find_job", "ping"}
    for adapter in (PostgresDatabase, Gated):
        assert wanted <= _members(adapter), (adapter.__name__, wanted - _members(adapter))
        for name in wanted:
            ours = list(inspect.signature(getattr(adapter, name)).parameters)
            assert ours == list(inspect.signature(getattr(Database, name)).parameters), \
                (adapter.__name__, name)


def test_the_simulation_adapter_is_only_the_port() -> None:
    """The gated wrapper adds nothing the port does not name (a method only it had would
    be a second, untyped port)."""
    assert _members(Gated) == _members(Database)
