"""The docs name tests that exist: every ``test_...`` a page of ``docs/`` or the README
cites (as the test that holds a behaviour) is a test function or a test module here, so a
renamed or deleted test cannot leave a table pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A test name, unless it is a recording's file name (``test_x[False].yaml``, ``test_x.yaml``)
# or a prefix (``test_sim_fidelity_<p>``).
CITED = re.compile(r"\b(test_\w*[a-z0-9])(?![\w\[.]*\.yaml)(?![\[<\w])")


def _known() -> set[str]:
    known = set()
    for path in (ROOT / "tests").rglob("*.py"):
        known.add(path.stem)
        known.update(re.findall(r"def (test_\w+)", path.read_text(encoding="utf-8")))
    return known


def test_every_test_the_docs_cite_exists() -> None:
    known = _known()
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    missing = sorted({f"{page.name}: {name}" for page in pages
                      for name in CITED.findall(page.read_text(encoding="utf-8"))
                      if name not in known})
    assert missing == []


def test_the_citation_pattern_skips_recordings_and_prefixes() -> None:
    text = ("`test_a_real_one`, cassettes `test_predictions_create_blocking[*].yaml`, "
            "`trainings.yaml`, `test_run.yaml`, `test_sim_fidelity_<p>.py`")
    assert CITED.findall(text) == ["test_a_real_one"]
