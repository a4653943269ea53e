""""Did you mean" for every unknown setting, table and environment variable (issue 41, item
4): a typo in the settings file (``batch_sise``, ``[reconcle]``) or in a ``CALLWARDEN_*``
variable is answered with the known name closest to it. A variable under an actor's prefix
is refused when the actor loads (as an unknown key of its table is); any other
``CALLWARDEN_*`` variable nothing reads is a warning, since a deployment's own tooling may
share the prefix, and every variable callwarden's code reads is known."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from callwarden.calls.config import load_call_config
from callwarden.cli.process import ENV
from callwarden.errors import ConfigError
from callwarden.reconciler.config import load_config
from callwarden.rules.spelling import closest
from callwarden.settings import load_settings, unknown_variables

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(("text", "hint"), [
    ("[reconcile]\nbatch_sise = 5\n", "batch_sise: no such setting (did you mean batch_size?)"),
    ("batch_sise = 5\n", "batch_sise: no such setting (did you mean batch_size?)"),
    ("[reconcle]\nbatch_size = 5\n[calls]\n",
     "unknown table(s) [reconcle] (did you mean [reconcile]?)"),
    ("[reconcle]\nbatch_size = 5\n", "reconcle: no such setting (did you mean [reconcile]?)"),
], ids=["key-in-table", "key-in-flat-file", "table-beside-others", "table-alone"])
def test_an_unknown_name_in_the_file_names_the_closest_known_one(
        text: str, hint: str, tmp_path: Path) -> None:
    path = tmp_path / "callwarden.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    assert str(path) in str(caught.value)
    assert hint in str(caught.value)


def test_a_flat_file_suggests_any_actors_setting(tmp_path: Path) -> None:
    """A flat file is split by name, so its typo may be another actor's setting."""
    path = tmp_path / "callwarden.toml"
    path.write_text("finalize_leas_s = 30\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape("(did you mean finalize_lease_s?)")):
        load_config(path, {})


@pytest.mark.parametrize(("env", "hint"), [
    ({"CALLWARDEN_RECONCILE_BATCH_SISE": "5"}, "CALLWARDEN_RECONCILE_BATCH_SIZE"),
    ({"CALLWARDEN_RECONCILE_THRESHOLDS_KIE_STANDARD": "60"},
     "CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDARD"),
    ({"CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDRD": "60"},
     "CALLWARDEN_RECONCILE_THRESHOLD_KIE_STANDARD"),
])
def test_an_unknown_actor_variable_names_the_closest_known_one(
        env: dict[str, str], hint: str) -> None:
    (name,) = env
    with pytest.raises(ConfigError) as caught:
        load_config(None, env)
    assert str(caught.value).startswith(f"{name}: ")
    assert f"(did you mean {hint}?)" in str(caught.value)


def test_a_call_variable_is_answered_the_same_way() -> None:
    with pytest.raises(ConfigError, match=re.escape(
            "(did you mean CALLWARDEN_CALL_FINALIZE_LEASE_S?)")):
        load_call_config(None, {"CALLWARDEN_CALL_FINALIZE_LEAS_S": "30"})


@pytest.mark.parametrize(("name", "hint"), [
    ("CALLWARDEN_RECONCLE_BATCH_SIZE", "CALLWARDEN_RECONCILE_BATCH_SIZE"),
    ("CALLWARDEN_MEDIA_DIRR", "CALLWARDEN_MEDIA_DIR"),
    ("CALLWARDEN_PRICING", "CALLWARDEN_PRICING_FILE"),
    ("CALLWARDEN_REPLICATE_URI", "CALLWARDEN_REPLICATE_URL"),
])
def test_an_unknown_variable_is_named_with_the_closest_known_one(name: str, hint: str) -> None:
    assert unknown_variables({name: "x", "CALLWARDEN_MEDIA_DIR": "m", "PATH": "/bin"}) == [
        f"{name}: unknown variable, ignored (did you mean {hint}?)"]


def test_an_unknown_variable_with_nothing_close_is_still_named() -> None:
    assert unknown_variables({"CALLWARDEN_ZZZZZZZZ": "1"}) == [
        "CALLWARDEN_ZZZZZZZZ: unknown variable, ignored"]


def test_a_variable_a_command_was_told_to_read_is_known() -> None:
    env = {"CALLWARDEN_OPS_TOKEN": "t"}
    assert unknown_variables(env) != []
    assert unknown_variables(env, also=["CALLWARDEN_OPS_TOKEN"]) == []


def test_load_settings_warns_of_an_unknown_variable(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="callwarden.settings"):
        load_settings(env={"CALLWARDEN_MEDIA_DIRR": str(tmp_path)})
    assert ("CALLWARDEN_MEDIA_DIRR: unknown variable, ignored (did you mean "
            "CALLWARDEN_MEDIA_DIR?)") in caplog.messages


def _read_by_the_code() -> set[str]:
    """Every whole ``CALLWARDEN_*`` name the engine and the providers spell in their code,
    and every name the commands' --help lists (not the ``<FIELD>`` patterns)."""
    literal = re.compile(r"[\"'](CALLWARDEN_[A-Z0-9_]*[A-Z0-9])[\"']")
    names = {m for top in ("engine", "providers") for p in (ROOT / top).rglob("*.py")
             for m in literal.findall(p.read_text(encoding="utf-8"))}
    names |= {n for names in ENV for n in names.split(", ")
              if n.startswith("CALLWARDEN_") and "<" not in n}
    return names


def test_every_variable_the_code_reads_is_known() -> None:
    """The known list cannot fall behind the code: no variable callwarden reads is ever
    warned about (and the scan finds them: it is not vacuous)."""
    names = _read_by_the_code()
    assert {"CALLWARDEN_CONFIG", "CALLWARDEN_DB_POOLER", "CALLWARDEN_REDIS_URL",
            "CALLWARDEN_KIE_WEBHOOK_HMAC_KEY"} <= names
    assert unknown_variables(dict.fromkeys(names, "x")) == []


def test_the_prefix_shared_by_every_variable_does_not_make_them_alike() -> None:
    known = ["CALLWARDEN_CONFIG", "CALLWARDEN_DB_POOLER"]
    assert closest("CALLWARDEN_CONFG", known, prefix="CALLWARDEN_") == "CALLWARDEN_CONFIG"
    assert closest("CALLWARDEN_ON_CITUS", known, prefix="CALLWARDEN_") is None
    assert closest("CALLWARDEN_CONFIG", known, prefix="CALLWARDEN_") is None  # not itself


def test_at_start_only_a_likely_typo_is_warned_of() -> None:
    """A deployment's own tooling shares the prefix (CI's CALLWARDEN_VENDOR, ON_CITUS,
    CITUS_URL): every command warning of each would bury the typo, and broke output the
    tests read. A likely typo is still named with its fix."""
    env = dict.fromkeys(["CALLWARDEN_VENDOR", "CALLWARDEN_ON_CITUS", "CALLWARDEN_CITUS_URL",
                         "CALLWARDEN_CITUS_PORT", "CALLWARDEN_SLOW", "CALLWARDEN_MEDIA_DIRR",
                         "CALLWARDEN_PRICING", "CALLWARDEN_CONFG"], "x")
    assert unknown_variables(env, likely_typos=True) == [
        "CALLWARDEN_CONFG: unknown variable, ignored (did you mean CALLWARDEN_CONFIG?)",
        "CALLWARDEN_MEDIA_DIRR: unknown variable, ignored (did you mean CALLWARDEN_MEDIA_DIR?)",
        "CALLWARDEN_PRICING: unknown variable, ignored (did you mean "
        "CALLWARDEN_PRICING_FILE?)"]
    assert len(unknown_variables(env)) == len(env)
