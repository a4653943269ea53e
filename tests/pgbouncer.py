"""PgBouncer in transaction pooling mode between the tests and their Postgres, as
Supabase-style hosts run it (``pytest --pgbouncer``). Started like the embedded Postgres:
Debian's ``pgbouncer`` binary (``.ci/run`` installs it), a config in a temp folder, one
wildcard database entry pointing at the server, 127.0.0.1 only, stopped at the end."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["running_pgbouncer"]


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_pgbouncer(server_url: str, folder: Path, *, run_as: str | None) -> Iterator[str]:
    """Yield the URL of a PgBouncer (transaction mode) in front of ``server_url``'s server
    (its ``dbname`` replaced per test). ``run_as``: the user to drop to (PgBouncer will not
    run as root)."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    target = conninfo_to_dict(server_url)
    port = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    ini = folder / "pgbouncer.ini"
    host, user = target.get("host", "127.0.0.1"), target.get("user", "postgres")
    ini.write_text(f"""[databases]
* = host={host} port={target.get("port", 5432)} user={user}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
""", encoding="utf-8")
    ini.chmod(0o644)
    if run_as is None and os.geteuid() == 0:
        # The embedded server's own user can reach its socket (its folders are opened to
        # that user); any other server is reached over TCP, so any user will do.
        run_as = "embedded_postgres" if _user_exists("embedded_postgres") else "nobody"
    proc = subprocess.Popen([binary, str(ini), *(["-u", run_as] if run_as else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = make_conninfo(host="127.0.0.1", port=str(port),
                        user=str(target.get("user", "postgres")), dbname="postgres")
    try:
        deadline = time.monotonic() + 20
        while True:  # wait for it to accept (bounded): a condition, not a sleep
            try:
                with psycopg.connect(url, prepare_threshold=None, connect_timeout=2) as c:
                    c.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
