"""docs/README.md is the index of the documentation: every page of docs/ is listed there,
and every relative link of every page (the index's included) reaches a file."""

from __future__ import annotations

import re
from pathlib import Path

from tests.layout import ROOT

DOCS = ROOT / "docs"
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(page.read_text(encoding="utf-8"))
            if not re.match(r"[a-z]+:", t)]


def test_the_index_lists_every_page() -> None:
    listed = {(DOCS / t).resolve() for t in _links(DOCS / "README.md")}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert pages - listed == set()


def test_every_relative_link_reaches_a_file() -> None:
    broken = [(str(page.relative_to(ROOT)), target)
              for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
              for target in _links(page)
              if not (page.parent / target).exists()]
    assert broken == []
