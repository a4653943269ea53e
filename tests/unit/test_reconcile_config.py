"""Reconciler configuration: seed defaults, file and environment layers, start-up checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS
from callwarden.reconciler.config import ReconcileConfig, load_config


def test_defaults_are_the_seeds() -> None:
    c = load_config()
    assert (c.scan_interval_s, c.repoll_interval_s, c.attempt_cap, c.batch_size) == (
        30, 300, 18, 50)
    assert (c.heartbeat_timeout_s, c.legacy_threshold_s, c.claim_lease_s) == (60, 3600, 120)
    assert c.thresholds == {k: s.stale_threshold_s for k, s in KINDS.items()}
    assert c.threshold_for("kie-lip-sync") == 75 * 60


def test_toml_file_then_environment_override(tmp_path: Path) -> None:
    path = tmp_path / "reconcile.toml"
    path.write_text('[reconcile]\nscan_interval_s = 10\nbatch_size = 5\n'
                    '[reconcile.thresholds_s]\n"kie-standard" = 300\n"kie-veo" = 900\n')
    c = load_config(path, {"CALLWARDEN_RECONCILE_BATCH_SIZE": "7",
                           "CALLWARDEN_RECONCILE_THRESHOLD_KIE_VEO": "1200"})
    assert (c.scan_interval_s, c.batch_size) == (10, 7)
    assert (c.threshold_for("kie-standard"), c.threshold_for("kie-veo")) == (300, 1200)
    assert c.threshold_for("kie-suno") == KINDS["kie-suno"].stale_threshold_s


def test_json_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"attempt_cap": 20, "thresholds_s": {"replicate-prediction": 600}}')
    c = load_config(path)
    assert (c.attempt_cap, c.threshold_for("replicate-prediction")) == (20, 600)


@pytest.mark.parametrize(("settings", "message"), [
    ({"thresholds_s": {"midjourney": 60}}, "unknown provider_kind 'midjourney'"),
    ({"thresholds_s": {"replicate-prediction": 3000}}, "result-URL lifetime"),
    ({"thresholds_s": {"kie-standard": -1}}, "must be positive"),
    ({"attempt_cap": 10}, "headroom"),
    ({"repoll_interval_s": 0}, "repoll_interval_s must be positive"),
    ({"batch_size": 0}, "batch_size must be positive"),
    ({"scan_jitter": 1.5}, "scan_jitter"),
])
def test_invalid_settings_are_refused_with_a_clear_error(
        settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReconcileConfig(**settings)  # type: ignore[arg-type]


def test_a_threshold_just_under_the_url_lifetime_minus_buffer_is_accepted() -> None:
    ok = ReconcileConfig(thresholds_s={"replicate-prediction": 2999})
    assert ok.threshold_for("replicate-prediction") == 2999
    with pytest.raises(ConfigError, match="replicate-prediction"):
        ReconcileConfig(thresholds_s={"replicate-prediction": 3000})


@pytest.mark.parametrize(("env", "message"), [
    ({"CALLWARDEN_RECONCILE_THRESHOLD_MIDJOURNEY": "60"}, "unknown provider_kind"),
    ({"CALLWARDEN_RECONCILE_SCAN_INTERVAL_S": "soon"}, "invalid reconcile configuration"),
    ({"CALLWARDEN_RECONCILE_SCAN_INTERVL_S": "5"}, "SCAN_INTERVL_S: no such setting"),
])
def test_bad_environment_is_a_config_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, env)


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("scan_interval_s = = 3")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_a_flat_file_is_split_between_the_actors_that_read_it(tmp_path: Path) -> None:
    """docs/reconciler.md: a file with none of the actors' tables is the reconciler's
    settings; the finalizer's settings read from the same file take only their own names
    (issue 24.12: `invalid calls configuration: ... repoll_interval_s: no such setting`)."""
    from callwarden.calls.config import load_call_config

    path = tmp_path / "flat.toml"
    path.write_text("repoll_interval_s = 1200\nattempt_cap = 5\nfinalize_lease_s = 90\n")
    assert load_config(path).repoll_interval_s == 1200
    assert load_config(path).attempt_cap == 5
    assert load_call_config(path).finalize_lease_s == 90


def test_a_flat_file_with_a_name_no_actor_has_is_refused(tmp_path: Path) -> None:
    from callwarden.calls.config import load_call_config

    path = tmp_path / "flat.toml"
    path.write_text("repoll_intervall_s = 600\n")
    for load in (load_config, load_call_config):
        with pytest.raises(ConfigError, match="repoll_intervall_s"):
            load(path)


@pytest.mark.parametrize("value", [600.0, float("inf"), 1e11])
def test_reserved_without_call_is_bounded(value: float) -> None:
    """Below the legacy threshold, or beyond ten years (``inf`` used to pass and made every
    pass's ``now - timedelta(...)`` overflow), it is refused; 0 and None turn it off."""
    with pytest.raises(ConfigError, match="reserved_without_call_s"):
        ReconcileConfig(reserved_without_call_s=value)
    assert ReconcileConfig(reserved_without_call_s=0).reserved_without_call_s == 0
    assert ReconcileConfig(reserved_without_call_s=None).reserved_without_call_s is None


def test_the_attempt_budget_is_bounded_only_by_the_kinds_a_deployment_runs() -> None:
    """A re-poll every 30 s cannot cover the longest threshold of every kind (60 x 30 s
    is under kie-lip-sync's 4,500 s), so it is refused naming that kind; a deployment that says
    which kinds it runs (``kinds``) is bounded by those alone; an unknown one is named
    (issue 40, item 4)."""
    with pytest.raises(ConfigError, match=r"longest threshold \(4500 s, kie-lip-sync\); "
                                          r"set kinds to the kinds this deployment runs"):
        ReconcileConfig(repoll_interval_s=30, attempt_cap=60)
    ours = ReconcileConfig(repoll_interval_s=30, attempt_cap=60,
                           kinds=("kie-standard", "anthropic-sync"))
    assert ours.deployed == ("kie-standard", "anthropic-sync")
    with pytest.raises(ConfigError, match="kinds names unknown provider_kind 'kie-nope'"):
        ReconcileConfig(kinds=("kie-nope",))
    from_env = load_config(None, {"CALLWARDEN_RECONCILE_REPOLL_INTERVAL_S": "30",
                                  "CALLWARDEN_RECONCILE_ATTEMPT_CAP": "60",
                                  "CALLWARDEN_RECONCILE_KINDS": "kie-standard"})
    assert (from_env.repoll_interval_s, from_env.kinds) == (30, ("kie-standard",))


def test_a_heartbeat_as_slow_as_the_timeout_contradicts_it() -> None:
    """Each valid alone, together every live call would look dead between two beats:
    refused naming both settings; below the timeout, accepted (issue 40, item 4)."""
    from callwarden.calls.config import CallConfig
    from callwarden.settings import contradictions, load_settings

    contradictions(CallConfig(heartbeat_every_s=59), ReconcileConfig())
    with pytest.raises(ConfigError, match=r"\[calls\] heartbeat_every_s \(60 s\) must be "
                                          r"below \[reconcile\] heartbeat_timeout_s \(60 s\)"):
        contradictions(CallConfig(heartbeat_every_s=60), ReconcileConfig())
    # a worker polling a kind every 30 s beats no more often than that
    with pytest.raises(ConfigError, match=r"poll_interval_s for kie-luma \(30 s\) must be"):
        contradictions(CallConfig(), ReconcileConfig(heartbeat_timeout_s=20))
    contradictions(CallConfig(), ReconcileConfig(heartbeat_timeout_s=20,
                                                 kinds=("anthropic-sync",)))
    with pytest.raises(ConfigError, match="heartbeat_every_s"):
        load_settings(None, {"CALLWARDEN_CALL_HEARTBEAT_EVERY_S": "40",
                             "CALLWARDEN_RECONCILE_HEARTBEAT_TIMEOUT_S": "35"})
