"""The settlement hook a host subscribes to (issue 41 item 6): a trigger of its own on the
``usage_logs`` UPDATE that settles a reservation. The example host's migrations
(``docs/examples/acme_host/db``: its ``accounts`` and ``002_settled.sql``, the
hook docs/embedding.md shows) are applied to the test's database as the host applies
them; every actor then runs as callwarden's runtime role (``callwarden.grant_runtime``),
which holds no grant on ``accounts``, as a deployment runs it.

Each way a reservation settles reaches the hook, in the settling transaction: a worker
(``CallRunner``) committing a charge below the reservation, a ``cancel`` refunding, the
reconciler sweeping a call whose create never answered; the balance gets back exactly what
was held and not charged, once (a second pass, a second cancel change nothing)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest
from psycopg.conninfo import make_conninfo

from callwarden import OwnCalls, Rate, RateTable, cancel, open_pool
from callwarden.calls.runner import CallRunner
from callwarden.database.clock import utcnow
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.providers.kinds import get_kind
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import LocalFolderStore
from callwarden.reconciler.config import ReconcileConfig
from callwarden.reconciler.loop import Reconciler
from tests.support import no_sleep

# Citus runs no trigger on a distributed table that writes another table (docs/embedding.md)
pytestmark = pytest.mark.plain_postgres

HOST = Path(__file__).resolve().parents[2] / "docs" / "examples" / "acme_host"
PRICES = RateTable(rates=(Rate(kind="anthropic-sync", unit="output_tokens", credits=0.05),))
CLAUDE = {"model": "claude-sonnet-4-6", "max_tokens": 64,
          "messages": [{"role": "user", "content": "hi"}]}
HELD = Decimal(10)


@pytest.fixture
async def runtime(conn: Conn, db_url: str) -> AsyncIterator[Pool]:
    """The host's migrations applied; a pool as callwarden's runtime role."""
    for migration in sorted((HOST / "db").glob("*.sql")):
        await conn.execute(migration.read_text(encoding="utf-8").encode())
    await conn.execute("INSERT INTO accounts (user_id, balance) VALUES ('u-1', 100)")
    role = f"cw_runtime_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN".encode())
    await conn.execute("SELECT callwarden.grant_runtime(%s::regrole)", (role,))
    try:
        async with open_pool(make_conninfo(db_url, user=role), max_size=4) as pool:
            yield pool
    finally:
        await conn.execute(f"DROP OWNED BY {role}".encode())
        await conn.execute(f"DROP ROLE {role}".encode())


async def order(conn: Conn) -> uuid.UUID:
    """What the example host's app does: hold the price on the balance, insert the job and
    its reservation, in one transaction."""
    async with conn.transaction():
        await conn.execute("UPDATE accounts SET balance = balance - %s WHERE user_id = 'u-1'",
                           (HELD,))
        return await create_job(conn, user_id="u-1", credits=float(HELD))


async def balance(conn: Conn) -> Decimal:
    row = await (await conn.execute("SELECT balance FROM accounts WHERE user_id = 'u-1'")
                 ).fetchone()
    assert row is not None
    return Decimal(row["balance"])


async def settled(conn: Conn, job: uuid.UUID) -> tuple[str, Decimal]:
    row = await (await conn.execute("SELECT status, credits_charged FROM usage_logs "
                                    "WHERE job_id = %s", (job,))).fetchone()
    assert row is not None
    return str(row["status"]), Decimal(row["credits_charged"] or 0)


async def test_every_settlement_reaches_the_hosts_hook_once(
        conn: Conn, runtime: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    media = LocalFolderStore(tmp_path / "media")
    async with runtime.connection() as rt:
        privileges = await (await rt.execute(
            "SELECT current_user AS role, has_table_privilege('accounts', 'UPDATE') AS may"
        )).fetchone()
    assert privileges is not None
    assert str(privileges["role"]).startswith("cw_runtime_")
    assert privileges["may"] is False  # the hook needs no grant of the runtime role

    # a worker commits a charge below the reservation: the rest comes back
    worked = await order(conn)
    async with CallRunner(runtime, http, sim.settings, media, pricing=PRICES,
                          sleep=no_sleep) as runner:
        assert (await runner.run(worked, "anthropic-sync", CLAUDE)).result == "completed"
    status, charged = await settled(conn, worked)
    assert status == "committed"
    assert Decimal(0) < charged < HELD
    assert await balance(conn) == 100 - charged

    # a cancel refunds: everything held comes back, and a second cancel changes nothing
    cancelled = await order(conn)
    assert await balance(conn) == 100 - charged - HELD
    async with runtime.connection() as rt:
        assert (await cancel(rt, cancelled, by="host", now=utcnow())).ok
        assert not (await cancel(rt, cancelled, by="host", now=utcnow())).ok
    assert await settled(conn, cancelled) == ("refunded", Decimal(0))
    assert await balance(conn) == 100 - charged

    # the reconciler sweeps a call whose create never answered (another process, another
    # role's session: the hook runs in its transaction too), once
    swept = await order(conn)
    call = await OwnCalls(runtime, media=media, settings=sim.settings).start(
        swept, "kie-standard")
    assert call.action == "create"  # ... and the host's process died before the answer
    past = utcnow() + timedelta(seconds=get_kind("kie-standard").stale_threshold_s + 60)
    reconciler = Reconciler(runtime, http, sim.settings, media, config=ReconcileConfig(),
                            sleep=no_sleep)
    try:
        assert (await reconciler.reconcile_once(past)).swept == 1
        assert (await reconciler.reconcile_once(past + timedelta(minutes=5))).swept == 0
    finally:
        await reconciler.aclose()
    assert await settled(conn, swept) == ("refunded", Decimal(0))
    assert await balance(conn) == 100 - charged
