"""What a piece of callwarden sends to Postgres, counted on the client: round trips,
statements by query name, and transactions (autocommit statements + outermost transaction
blocks). Used by ``bench/lifecycle.py``'s table and by the guard test that fails when a
happy call costs more (``tests/integration/test_round_trips.py``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg import AsyncTransaction
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow

from callwarden.database.db import configure
from callwarden.database.queries import QUERIES

__all__ = ["CountingConnection", "configure_counted"]

_NAMES = {sql: name for name, sql in QUERIES.items()}
RV = TypeVar("RV")


class CountingConnection(psycopg.AsyncConnection[DictRow]):
    """Counts, per class: round trips (``wait`` calls that send something: a statement,
    ``BEGIN``, ``COMMIT``), statements (``execute`` calls, by query name) and transactions
    as the client sees them (autocommit statements + outermost transaction blocks)."""

    round_trips: ClassVar[int] = 0
    transactions: ClassVar[int] = 0
    statements: ClassVar[Counter[str]] = Counter()

    async def wait(self, gen: PQGen[RV], interval: float = 0.1,
                   timeout: float | None = None) -> RV:  # noqa: ASYNC109 (psycopg's signature)
        if not self._no_op(gen):
            type(self).round_trips += 1
        return await super().wait(gen, interval, timeout)

    def _no_op(self, gen: PQGen[Any]) -> bool:
        """The pool's commit on returning an idle autocommit connection sends nothing."""
        ending = getattr(gen, "__qualname__", "").endswith(("._commit_gen", "._rollback_gen"))
        return ending and self.info.transaction_status == TransactionStatus.IDLE

    async def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                      binary: bool = False) -> Any:
        type(self).statements[_NAMES.get(str(query), str(query)[:40])] += 1
        self._count_if_idle()  # an autocommit statement is a transaction of its own
        return await super().execute(query, params, prepare=prepare, binary=binary)

    @asynccontextmanager
    async def transaction(self, savepoint_name: str | None = None,
                          force_rollback: bool = False) -> AsyncIterator[AsyncTransaction]:
        self._count_if_idle()  # an outermost transaction block
        async with super().transaction(savepoint_name, force_rollback) as tx:
            yield tx

    def _count_if_idle(self) -> None:
        if self.info.transaction_status == TransactionStatus.IDLE:
            type(self).transactions += 1

    @classmethod
    def reset(cls) -> None:
        cls.round_trips, cls.transactions, cls.statements = 0, 0, Counter()


async def configure_counted(conn: psycopg.AsyncConnection[DictRow]) -> None:
    """The engine's own connection set-up (its timestamp loader), not counted."""
    configure(conn)
