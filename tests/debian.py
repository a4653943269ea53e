"""Debian binaries some tests need (chromium, redis-server, promtool): found on PATH or in
their Debian location, else — on a Debian machine where the tests run as root (a fresh dev
box, CI) — installed with apt-get, so the README's test command holds on a machine that
starts with only Python. Elsewhere a missing binary is the caller's clear failure, never
a skip."""

from __future__ import annotations

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


def binary(names: tuple[str, ...], package: str, *, paths: tuple[str, ...] = ()) -> str | None:
    """The first of ``names`` found (or of ``paths``), installing Debian's ``package``
    first if none is and we may; ``None`` if it is still missing."""
    found = _find(names, paths)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get") is not None:
        for cmd in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", package]):
            subprocess.run(cmd, check=False, capture_output=True, timeout=900,
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = _find(names, paths)
    return found
