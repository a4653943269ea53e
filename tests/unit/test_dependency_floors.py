"""The dependency floors in pyproject.toml exclude the versions with known holes the
service is exposed to: aiohttp before 3.13.3 inflates a compressed request body before
the receiver's body limit sees it (one 50 KiB POST, 50 MiB of memory)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirement(name: str) -> Requirement:
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    found = [Requirement(r) for r in data["project"]["dependencies"]]
    [req] = [r for r in found if r.name == name]
    return req


def test_aiohttp_floor_excludes_the_versions_that_inflate_before_the_body_limit() -> None:
    spec = requirement("aiohttp").specifier
    assert not spec.contains("3.13.2"), f"aiohttp{spec} allows 3.13.2"
    assert spec.contains("3.13.3")
