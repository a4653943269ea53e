"""docs/embedding.md's host-contract table is ``callwarden.database.contract.CONTRACT``, row
for row (the doc cannot drift from what ``callwarden check`` checks), and every contract
column exists in the baseline migration a fresh database gets."""

from __future__ import annotations

import re
from pathlib import Path

from callwarden.database.contract import CONTRACT

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_contract_is_the_checked_one() -> None:
    text = (ROOT / "docs" / "embedding.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| ([\w\[\] ]+) \| (.+) \|$", text,
                      re.MULTILINE)
    assert rows == [(t.name, c.name, c.family, c.why) for t in CONTRACT for c in t.columns]


def test_every_contract_column_is_in_the_baseline() -> None:
    baseline = (ROOT / "migrations" / "0001_host_baseline.sql").read_text(encoding="utf-8")
    for table in CONTRACT:
        body = re.search(rf"CREATE TABLE IF NOT EXISTS {table.name} \((.*?)\n\);", baseline,
                         re.DOTALL)
        assert body is not None, table.name
        declared = {line.split()[0] for line in body.group(1).strip().splitlines()}
        assert {c.name for c in table.columns} <= declared, table.name
