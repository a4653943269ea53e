"""The demo's worker processes: real ``callwarden worker`` subprocesses pointed at the
simulator, killed with SIGKILL at random moments and restarted (a queue's redelivery then
hands their jobs to the survivors)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from pathlib import Path
from typing import Protocol

__all__ = ["Fleet", "WorkerFleet"]

WORKER_FLAGS = ["--concurrency", "6", "--visibility", "3", "--poll-interval", "0.3",
                "--poll-budget", "6", "--finalize-lease", "5", "--heartbeat-every", "0.5",
                "--media-timeout", "2", "--store-timeout", "1", "--lease-margin", "1",
                "--grace", "2", "--poll-empty", "0.2", "--max-deliveries", "6"]


class Fleet(Protocol):
    """What the demo drives: the reference fleet, or a queue's (:mod:`callwarden.demo.queues`)."""

    kills: int

    async def start(self) -> None: ...

    async def kill_randomly(self, rate: float, rng: random.Random,
                            stop: asyncio.Event) -> None: ...

    async def stop(self, grace_s: float = 5.0) -> None: ...


class WorkerFleet:
    """``size`` ``callwarden worker`` processes (a subclass runs another command:
    :meth:`command`, each in its own session when ``new_session``, killed by
    :meth:`kill`)."""

    name = "worker"
    new_session = False

    def __init__(self, size: int, env: dict[str, str], log_dir: Path) -> None:
        self.size, self.env, self.log_dir = size, env, log_dir
        self.procs: list[asyncio.subprocess.Process] = []
        self.kills = 0
        self.started = 0

    def command(self) -> list[str]:
        """The worker's ``python`` arguments."""
        return ["-m", "callwarden.cli", "worker", *WORKER_FLAGS]

    def kill(self, proc: asyncio.subprocess.Process) -> None:
        """SIGKILL, as a lost host: nothing runs a shutdown hook."""
        proc.send_signal(signal.SIGKILL)

    async def _spawn(self) -> asyncio.subprocess.Process:
        self.started += 1
        log = open(self.log_dir / f"{self.name}-{self.started}.log", "wb")  # noqa: SIM115, ASYNC230
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *self.command(),
            env={**os.environ, **self.env}, stdout=log, stderr=log,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=self.new_session)
        log.close()  # the child holds its own descriptor
        return proc

    async def start(self) -> None:
        self.procs = [await self._spawn() for _ in range(self.size)]

    async def kill_randomly(self, rate: float, rng: random.Random,
                            stop: asyncio.Event) -> None:
        """SIGKILL a random worker about ``rate`` times a second, restarting each."""
        if rate <= 0:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=rng.expovariate(rate))
                return
            i = rng.randrange(len(self.procs))
            victim = self.procs[i]
            if victim.returncode is None:
                self.kill(victim)
                await victim.wait()
                self.kills += 1
            self.procs[i] = await self._spawn()

    async def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM (graceful: finish in-flight calls), then SIGKILL after ``grace_s``."""
        for p in self.procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), timeout=grace_s)
            except TimeoutError:
                self.kill(p)
                await p.wait()
