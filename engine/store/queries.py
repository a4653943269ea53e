"""Named SQL queries, loaded once from the ``.sql`` files beside the code that runs them
(``engine/<package>/*.sql``, ``-- name: x`` headers; a name is defined once)."""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

__all__ = ["QUERIES", "load_queries"]

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(text: str) -> dict[str, LiteralString]:
    """Split a ``.sql`` file into ``{name: statement}``."""
    parts = _HEADER.split(text)
    out: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in out:
            raise RuntimeError(f"query {name!r} defined twice in one file")
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


PACKAGES = ("store", "calls", "reconciler", "service", "replay", "queue", "demo")


def _load_all() -> dict[str, LiteralString]:
    out: dict[str, LiteralString] = {}
    for package in PACKAGES:
        for entry in sorted(resources.files("callwarden").joinpath(package).iterdir(),
                            key=lambda e: e.name):
            if not entry.name.endswith(".sql"):
                continue
            found = load_queries(entry.read_text(encoding="utf-8"))
            twice = sorted(set(found) & set(out))
            if twice:
                raise RuntimeError(f"queries defined twice: {', '.join(twice)}")
            out.update(found)
    return out


QUERIES: dict[str, LiteralString] = _load_all()
