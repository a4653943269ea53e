"""Two test runs on one machine never break each other (issue 40, item 7).

pytest keeps every user's runs under one folder, ``/tmp/pytest-of-<user>``, and each new
session narrows that folder back to mode 0700. The embedded Postgres runs as a system user
of its own: with its data directory under that folder, a second pytest session started
anywhere on the machine locked it out of its own files, and its next checkpoint PANICked
(every test after it errored). tests/conftest.py gives each run a folder of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys

from callwarden.database.db import Conn
from tests.acceptance.conftest import ROOT


async def test_another_pytest_session_leaves_this_runs_postgres_working(conn: Conn) -> None:
    """A second, unrelated pytest session (one test, using tmp_path) runs to the end
    while this run's embedded Postgres serves this test; after it the server still
    checkpoints and answers. Before the fix it PANICked here."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "CALLWARDEN_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
        "tests/unit/test_layers.py", "-k", "upward", cwd=ROOT, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, out.decode()[-2000:]
    await conn.execute("CHECKPOINT")
    await conn.execute("CREATE TABLE after_the_other_run (x int)")
    await conn.execute("INSERT INTO after_the_other_run VALUES (1)")
    row = await (await conn.execute("SELECT count(*) AS n FROM after_the_other_run")).fetchone()
    assert row == {"n": 1}
