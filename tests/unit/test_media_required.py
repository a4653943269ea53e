"""``worker``, ``reconcile``, ``serve`` and the Celery and arq processes finalize calls whose
results are files: without a media store named (``CALLWARDEN_MEDIA_DIR``,
``CALLWARDEN_MEDIA_S3_BUCKET`` or ``--media-dir``) they stop before connecting, exit 2 (a
queue process: a ``ConfigError``), and say which settings to set — never a silent folder
under the user's home (issue 25 item 4, review finding 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from callwarden.cli.main import main
from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS
from callwarden.providers.storage import LocalFolderStore, S3Store
from callwarden.queue.process import options_from_env
from callwarden.settings import configured_media
from tests.support.acme import registry_restored

DEAD = "postgresql://nobody@127.0.0.1:1/none"  # a connection would fail differently


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("CALLWARDEN_MEDIA_DIR", "CALLWARDEN_MEDIA_S3_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", DEAD)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


@pytest.mark.parametrize("argv", [["reconcile", "--once"], ["serve", "--port", "0"],
                                  ["worker", "--concurrency", "1"]])
def test_without_a_media_store_the_command_exits_2_naming_the_settings(
        argv: list[str], bare_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no media store configured" in err
    assert "CALLWARDEN_MEDIA_DIR" in err
    assert "CALLWARDEN_MEDIA_S3_BUCKET" in err
    assert "--media-dir" in err
    assert "database unavailable" not in err.lower()  # refused before connecting
    assert not (bare_env / "home").exists()
    assert not (bare_env / "data").exists()


def test_a_queue_process_without_a_media_store_is_refused(bare_env: Path) -> None:
    """A Celery or arq process reads its options from the environment: no store named is
    a ``ConfigError`` before its pool opens, naming the settings (it has no flag)."""
    with pytest.raises(ConfigError) as refused:
        options_from_env()
    message = str(refused.value)
    assert "a queue's worker process: no media store configured" in message
    assert "CALLWARDEN_MEDIA_DIR" in message
    assert "CALLWARDEN_MEDIA_S3_BUCKET" in message
    assert "--media-dir" not in message
    assert not (bare_env / "home").exists()
    assert not (bare_env / "data").exists()
    named = options_from_env({"DATABASE_URL": DEAD, "CALLWARDEN_MEDIA_DIR": str(bare_env)})
    assert isinstance(named.media, LocalFolderStore)
    assert named.media.root == bare_env


def test_a_named_store_is_the_one_used(tmp_path: Path) -> None:
    folder = configured_media({}, tmp_path / "m", "reconcile")
    assert isinstance(folder, LocalFolderStore)
    assert folder.root == tmp_path / "m"
    by_env = configured_media({"CALLWARDEN_MEDIA_DIR": str(tmp_path / "e")}, None, "serve")
    assert isinstance(by_env, LocalFolderStore)
    assert by_env.root == tmp_path / "e"
    s3 = configured_media({"CALLWARDEN_MEDIA_S3_BUCKET": "b", "AWS_REGION": "us-east-1"},
                          None, "serve")
    assert isinstance(s3, S3Store)


def test_with_only_text_kinds_no_store_is_needed() -> None:
    with registry_restored():
        for name in [k for k, spec in KINDS.items() if spec.media_results]:
            del KINDS[name]
        configured_media({}, None, "reconcile")  # nothing to store: no refusal
    with pytest.raises(ConfigError):
        configured_media({}, None, "reconcile")
