"""The TypeScript client for non-Python hosts (``clients/node/``, ``docs/node.md``), run by
pytest so CI runs it: Node's own test runner (``node --test``) against a fresh migrated
database, the provider simulator served by this process and a real Redis, and the
typecheck (``tsc`` with ``checkJs``, ``strict``).

- ``client.test.js`` and ``rpc.test.js``: every host-API call of the client and its typed
  errors, ``runTask``/``runSync``, and the supabase-js ``rpc`` face (a fake client, and the
  real supabase-js through a stand-in for PostgREST over the real functions).
- ``admission.test.js``: ``startCall`` answers ``wait`` over a full account, and the BullMQ
  helper delays the job (not an attempt) until the slot frees (issue 42);
- ``bullmq.test.js``: real BullMQ workers (child processes) SIGKILLed mid-poll and paused
  (SIGSTOP) inside their create past BullMQ's lock, a sync route beating through
  ``callwarden reconcile --once``, and Node's ``succeeded`` racing the reconciler; one create
  per job (the simulator's journal), one settlement per job, ``callwarden verify`` clean.

``clients/node/node_modules`` is installed from the committed lock file (``npm ci``) when
it is missing or older than the lock file. Node 20+ and npm are required: a missing one is
an error naming the package, never a skip. Node's whole output is shown on failure (and
printed, for ``-s``, on success: the scenarios' figures are its ``ℹ`` lines).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from callwarden.database.db import uri
from callwarden.providers.simulator.core import RunningSimulator
from tests.acceptance.conftest import KEY_VARS, PROVIDERS, ROOT
from tests.debian import binary

pytestmark = pytest.mark.xdist_group("fleets")  # spawns BullMQ worker processes

NODE_DIR = ROOT / "clients" / "node"
MISSING = ("{tool} is not installed: apt-get install nodejs npm (Node 20 or later); the "
           "TypeScript client's tests (clients/node) need it")
NODE_TIMEOUT_S = 240.0


def _tool(name: str) -> str:
    """``node`` or ``npm``: on PATH, else installed with apt-get when the tests run as root
    on Debian (tests/debian.py, as the other Debian binaries), else a clear error."""
    found = binary((name,), "nodejs" if name == "node" else "npm")
    if found is None:
        raise RuntimeError(MISSING.format(tool=name))
    return found


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """``clients/node/node_modules``, installed with ``npm ci`` unless it is current."""
    modules = NODE_DIR / "node_modules"
    installed = modules / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < lock.stat().st_mtime:
        done = subprocess.run([_tool("npm"), "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return modules


def node_env(db_url: str, sim: RunningSimulator | None = None,
             redis_url: str | None = None) -> dict[str, str]:
    """This process's environment without callwarden's settings and provider keys, plus
    what the Node tests read (``clients/node/test/support/env.js``)."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("CALLWARDEN_", "AWS_")) and k != "CALLWARDEN_DB_POOLER")
           and k not in KEY_VARS}
    env.update({"DATABASE_URL": uri(db_url), "CALLWARDEN_PYTHON": sys.executable})
    if sim is not None:
        for provider in PROVIDERS:
            env[f"CALLWARDEN_{provider.upper()}_URL"] = sim.url(provider)
        env.update(dict.fromkeys(KEY_VARS, sim.sim.api_key))
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    return env


async def node_test(files: list[str], env: dict[str, str]) -> str:
    """``node --test`` on ``files`` (from clients/node) in a process group of its own
    (worker children included), awaited so that the simulator in this event loop keeps
    serving; its output, or the test fails showing it. Whatever is left of the group at
    the end is killed."""
    proc = await asyncio.create_subprocess_exec(
        _tool("node"), "--test", "--test-reporter=spec", "--test-concurrency=1",
        "--test-timeout=120000", *files, cwd=NODE_DIR, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=NODE_TIMEOUT_S)
    except TimeoutError:
        pytest.fail(f"node --test {' '.join(files)} still running after {NODE_TIMEOUT_S:g} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own group: leftover workers only
    text = out.decode(errors="replace")
    print(text)
    if proc.returncode != 0:
        pytest.fail(f"node --test {' '.join(files)} exited {proc.returncode}:\n{text}",
                    pytrace=False)
    return text


async def test_the_node_client_makes_every_host_api_call_and_raises_typed_errors(
        node_modules: Path, db_url: str) -> None:
    out = await node_test(["test/client.test.js", "test/rpc.test.js"], node_env(db_url))
    assert "ℹ fail 0" in out


async def test_bullmq_workers_killed_and_paused_create_once_and_settle_once(
        node_modules: Path, db_url: str, sim: RunningSimulator, redis_url: str) -> None:
    out = await node_test(["test/bullmq.test.js"], node_env(db_url, sim, redis_url))
    assert "ℹ fail 0" in out
    creates = [e for e in sim.sim.journal.entries("kie", "create") if "job:" in e.body.decode()]
    assert len(creates) == 12  # (a) 6 jobs, (b) 2, (d) 4: one create each


@pytest.mark.xdist_group("fleets")  # a BullMQ worker over Redis
async def test_the_node_client_waits_on_a_full_account_and_bullmq_delays_the_job(
        node_modules: Path, db_url: str, redis_url: str) -> None:
    """``clients/node/test/admission.test.js``: ``startCall`` answers ``wait`` with the
    limit and ``retryAfterMs`` over both faces, ``runTask``/``runSync`` answer
    ``status: 'waiting'`` without calling the host's code, and the BullMQ helper moves a
    waiting job to the delayed set (not an attempt) until the slot frees, then it runs
    once (see the file)."""
    out = await node_test(["test/admission.test.js"], node_env(db_url, None, redis_url))
    assert "ℹ fail 0" in out


def test_the_node_client_typechecks(node_modules: Path) -> None:
    done = subprocess.run([_tool("node"), str(node_modules / "typescript" / "bin" / "tsc"),
                           "-p", str(NODE_DIR)], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == 0, f"tsc -p clients/node:\n{done.stdout}\n{done.stderr}"
