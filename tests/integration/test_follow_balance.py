"""``callwarden.follow_balance`` (migration 0020): a host's balance follows each settlement
with one line of its own migration. Rows are written and settled here by plain SQL, as a
host (or callwarden's write path, whose one settling UPDATE is the same) does; the full
path through a worker, a cancel and the reconciler is test_settlement_hook.py's.

What holds: a settlement reaches the named balance once (held at the order: what was not
charged comes back; charged at settlement: the charge goes), a user column of another type
than usage_logs' is matched, calling it again replaces the rule (one trigger), a user with
no account row does not stop the settlement, and it is refused — nothing created — for an
unknown column and for a role that does not own usage_logs (PUBLIC may not call it)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job

# Citus runs no trigger on a distributed table that writes another table (follow_balance
# refuses there: the migration's comment)
pytestmark = pytest.mark.plain_postgres


async def _accounts(conn: Conn, user_type: str = "text") -> None:
    await conn.execute(f"CREATE TABLE accounts (user_id {user_type} PRIMARY KEY, "
                       "balance numeric NOT NULL)".encode())


async def _reserve(conn: Conn, user: str, credits: int) -> uuid.UUID:
    return await create_job(conn, user_id=user, credits=float(credits))


async def _settle(conn: Conn, job: uuid.UUID, status: str, charged: int) -> None:
    await conn.execute("UPDATE usage_logs SET status = %s, credits_charged = %s, "
                       "settled_at = now() WHERE job_id = %s", (status, charged, job))


async def _balance(conn: Conn, user: object) -> Decimal:
    row = await (await conn.execute("SELECT balance FROM accounts WHERE user_id = %s",
                                    (user,))).fetchone()
    assert row is not None
    return Decimal(row["balance"])


async def _triggers(conn: Conn) -> list[str]:
    rows = await (await conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'usage_logs'::regclass "
        "AND tgname = 'callwarden_balance'")).fetchall()
    return [str(r["tgname"]) for r in rows]


async def test_a_held_reservation_gives_back_what_was_not_charged_once(conn: Conn) -> None:
    await _accounts(conn)
    await conn.execute("INSERT INTO accounts VALUES ('u-1', 90), ('u-2', 50)")
    await conn.execute("SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')")
    charged, refunded = await _reserve(conn, "u-1", 10), await _reserve(conn, "u-1", 10)
    await _settle(conn, charged, "committed", 4)
    await _settle(conn, refunded, "refunded", 0)
    assert await _balance(conn, "u-1") == 90 + 6 + 10
    # a settled row updated again (a column, not the settlement) changes nothing
    await conn.execute("UPDATE usage_logs SET status = status, settled_at = now() "
                       "WHERE job_id = %s", (charged,))
    assert await _balance(conn, "u-1") == 106
    assert await _balance(conn, "u-2") == 50  # another user's row is not touched


async def test_a_charge_at_settlement_takes_the_charge_and_matches_another_user_type(
        conn: Conn) -> None:
    await _accounts(conn, "uuid")
    user = uuid.uuid4()
    await conn.execute("INSERT INTO accounts VALUES (%s, 100)", (user,))
    await conn.execute(
        "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id', held => false)")
    job = await _reserve(conn, str(user), 10)
    assert await _balance(conn, user) == 100  # nothing is taken at the order
    await _settle(conn, job, "committed", 7)
    assert await _balance(conn, user) == 93


async def test_called_again_it_replaces_the_rule(conn: Conn) -> None:
    await _accounts(conn)
    await conn.execute("INSERT INTO accounts VALUES ('u-1', 100)")
    await conn.execute("SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')")
    await conn.execute(
        "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id', held => false)")
    assert await _triggers(conn) == ["callwarden_balance"]
    job = await _reserve(conn, "u-1", 10)
    await _settle(conn, job, "committed", 3)
    assert await _balance(conn, "u-1") == 97  # the second rule alone, once


async def test_a_user_without_an_account_row_still_settles(conn: Conn) -> None:
    await _accounts(conn)
    await conn.execute("SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')")
    job = await _reserve(conn, "nobody", 5)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    await _settle(conn, job, "refunded", 0)
    row = await (await conn.execute("SELECT status FROM usage_logs WHERE job_id = %s",
                                    (job,))).fetchone()
    assert row is not None
    assert row["status"] == "refunded"
    assert any(f"job {job} reached no balance" in n for n in notices), notices


async def test_an_unknown_column_is_refused_and_nothing_is_created(conn: Conn) -> None:
    await _accounts(conn)
    for args in ("'accounts', 'credits', 'user_id'", "'accounts', 'balance', 'uid'"):
        with pytest.raises(psycopg.errors.UndefinedColumn, match="accounts has no column"):
            await conn.execute(f"SELECT callwarden.follow_balance({args})".encode())
    with pytest.raises(psycopg.errors.UndefinedTable):
        await conn.execute("SELECT callwarden.follow_balance('acounts', 'balance', 'user_id')")
    assert await _triggers(conn) == []


async def test_only_the_owner_of_usage_logs_may_call_it(conn: Conn, db_url: str) -> None:
    await _accounts(conn)
    role = f"cw_other_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN".encode())
    try:
        other = await connect(make_conninfo(db_url, user=role))
        async with other:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await other.execute(
                    "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')")
        await conn.execute(f"GRANT USAGE ON SCHEMA callwarden TO {role}; GRANT EXECUTE ON "
                           "FUNCTION callwarden.follow_balance(regclass, name, name, boolean) "
                           f"TO {role}".encode())
        other = await connect(make_conninfo(db_url, user=role))
        async with other:
            with pytest.raises(psycopg.errors.InsufficientPrivilege,
                               match=r"does not own .*usage_logs"):
                await other.execute(
                    "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')")
        assert await _triggers(conn) == []
    finally:
        await conn.execute(f"DROP OWNED BY {role}".encode())
        await conn.execute(f"DROP ROLE {role}".encode())

