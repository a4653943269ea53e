"""The database port: what the actors ask of the database, at the level of meaning.

One protocol, :class:`Database`, for the two adapters that exist: the Postgres one
(:class:`callwarden.database.postgres.PostgresDatabase`, the SQL of ``queries.sql``) and
the deterministic simulation's, which gates every operation on its scheduler
(``tests/simulation/driver.py``). Its contract is ``tests/integration/test_database_port.py``.
An actor takes a pool or any implementation (:func:`callwarden.database.postgres.as_database`)
and calls what its role needs:

* every actor: read a call (:meth:`~Database.load`, its log), append one event fenced on
  what was read (:meth:`~Database.append`; with ``assets`` the finalizer's completion: the
  event, the ``assets`` rows and the sole-cause workflow reopen in one transaction;
  ``before`` is awaited just before the write is sent), read-decide-append
  (:meth:`~Database.transition`), the projection-only heartbeat, and the clock refresh;
* the reconciler: its claim (the stale rule, leases), the candidate read (the row and its
  log in one snapshot), renew, park and release, and the two passes over jobs the host
  ended;
* the webhook receiver: its look-ups by task and by job, delivery dedupe, the ping.

A fence's outcome: a lost race is ``ok=False`` with the winner's
projection; the host's ended status is recorded as ``HostEnded``
(:func:`callwarden.rules.host.host_ended`); a task id another job holds raises
:class:`~callwarden.errors.TaskAlreadyClaimed`; an unknown job raises
:class:`~callwarden.errors.JobNotFound`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import msgspec

from callwarden.database.appending import AppendResult, Decide
from callwarden.errors import ConflictExhausted
from callwarden.events.types import Event, StoredMedia
from callwarden.projections.fold import CallProjection
from callwarden.rules.host import host_ended, job_ended_by_host
from callwarden.rules.stale import StaleRule

__all__ = [
    "AppendOne",
    "AppendResult",
    "Before",
    "ClaimRequest",
    "Clock",
    "Database",
    "Decide",
    "Load",
    "Row",
    "SlowedDown",
    "transition_via",
]

#: The clock an actor reads (``callwarden.database.clock.Clock``: the database's, or a logical one).
Clock = Callable[[], datetime]

#: Awaited once the store is about to send a write (Postgres: with its connection held);
#: the reconciler's ``write`` test signal.
Before = Callable[[], Awaitable[None]]

#: A row as the store returns it (the columns the named SQL query returns).
Row = Mapping[str, Any]


class ClaimRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One reconciler claim (the parameters of ``reconcile_claim``): ``cutoff`` bounds the
    index range every stale open call falls in; ``horizon_extra_s`` = attempt cap x
    re-poll; ``legacy_cutoff`` ``None``: when migration 0002 installed the call columns;
    ``reserved_before``: a call-less row created before it that still holds a ``reserved``
    reservation is swept and refunded like a legacy row (``None``: never)."""

    owner: str
    now: datetime
    lease_until: datetime
    stale: StaleRule
    cutoff: datetime
    horizon_extra_s: float
    legacy_cutoff: datetime | None
    batch_size: int
    reserved_before: datetime | None = None

    def sql_params(self) -> dict[str, Any]:
        return {**self.stale.sql_params(self.now), "cutoff": self.cutoff, "owner": self.owner,
                "lease_until": self.lease_until, "horizon_extra_s": self.horizon_extra_s,
                "legacy_cutoff": self.legacy_cutoff, "batch_size": self.batch_size,
                "reserved_before": self.reserved_before}


class SlowedDown(msgspec.Struct, frozen=True, kw_only=True):
    """An account :meth:`Database.slow_down` paused: for ``paused_s`` more seconds, its
    caps scaled by ``rate_factor``."""

    account: str
    paused_s: float
    rate_factor: float


@runtime_checkable
class Database(Protocol):
    """Everything the actors ask of the database (the module's docstring groups it by actor)."""

    async def load(self, job_id: uuid.UUID) -> CallProjection: ...

    async def load_events(self, job_id: uuid.UUID) -> list[Event]: ...

    async def append(self, job_id: uuid.UUID, current: CallProjection,
                     event: Event | Sequence[Event], *,
                     assets: Sequence[StoredMedia] | None = None,
                     before: Before | None = None) -> AppendResult: ...

    async def transition(self, job_id: uuid.UUID, decide: Decide, *,
                         current: CallProjection | None = None,
                         max_conflicts: int = 8) -> AppendResult: ...

    async def heartbeat(self, job_id: uuid.UUID, owner: str, progress: int | None) -> bool:
        """Whether the call was still one to poll (``created`` or ``polling``): nothing is
        written on a call that ended or whose result is recorded."""
        ...

    async def sync_clock(self, clock: Clock) -> None: ...

    async def slow_down(self, kind: str, retry_after_s: float | None) -> SlowedDown | None:
        """The provider refused a create of ``kind`` with 429: its account pauses starts
        and halves its caps (docs/admission.md); ``None`` when no limit names the kind."""
        ...

    # -- the reconciler ---------------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> list[Row]: ...

    async def candidate_read(self, job_id: uuid.UUID) -> tuple[Row | None, list[Event]]:
        """The row (``load_projection``'s columns) and its log, read in one snapshot."""
        ...

    async def renew(self, job_id: uuid.UUID, owner: str, lease_until: datetime) -> bool: ...

    async def release(self, job_id: uuid.UUID, owner: str) -> None: ...

    async def park(self, job_id: uuid.UUID, owner: str, until: datetime) -> None: ...

    async def ended_outside(self, since: datetime, batch_size: int) -> list[Row]:
        """Jobs the host ended with no call recorded, created since ``since``
        (``reconcile_outside``'s rows)."""
        ...
    async def leftovers(self, before: datetime, batch_size: int) -> list[uuid.UUID]:
        """Calls the host completed before ``before`` and left a reservation of reserved
        (``reconcile_leftovers``)."""
        ...

    # -- the webhook receiver ---------------------------------------------------------

    async def find_job(self, kinds: Sequence[str], task_id: str) -> Row | None: ...

    async def job_by_id(self, job_id: uuid.UUID) -> Row | None: ...

    async def record_delivery(self, provider: str, delivery_id: str,
                              job_id: uuid.UUID) -> bool:
        """``False``: this delivery was recorded already (a duplicate)."""
        ...

    async def forget_delivery(self, provider: str, delivery_id: str) -> None: ...

    async def ping(self) -> None: ...


#: What the read-decide-append loop reads a call with, and appends one event with.
Load = Callable[[uuid.UUID], Awaitable[CallProjection]]
AppendOne = Callable[[uuid.UUID, CallProjection, Event], Awaitable[AppendResult]]


async def transition_via(load: Load, append: AppendOne, job_id: uuid.UUID, decide: Decide, *,
                         max_conflicts: int = 8,
                         current: CallProjection | None = None) -> AppendResult:
    """The one read-decide-append loop (:func:`callwarden.database.write.transition` runs it on a
    connection, every :class:`Database` on its own ``load`` and ``append``): read, decide,
    record the host's decision in its place, re-decide on the winner's projection after a
    lost race."""
    projection = current if current is not None else await load(job_id)
    for _ in range(max_conflicts):
        event = decide(projection)
        if event is None:
            return AppendResult(ok=False, projection=projection)
        if projection.state is None and job_ended_by_host(projection):
            return AppendResult(ok=False, projection=projection, host_ended=True)
        ended = host_ended(projection, at=event.at, actor=event.actor)
        result = await append(job_id, projection, ended or event)
        if result.ok and ended is not None:
            return AppendResult(ok=False, projection=result.projection, event=ended,
                                settlement=result.settlement, host_ended=True)
        if result.ok:
            return result
        projection = result.projection
    raise ConflictExhausted(f"job {job_id}: lost {max_conflicts} races in a row")
