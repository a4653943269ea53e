"""One settings object and one file for every actor (issue 25 item 4): ``CALLWARDEN_CONFIG``
names the file each actor reads when it is given none — the commands, the queue
processes, the host's own code through :func:`callwarden.load_settings` — so a web process,
its workers, the reconciler and ``serve`` given the same environment agree on every
setting; the environment still wins over the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from callwarden import Settings, load_settings
from callwarden.cli.main import main
from callwarden.errors import ConfigError
from callwarden.providers.storage import LocalFolderStore
from callwarden.queue.process import options_from_env

FILE = """
[calls]
finalize_lease_s = 333

[reconcile]
batch_size = 7
heartbeat_timeout_s = 45

[webhooks]
max_body_bytes = 4096

[serve]
port = 9123
"""


@pytest.fixture
def deployment(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "callwarden.toml"
    path.write_text(FILE, encoding="utf-8")
    return {"CALLWARDEN_CONFIG": str(path), "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media"),
            "CALLWARDEN_RECONCILE_BATCH_SIZE": "9", "CALLWARDEN_KIE_URL": "http://127.0.0.7:1",
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}


def test_one_object_holds_every_actors_settings_from_the_one_file(
        deployment: dict[str, str], tmp_path: Path) -> None:
    s = load_settings(env=deployment)
    assert isinstance(s, Settings)
    assert s.path == tmp_path / "callwarden.toml"
    assert s.calls.finalize_lease_s == 333
    assert s.reconcile.batch_size == 9  # the environment wins over the file
    assert s.reconcile.heartbeat_timeout_s == 45
    assert s.webhooks.max_body_bytes == 4096
    assert s.listen.port == 9123
    assert s.providers.kie.base_url == "http://127.0.0.7:1"
    assert isinstance(s.media, LocalFolderStore)
    assert s.media.root == tmp_path / "media"
    assert s.own_calls()["config"] is s.calls
    assert s.reconciler()["config"] is s.reconcile


def test_a_queue_process_reads_the_same_file(deployment: dict[str, str]) -> None:
    options = options_from_env(deployment)
    assert options.config.finalize_lease_s == 333
    assert options.settings.kie.base_url == "http://127.0.0.7:1"


def test_the_reconciler_wants_a_media_store(deployment: dict[str, str]) -> None:
    del deployment["CALLWARDEN_MEDIA_DIR"]
    s = load_settings(env=deployment)
    assert s.media is None
    assert s.own_calls()["media"] is None  # text-only own calls need none
    with pytest.raises(ConfigError, match="CALLWARDEN_MEDIA_DIR"):
        s.reconciler()


def test_a_command_given_no_config_reads_the_file_the_setting_names(
        deployment: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[reconcile]\nbatch_sise = 5\n", encoding="utf-8")
    for name, value in {**deployment, "CALLWARDEN_CONFIG": str(bad)}.items():
        monkeypatch.setenv(name, value)
    assert main(["reconcile", "--once"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err
    assert "batch_sise" in err
    with pytest.raises(ConfigError, match="batch_sise"):
        load_settings()


@pytest.mark.parametrize("name", ["KIE", "REPLICATE", "ELEVENLABS", "ANTHROPIC"])
def test_a_provider_url_with_its_api_version_is_refused_naming_the_variable(
        name: str, deployment: dict[str, str]) -> None:
    """The documented form is the base (``https://api.replicate.com``): a URL ending in
    ``/v1`` would send every request to ``/v1/v1/...`` and fail as a 404 per call."""
    with pytest.raises(ConfigError, match=f"CALLWARDEN_{name}_URL: the provider's base URL"):
        load_settings(env={**deployment, f"CALLWARDEN_{name}_URL": "https://x.example/v1/"})
