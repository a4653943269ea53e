"""Named SQL queries, loaded once from ``engine/sql/*.sql`` (``-- name: x`` headers)."""

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
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";")
    return out


def _load_all() -> dict[str, LiteralString]:
    out: dict[str, LiteralString] = {}
    for entry in resources.files("engine").joinpath("sql").iterdir():
        if entry.name.endswith(".sql"):
            out.update(load_queries(entry.read_text(encoding="utf-8")))
    return out


QUERIES: dict[str, LiteralString] = _load_all()
