"""Behind a transaction pooler (``pytest --pgbouncer``; ``.ci/run`` runs the write path,
worker, reconciler and webhook suites that way too): a client's statements run on
whichever server connection is free, so nothing may depend on the session — in particular
no server-side prepared statement (``CALLWARDEN_DB_POOLER=transaction`` turns psycopg's
automatic ones off)."""

from __future__ import annotations

import pytest

from callwarden.database.boundary import transaction
from callwarden.database.db import connect
from callwarden.database.write import execute

pytestmark = pytest.mark.pgbouncer


async def test_a_statement_repeated_across_server_connections_still_runs(db_url: str) -> None:
    """``a`` runs one statement often enough for psycopg to prepare it (5 times), then
    ``b`` holds that server connection in a transaction, so ``a``'s next runs land on
    another server connection: they must not name a statement prepared on the first."""
    async with await connect(db_url) as a, await connect(db_url) as b:
        for _ in range(8):
            assert await execute(a, "service_ping", {}) == [{"ok": 1}]
        async with transaction(b):
            await execute(b, "service_ping", {})
            for _ in range(3):
                assert await execute(a, "service_ping", {}) == [{"ok": 1}]
