"""Acceptance fixtures: the simulator served by the test process, and real
``callwarden worker`` subprocesses pointed at it and at the test's database.

Workers are started with ``asyncio.create_subprocess_exec`` so that the simulator (in this
event loop) keeps serving while the test awaits them. Their stderr goes to a file per
process, shown when an assertion about the process fails. Every process started here is
killed (by its own pid) at teardown if it is still running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from callwarden.providers.simulator.core import RunningSimulator, running_simulator

ROOT = Path(__file__).resolve().parents[2]
KEY_VARS = ("KIE_API_KEY", "REPLICATE_API_TOKEN", "ELEVENLABS_API_KEY", "ANTHROPIC_API_KEY")
PROVIDERS = ("kie", "replicate", "elevenlabs", "anthropic")


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    async with running_simulator() as rs:
        yield rs


class WorkerProcess:
    """One ``python -m callwarden.cli worker`` subprocess and its log."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc, self.log = proc, log

    def logs(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    async def exited(self, timeout_s: float) -> int:
        """The exit code (``-9`` after SIGKILL), waiting at most ``timeout_s``."""
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout=timeout_s)
        except TimeoutError:
            pytest.fail(f"worker {self.proc.pid} still running after {timeout_s}s:\n"
                        f"{self.logs()}")

    async def terminate(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (graceful stop); the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return await self.exited(timeout_s)


class Workers:
    """Starts worker subprocesses against one database and one simulator."""

    def __init__(self, db_url: str, sim: RunningSimulator, tmp_path: Path) -> None:
        self.db_url, self.sim, self.tmp_path = db_url, sim, tmp_path
        self.started: list[WorkerProcess] = []

    def env(self, failpoints: str | None, extra: dict[str, str] | None = None
            ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CALLWARDEN_", "AWS_")) and k not in KEY_VARS}
        env["DATABASE_URL"] = self.db_url
        for provider in PROVIDERS:
            env[f"CALLWARDEN_{provider.upper()}_URL"] = self.sim.url(provider)
        env.update(dict.fromkeys(KEY_VARS, self.sim.sim.api_key))
        if failpoints:
            env["CALLWARDEN_FAILPOINTS"] = failpoints
        env.update(extra or {})
        return env

    async def start(self, args: Sequence[str], *, failpoints: str | None = None,
                    env: dict[str, str] | None = None) -> WorkerProcess:
        log = self.tmp_path / f"worker-{len(self.started) + 1}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "callwarden.cli", "worker", *args,
                env=self.env(failpoints, env), cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
                stdout=err, stderr=err)
        worker = WorkerProcess(proc, log)
        self.started.append(worker)
        return worker

    async def kill_leftovers(self) -> None:
        for w in self.started:
            if w.proc.returncode is None:
                w.proc.kill()
                await w.proc.wait()


@pytest.fixture
async def workers(db_url: str, sim: RunningSimulator, tmp_path: Path
                  ) -> AsyncIterator[Workers]:
    ws = Workers(db_url, sim, tmp_path)
    try:
        yield ws
    finally:
        await ws.kill_leftovers()
