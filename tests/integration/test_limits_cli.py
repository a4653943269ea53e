"""``callwarden limits`` (issue 42): the settings file's ``[limits.<account>]`` tables are
validated (a ``ConfigError`` naming the account and the setting), written to
``callwarden.limits`` by ``apply`` (an account the file drops is removed), and shown with
each account's calls in flight and the jobs waiting for it; ``check`` reads them too."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from callwarden.calls.limits import limits_from
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.write import append
from callwarden.errors import ConfigError
from callwarden.events.types import CallStarted
from callwarden.projections.fold import EMPTY
from tests.support.audit import cli, run_sync

FILE = """
[limits.kie-main]
kinds = ["kie-standard", "kie-veo"]
in_flight = 1
tenant_in_flight = 1
creates = 20
per_s = 10

[limits.eleven]
kinds = ["elevenlabs-tts"]
in_flight = 3
"""


@pytest.mark.parametrize(("table", "error"), [
    ({"a": {"kinds": ["kie-standard"], "in_flite": 2}},
     "[limits] a: unknown setting 'in_flite' (did you mean in_flight?)"),
    ({"a": {"kinds": [], "in_flight": 2}}, "kinds must be a non-empty list"),
    ({"a": {"kinds": ["kie-standard"], "in_flight": 0}}, "in_flight must be a whole number >= 1"),
    ({"a": {"kinds": ["kie-standard"], "in_flight": True}}, "in_flight must be a whole number"),
    ({"a": {"kinds": ["kie-standard"], "creates": 20}}, "creates and per_s go together"),
    ({"a": {"kinds": ["kie-standard"]}}, "no cap"),
    ({"a": {"kinds": ["kie-standard"], "in_flight": 2, "tenant_in_flight": 3}},
     "tenant_in_flight (3) above in_flight (2)"),
    ({"a": {"kinds": ["kie-standard"], "in_flight": 2},
      "b": {"kinds": ["kie-standard"], "in_flight": 2}}, "already limited by account 'a'"),
    ({"a": {"kinds": ["kie-standard"], "creates": 2, "per_s": float("nan")}},
     "per_s must be a number of seconds > 0"),
    ({"a": 3}, "want a table"),
])
def test_a_limit_that_cannot_be_held_is_refused_naming_it(table: dict[str, Any],
                                                          error: str) -> None:
    """Each malformed account is a ConfigError whose text names what to fix."""
    with pytest.raises(ConfigError) as caught:
        limits_from(table)
    assert error in str(caught.value)


async def _two_started(conn: Conn) -> list[bool]:
    """Two jobs, each started as a kie-veo call: the second over kie-main's one slot."""
    jobs = []
    for _ in range(2):
        row = await (await conn.execute(
            "SELECT callwarden.create_job('u1', 5::numeric) AS id")).fetchone()
        assert row is not None
        jobs.append(uuid.UUID(str(row["id"])))
    return [(await append(conn, j, EMPTY, CallStarted(at=utcnow(), actor="t", kind="kie-veo",
                                                      sync=False))).ok for j in jobs]


async def _limits_left(conn: Conn) -> int:
    row = await (await conn.execute("SELECT count(*) AS n FROM callwarden.limits")).fetchone()
    assert row is not None
    return int(row["n"])


def test_apply_writes_the_file_and_show_counts_calls_and_waiting(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """apply writes both accounts; a started call fills kie-main's one slot and a second
    job then waits; show --json reports 1 open call and 1 waiting job; a file without
    eleven removes it; apply with no table and no --clear is refused (exit 2)."""
    settings = tmp_path / "callwarden.toml"
    settings.write_text(FILE)
    assert cli(db_url, monkeypatch, "limits", "apply", "--config", str(settings)) == 0
    assert run_sync(db_url, _two_started) == [True, False]
    capsys.readouterr()
    assert cli(db_url, monkeypatch, "limits", "--json") == 0
    shown = {r["account"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(shown) == ["eleven", "kie-main"]
    main = shown["kie-main"]
    assert (main["open_calls"], main["waiting"], main["in_flight"], main["creates"],
            main["per_s"]) == (1, 1, 1, 20, 10.0)

    settings.write_text(FILE.split("[limits.eleven]")[0])
    assert cli(db_url, monkeypatch, "limits", "apply", "--config", str(settings)) == 0
    assert "removed: eleven" in capsys.readouterr().out
    settings.write_text("[calls]\n")
    assert cli(db_url, monkeypatch, "limits", "apply", "--config", str(settings)) == 2
    assert cli(db_url, monkeypatch, "limits", "apply", "--clear",
               "--config", str(settings)) == 0
    assert run_sync(db_url, _limits_left) == 0
