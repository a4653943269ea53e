"""Every actor reads its settings one way (engine/config.py): defaults < file < environment
(< a command's flags), validated; one file can hold every actor's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from callwarden.calls.config import load_call_config
from callwarden.cli.main import build_parser
from callwarden.cli.worker import call_config
from callwarden.errors import ConfigError
from callwarden.reconciler.config import load_config
from callwarden.service.webhooks import load_webhook_config

DEPLOYMENT = """
[reconcile]
batch_size = 20
thresholds_s = { kie-standard = 900 }

[calls]
finalize_lease_s = 300
media_allow_hosts = ["cdn.example"]
poll_interval_s = { kie-standard = 7 }

[webhooks]
max_body_bytes = 4096
"""


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    path = tmp_path / "callwarden.toml"
    path.write_text(DEPLOYMENT, encoding="utf-8")
    return path


def test_one_file_configures_every_actor_each_from_its_table(deployment: Path) -> None:
    assert load_config(deployment).batch_size == 20
    assert load_config(deployment).threshold_for("kie-standard") == 900
    calls = load_call_config(deployment)
    assert (calls.finalize_lease_s, calls.media_allow_hosts) == (300, ("cdn.example",))
    assert calls.interval_for("kie-standard") == 7
    assert load_webhook_config(deployment, {}).max_body_bytes == 4096


def test_the_environment_overrides_the_file_and_flags_override_both(deployment: Path) -> None:
    env = {"CALLWARDEN_CALL_FINALIZE_LEASE_S": "200",
           "CALLWARDEN_CALL_POLL_INTERVAL_KIE_STANDARD": "3",
           "CALLWARDEN_CALL_POLL_BUDGET_REPLICATE_PREDICTION": "30",
           "CALLWARDEN_MEDIA_ALLOW_HOSTS": "a.example, *.b.example",
           "CALLWARDEN_WEBHOOK_POLL_TIMEOUT_S": "2.5",
           "CALLWARDEN_REPLICATE_WEBHOOK_SECRET": "whsec_x"}
    calls = load_call_config(deployment, env)
    assert calls.finalize_lease_s == 200
    assert calls.interval_for("kie-standard") == 3
    assert calls.budget_for("replicate-prediction") == 30
    assert calls.media_allow_hosts == ("a.example", "*.b.example")
    hooks = load_webhook_config(deployment, env)
    assert (hooks.poll_timeout_s, hooks.max_body_bytes) == (2.5, 4096)
    assert hooks.secrets == {"replicate": "whsec_x"}
    args = build_parser().parse_args(["worker", "--config", str(deployment),
                                      "--finalize-lease", "400", "--poll-interval", "9"])
    flagged = call_config(args, env)
    assert flagged.finalize_lease_s == 400
    assert flagged.interval_for("kie-standard") == 9
    assert flagged.media_allow_hosts == ("a.example", "*.b.example")


@pytest.mark.parametrize(("env", "message"), [
    ({"CALLWARDEN_CALL_FINALIZE_LEAS_S": "1"}, "CALLWARDEN_CALL_FINALIZE_LEAS_S: no such"),
    ({"CALLWARDEN_CALL_POLL_INTERVAL_MIDJOURNEY": "1"}, "unknown provider_kind"),
    ({"CALLWARDEN_CALL_MEDIA_TIMEOUT_S": "soon"}, "invalid calls configuration"),
    ({"CALLWARDEN_CALL_LEASE_MARGIN_S": "500"}, "lease_margin_s"),
    ({"CALLWARDEN_WEBHOOK_MAX_BODY": "1"}, "CALLWARDEN_WEBHOOK_MAX_BODY: no such"),
])
def test_a_bad_setting_is_a_config_error_naming_it(env: dict[str, str], message: str) -> None:
    loader = load_webhook_config if "WEBHOOK" in next(iter(env)) else load_call_config
    with pytest.raises(ConfigError, match=message):
        loader(None, env)


def test_a_bad_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[calls]\nfinalize_lease_s = \n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_call_config(path)
    path.write_text("calls = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[calls\] must be a table"):
        load_call_config(path)


def test_a_typo_in_the_file_is_an_error_not_a_silent_default(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[calls]\nfinalize_leas_s = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="finalize_leas_s"):
        load_call_config(path)
    path.write_text("[webhooks]\nmax_body = 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="max_body"):
        load_webhook_config(path, {})
    path.write_text("[call]\nfinalize_lease_s = 1\n[reconcile]\nbatch_size = 2\n",
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown table"):
        load_call_config(path)


def test_the_lease_margin_defaults_the_same_from_every_source(deployment: Path) -> None:
    """The margin's default (15 s, or a quarter of a shorter lease) is the struct's, so a
    flag, a variable and a file that set the same lease give the same margin, and an
    explicit margin always wins."""
    env = {"CALLWARDEN_CALL_FINALIZE_LEASE_S": "12"}
    assert load_call_config(None, env).margin_s == 3
    flag = build_parser().parse_args(["worker", "--finalize-lease", "12"])
    assert call_config(flag, {}).margin_s == 3
    both = build_parser().parse_args(["worker", "--finalize-lease", "200"])
    assert call_config(both, {"CALLWARDEN_CALL_LEASE_MARGIN_S": "5"}).margin_s == 5
    assert load_call_config(deployment).margin_s == 15
