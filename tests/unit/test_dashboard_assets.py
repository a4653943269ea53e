"""The dashboard's static files ship in the wheel and load nothing from elsewhere: every
file in ``engine/service/static/`` matches a package-data pattern of ``callwarden.service``
(so ``pip install callwarden`` serves it), none names a remote URL, and the stylesheet
has its dark scheme, focus styles and a phone-width layout."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "engine" / "service" / "static"


def test_every_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["callwarden.service"]
    files = sorted(p.relative_to(STATIC.parent).as_posix() for p in STATIC.iterdir())
    assert files == ["static/callwarden.css", "static/callwarden.js"]
    assert all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files)


def test_the_assets_are_self_contained_and_the_stylesheet_adapts() -> None:
    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), path.name
    css = (STATIC / "callwarden.css").read_text(encoding="utf-8")
    assert "prefers-color-scheme:dark" in css
    assert ":focus-visible" in css
    assert "max-width:600px" in css
    assert ".scroll{overflow-x:auto" in css  # wide tables scroll in their own box
