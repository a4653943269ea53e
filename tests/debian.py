"""Debian binaries some tests need (chromium, redis-server, promtool): found on PATH or in
their Debian location, else — on a Debian machine where the tests run as root (a fresh dev
box, CI) — installed with apt-get, so the README's test command holds on a machine that
starts with only Python. Elsewhere a missing binary is the caller's clear failure, never
a skip."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["binary"]


def _find(names: tuple[str, ...], paths: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in paths if Path(p).is_file()), None)


#: One lock for every install a test makes, whichever process makes it (two xdist workers,
#: or a test and a developer's own apt-get): apt-get refuses to run while another holds
#: dpkg's lock, so two installs at once would fail one of them.
LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / "callwarden-tests-apt.lock"
#: How long apt-get waits for dpkg's own lock (held by an install outside the tests).
DPKG_LOCK_WAIT_S = 600


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT_S}", *args],
                          check=False, capture_output=True, text=True, timeout=1500,
                          env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def binary(names: tuple[str, ...], package: str, *, paths: tuple[str, ...] = ()) -> str | None:
    """The first of ``names`` found (or of ``paths``), installing Debian's ``package``
    first if none is and we may; ``None`` if it is still missing. Installs are serialised
    by :data:`LOCK` and wait for dpkg's lock; a process that waited looks again before
    installing (the one before it may have installed the same package)."""
    found = _find(names, paths)
    if found is not None or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks until the install before ours is done
        try:
            found = _find(names, paths)
            if found is None:
                _apt_get("update", "-qq")
                _apt_get("install", "-y", "-qq", package)
                found = _find(names, paths)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return found
