"""A job that holds a reservation and never got a call (its queue message was lost, its
worker died before the call started) is not reserved forever (issue 25 item 5): once it is
``reserved_without_call_s`` old (24 h by default), the reconciler sweeps it and refunds the
reservation exactly once. Rows by SQL, as the host writes them; everything else the host
owns is left alone: a call-less job without a reservation (a pipeline wrapper), a younger
one, one the host ended, and every one of them when the setting is off."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.replay.verify import verify_job
from tests.integration.conftest import MakeReconciler
from tests.support.queues import value

#: Every row here was made after callwarden was installed: none is a legacy row (by
#: default the cutoff is when migration 0002 ran, which the test database's template
#: ran minutes ago, so a row created "25 hours ago" would count as legacy).
BEFORE = datetime(2020, 1, 1, tzinfo=UTC)


async def job(conn: Conn, age: str, *, status: str = "pending",
              reserved: bool = True) -> uuid.UUID:
    """A host job with no call, created ``age`` ago (and its reservation)."""
    jid = uuid.uuid4()
    await conn.execute("INSERT INTO jobs (id, user_id, status, created_at) "
                       "VALUES (%s, 'u-1', %s, now() - %s::interval)", (jid, status, age))
    if reserved:
        await conn.execute("INSERT INTO usage_logs (job_id, user_id, status, credits_reserved)"
                           " VALUES (%s, 'u-1', 'reserved', 7)", (jid,))
    return jid


async def seen(conn: Conn, jid: uuid.UUID) -> tuple[str, list[str] | None, list[str] | None]:
    status = await value(conn, "SELECT status FROM jobs WHERE id = %s", jid)
    credits = await value(conn, "SELECT array_agg(status) FROM usage_logs WHERE job_id = %s",
                          jid)
    types = await value(conn, "SELECT array_agg(type ORDER BY seq) FROM callwarden.call_events "
                              "WHERE job_id = %s", jid)
    return status, credits, types


async def test_a_reservation_without_a_call_ends_refunded_after_the_set_time(
        conn: Conn, make_reconciler: MakeReconciler) -> None:
    lost = await job(conn, "25 hours")
    taken = await job(conn, "30 hours", status="processing")  # its worker died pre-call
    wrapper = await job(conn, "30 hours", reserved=False)
    young = await job(conn, "23 hours")
    ended = await job(conn, "30 hours", status="completed")
    reconciler = make_reconciler(legacy_cutoff=BEFORE)
    counts = await reconciler.reconcile_once(utcnow())
    assert counts.swept == 2
    for jid in (lost, taken):
        status, credits, types = await seen(conn, jid)
        assert status == "failed"
        assert credits == ["refunded"]
        assert types == ["Adopted", "Swept"]
        # one transaction: never a moment with an adopted, open call and no task, which a
        # worker under ambiguous_create="recreate" would create upstream again
        assert await value(conn, "SELECT count(DISTINCT xmin::text) FROM callwarden.call_events "
                                 "WHERE job_id = %s", jid) == 1
        assert await verify_job(conn, jid) == []
    assert await seen(conn, wrapper) == ("pending", None, None)
    assert await seen(conn, young) == ("pending", ["reserved"], None)
    # the host ended it: recorded (HostEnded), the reservation the host's to commit until
    # the policy's grace (test_ended_outside.py), never swept
    assert await seen(conn, ended) == ("completed", ["reserved"], ["HostEnded"])
    again = await reconciler.reconcile_once(utcnow())
    assert again.swept == 0  # refunded once
    assert (await seen(conn, lost))[1] == ["refunded"]


@pytest.mark.parametrize("off", [None, 0])
async def test_the_time_is_a_setting_and_zero_turns_it_off(
        conn: Conn, make_reconciler: MakeReconciler, off: float | None) -> None:
    lost = await job(conn, "3 hours")
    never = make_reconciler(legacy_cutoff=BEFORE, reserved_without_call_s=off)
    assert (await never.reconcile_once(utcnow())).swept == 0
    assert await seen(conn, lost) == ("pending", ["reserved"], None)
    two_hours = make_reconciler(legacy_cutoff=BEFORE, reserved_without_call_s=7200)
    assert (await two_hours.reconcile_once(utcnow())).swept == 1
    assert (await seen(conn, lost))[1] == ["refunded"]
