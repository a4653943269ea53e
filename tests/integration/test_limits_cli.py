"""``callwarden limits`` (issue 42): the settings file's ``[limits.<account>]`` tables are
validated (a ``ConfigError`` naming the account and the setting), written to
``callwarden.limits`` by ``apply`` (an account the file drops is removed), and shown with
each account's calls in flight and the jobs waiting for it; ``check`` says each
account's caps in words, names a kind it does not know with the closest one, and compares
the file with ``callwarden.limits`` (a missing or different account is a problem)."""

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


CHECKED = """
[limits.kie-main]
kinds = ["kie-standard", "kie-veo"]
in_flight = 5
tenant_in_flight = 2
creates = 20
per_s = 10

[limits.eleven]
kinds = ["elevenlabs-sync"]
in_flight = 3
wait_s = 5
"""


def _check(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
           settings: Path, tmp_path: Path) -> tuple[int, list[tuple[str, str]]]:
    """``check --json`` on ``settings`` with a media store (else a problem of its own):
    the exit status and the findings that speak of limits, as (level, text)."""
    for name in ("CALLWARDEN_CONFIG", "CALLWARDEN_MEDIA_S3_BUCKET", "CALLWARDEN_PROVIDERS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CALLWARDEN_MEDIA_DIR", str(tmp_path / "media"))
    capsys.readouterr()
    code = cli(db_url, monkeypatch, "check", "--json", "--config", str(settings))
    data = json.loads(capsys.readouterr().out)
    assert data["problems"] == sum(f["level"] == "problem" for f in data["findings"])
    return code, [(f["level"], f["text"]) for f in data["findings"]
                  if "limits" in f["text"]]


def _sql(db_url: str, *statements: str) -> None:
    async def go(conn: Conn) -> None:
        for statement in statements:
            await conn.execute(statement.encode())
    run_sync(db_url, go)


def test_check_names_an_account_the_database_lacks_or_holds_with_other_caps(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Proves item 1 of issue 42 for ``check``: against rows a host wrote by plain SQL
    (kie-main with another in_flight and wait, eleven missing, an account only in the
    database), ``check --json`` exits 2 with one problem per account the file and the
    database disagree on, naming the settings that differ and ``callwarden limits apply``,
    a note per configured account saying its kinds and caps in words, and a note (not a
    problem) for the account only the database holds. Once the rows equal the file (the
    kinds in another order: a start does not care), the limits give notes and an ok only,
    and ``check`` exits 0."""
    settings = tmp_path / "callwarden.toml"
    settings.write_text(CHECKED)
    _sql(db_url, "INSERT INTO callwarden.limits (account, kinds, in_flight, tenant_in_flight, "
                 "creates, per_s, wait_s) VALUES ('kie-main', ARRAY['kie-standard', "
                 "'kie-veo'], 3, 2, 20, 10, 4)",
         "INSERT INTO callwarden.limits (account, kinds, in_flight) "
         "VALUES ('by-sql', ARRAY['kie-suno'], 1)")
    code, found = _check(db_url, monkeypatch, capsys, settings, tmp_path)
    assert code == 2
    problems = [text for level, text in found if level == "problem"]
    assert problems == [
        "limits kie-main: callwarden.limits differs from the settings file (in_flight 3 in "
        "callwarden.limits, 5 in the file; wait_s 4 in callwarden.limits, 2 in the file): "
        "starts obey the database; run callwarden limits apply",
        "limits eleven: in the settings file, not in callwarden.limits: no start obeys "
        "it; run callwarden limits apply"], found
    notes = [text for level, text in found if level == "note"]
    assert ("limits kie-main (kie-standard, kie-veo): 5 in flight, 2 per user, 20 creates "
            "per 10 s") in notes
    assert "limits eleven (elevenlabs-sync): 3 in flight, a refused start waits 5 s" in notes
    assert any(t.startswith("limits by-sql (kie-suno): 1 in flight: in callwarden.limits, "
                            "not in the settings file") for t in notes), notes

    _sql(db_url, "UPDATE callwarden.limits SET in_flight = 5, wait_s = 2, "
                 "kinds = ARRAY['kie-veo', 'kie-standard'] WHERE account = 'kie-main'",
         "INSERT INTO callwarden.limits (account, kinds, in_flight, wait_s) "
         "VALUES ('eleven', ARRAY['elevenlabs-sync'], 3, 5)")
    code, found = _check(db_url, monkeypatch, capsys, settings, tmp_path)
    assert code == 0, found
    assert {level for level, _ in found} == {"ok", "note"}
    assert ("ok", "callwarden.limits holds the settings file's 2 account(s)") in found
    assert sum(level == "note" and text.startswith("limits ") for level, text in found) == 3


def test_check_answers_a_misspelled_kind_with_the_closest_known_one(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A kind callwarden does not know (no call would ever be of it, so the calls it meant
    start unlimited) is a problem naming the account and the closest known kind, printed
    on stderr by ``check`` (exit 2), while a kind spelled right in the same account is
    not named."""
    settings = tmp_path / "callwarden.toml"
    settings.write_text('[limits.kie-main]\nkinds = ["kie-veo", "kie-standrd"]\n'
                        "in_flight = 2\n")
    monkeypatch.setenv("COLUMNS", "250")
    code, found = _check(db_url, monkeypatch, capsys, settings, tmp_path)
    assert code == 2
    assert ("problem", "[limits] kie-main: unknown kind 'kie-standrd' (did you mean "
                       "kie-standard?): no call is of that kind, so the calls it meant start "
                       "unlimited") in found
    assert not [t for _, t in found if "'kie-veo'" in t]
    assert cli(db_url, monkeypatch, "check", "--config", str(settings)) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown kind 'kie-standrd' (did you mean kie-standard?)" in err
