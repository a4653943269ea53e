"""migrate.statements: how a migration file is split for Citus, which refuses a query
string of several commands when it propagates some DDL (issue 27)."""

from __future__ import annotations

import pytest

from callwarden.database.migrate import available, statements


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
    ("SELECT 'a;b'; SELECT 2", ["SELECT 'a;b'", "SELECT 2"]),
    ("SELECT 'it'';s'", ["SELECT 'it'';s'"]),
    ("SELECT E'it\\';s'; SELECT 2", ["SELECT E'it\\';s'", "SELECT 2"]),
    ('SELECT "a;b" FROM t', ['SELECT "a;b" FROM t']),
    ("DO $$ BEGIN PERFORM 1; END $$; SELECT 2", ["DO $$ BEGIN PERFORM 1; END $$", "SELECT 2"]),
    ("DO $x$ BEGIN PERFORM '$$;'; END $x$;", ["DO $x$ BEGIN PERFORM '$$;'; END $x$"]),
    ("-- a; comment\nSELECT 1; /* b; */", ["-- a; comment\nSELECT 1"]),
    ("SELECT a$b$c; SELECT 2", ["SELECT a$b$c", "SELECT 2"]),
    ("-- nothing; here\n\n", []),
])
def test_split(sql: str, expected: list[str]) -> None:
    assert statements(sql) == expected


def test_every_shipped_migration_splits_into_whole_statements() -> None:
    for mig in available():
        parts = statements(mig.sql)
        assert parts, mig.name
        # joined back, the statements are the file less its blank and comment-only ends
        assert all(not p.endswith(";") for p in parts)
        assert sum(p.count("$$") for p in parts) % 2 == 0, mig.name
