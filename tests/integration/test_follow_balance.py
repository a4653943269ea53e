"""``callwarden.follow_balance`` (migration 0020): a host's balance follows each settlement
with one line of its own migration. Rows are written and settled here by plain SQL, as a
host (or callwarden's write path, whose one settling UPDATE is the same) does; the full
path through a worker, a cancel and the reconciler is test_settlement_hook.py's.

What holds: a settlement reaches the named balance once (held at the order: what was not
charged comes back; charged at settlement: the charge goes; a commit without a charge
charged the reservation), a user column of another type than usage_logs' is matched,
calling it again replaces the rule (one trigger), a user with no account row or one that
cannot be the key's type does not stop the settlement; it is refused, nothing created, for
an unknown column, a balance that would round fractions away, a user column that is not
unique, ``held => NULL``, a trigger of the host's of the same name, a role that does not
own usage_logs (PUBLIC may not call it) or may not update the balance; and the trigger's
function moves no balance from any table but usage_logs, whoever may execute it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from callwarden.database.db import Conn, connect
from callwarden.database.jobs import create_job

# Citus runs no trigger on a distributed table that writes another table (follow_balance
# refuses there: the migration's comment)
pytestmark = pytest.mark.plain_postgres


FOLLOW = "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id')"


async def _accounts(conn: Conn, user_type: str = "text", balance: str = "numeric") -> None:
    await conn.execute(f"CREATE TABLE accounts (user_id {user_type} PRIMARY KEY, "
                       f"balance {balance} NOT NULL)".encode())


@asynccontextmanager
async def _role(conn: Conn, db_url: str, *grants: str) -> AsyncIterator[Conn]:
    """A session as a new login role, after ``grants`` (``{role}`` in them: its name)."""
    role = f"cw_other_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN".encode())
    try:
        for grant in grants:
            await conn.execute(grant.format(role=role).encode())
        other = await connect(make_conninfo(db_url, user=role))
        async with other:
            yield other
    finally:
        await conn.execute(f"DROP OWNED BY {role}".encode())
        await conn.execute(f"DROP ROLE {role}".encode())


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


async def test_a_commit_without_a_charge_charged_the_reservation(conn: Conn) -> None:
    """As the write path reads it (its host_charged): nothing held comes back."""
    await _accounts(conn)
    await conn.execute("INSERT INTO accounts VALUES ('u-1', 90)")
    await conn.execute(FOLLOW)
    job = await _reserve(conn, "u-1", 10)
    await conn.execute("UPDATE usage_logs SET status = 'committed' WHERE job_id = %s", (job,))
    assert await _balance(conn, "u-1") == 90


async def test_a_user_that_cannot_be_the_keys_type_still_settles(conn: Conn) -> None:
    await _accounts(conn, "uuid")
    await conn.execute(FOLLOW)
    job = await _reserve(conn, "anonymous", 5)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    await _settle(conn, job, "refunded", 0)
    assert any(f"job {job} reached no balance (user anonymous cannot be" in n
               for n in notices), notices


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
    async with _role(conn, db_url) as other:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await other.execute(FOLLOW)  # PUBLIC may not call it
    async with _role(conn, db_url, "GRANT USAGE ON SCHEMA callwarden TO {role}",
                     "GRANT EXECUTE ON FUNCTION callwarden.follow_balance(regclass, name, "
                     "name, boolean) TO {role}", "GRANT UPDATE ON accounts TO {role}") as other:
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match=r"does not own .*usage_logs"):
            await other.execute(FOLLOW)
    assert await _triggers(conn) == []


async def test_an_owner_that_may_not_update_the_balance_is_refused(
        conn: Conn, db_url: str) -> None:
    """Else every settlement would fail in its trigger, and no call could end."""
    await _accounts(conn)
    async with _role(conn, db_url, "GRANT USAGE, CREATE ON SCHEMA callwarden TO {role}",
                     "GRANT EXECUTE ON FUNCTION callwarden.follow_balance(regclass, name, "
                     "name, boolean) TO {role}", "ALTER TABLE usage_logs OWNER TO {role}",
                     "GRANT SELECT ON accounts TO {role}") as owner:
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match=r"may not update public\.accounts\.balance: every settlement"):
            await owner.execute(FOLLOW)
        await conn.execute("ALTER TABLE usage_logs OWNER TO CURRENT_USER")
    assert await _triggers(conn) == []


@pytest.mark.parametrize(("table", "call", "error", "said"), [
    ("user_id text PRIMARY KEY, balance integer", FOLLOW, psycopg.errors.DatatypeMismatch,
     "balance is integer: a charge in fractions of a credit would be rounded away"),
    ("user_id text, currency text, balance numeric, PRIMARY KEY (user_id, currency)", FOLLOW,
     psycopg.errors.InvalidColumnReference, "user_id is not unique"),
    ("user_id text PRIMARY KEY, balance numeric",
     "SELECT callwarden.follow_balance('accounts', 'balance', 'user_id', NULL)",
     psycopg.errors.NullValueNotAllowed, "held is true .* or false"),
])
async def test_a_rule_that_would_lose_credits_is_refused(
        conn: Conn, table: str, call: str, error: type[Exception], said: str) -> None:
    await conn.execute(f"CREATE TABLE accounts ({table})".encode())
    with pytest.raises(error, match=said):
        await conn.execute(call.encode())
    assert await _triggers(conn) == []


async def test_a_hosts_own_trigger_of_the_same_name_is_not_replaced(conn: Conn) -> None:
    await _accounts(conn)
    await conn.execute("CREATE FUNCTION mine() RETURNS trigger LANGUAGE plpgsql AS "
                       "'BEGIN RETURN NULL; END'")
    await conn.execute("CREATE TRIGGER callwarden_balance AFTER UPDATE ON usage_logs "
                       "FOR EACH ROW EXECUTE FUNCTION mine()")
    with pytest.raises(psycopg.errors.DuplicateObject, match="trigger callwarden_balance of"):
        await conn.execute(FOLLOW)
    row = await (await conn.execute(
        "SELECT tgfoid::regproc::text AS f FROM pg_trigger WHERE tgname = "
        "'callwarden_balance'")).fetchone()
    assert row is not None
    assert row["f"] == "mine"


async def test_a_role_that_may_execute_the_trigger_function_moves_no_balance(
        conn: Conn, db_url: str) -> None:
    """``grant_runtime`` grants every callwarden function to a runtime role at the next
    migrate: with it, a trigger of the role's own table must not reach the balances."""
    await _accounts(conn)
    await conn.execute("INSERT INTO accounts VALUES ('victim', 0)")
    await conn.execute(FOLLOW)
    async with _role(conn, db_url, "GRANT USAGE ON SCHEMA callwarden TO {role}",
                     "GRANT EXECUTE ON FUNCTION callwarden.balance_follows_settlement() "
                     "TO {role}") as other:
        await other.execute(
            "CREATE TEMP TABLE t (job_id uuid, user_id text, status text, "
            "credits_reserved numeric, credits_charged numeric)")
        await other.execute("CREATE TRIGGER callwarden_balance AFTER UPDATE ON t FOR EACH ROW "
                            "EXECUTE FUNCTION callwarden.balance_follows_settlement()")
        await other.execute("INSERT INTO t VALUES (gen_random_uuid(), 'victim', 'reserved', "
                            "1000000, 0)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match="runs only as the trigger callwarden_balance on usage_logs"):
            await other.execute("UPDATE t SET status = 'refunded'")
    assert await _balance(conn, "victim") == 0


async def test_called_again_it_takes_back_every_grant_of_the_trigger_function(
        conn: Conn, db_url: str) -> None:
    await _accounts(conn)
    await conn.execute(FOLLOW)
    async with _role(conn, db_url, "GRANT EXECUTE ON FUNCTION "
                     "callwarden.balance_follows_settlement() TO {role}") as other:
        who = await (await other.execute("SELECT current_user AS r")).fetchone()
        assert who is not None
        await conn.execute(FOLLOW)
        row = await (await conn.execute(
            "SELECT has_function_privilege(%s, 'callwarden.balance_follows_settlement()', "
            "'EXECUTE') AS may", (who["r"],))).fetchone()
        assert row is not None
        assert row["may"] is False
