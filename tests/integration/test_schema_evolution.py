"""Schema evolution on a real log: old payload versions stored in ``call_events`` are
upcast in one place on decode, so replay and verify fold them to the same state as current
ones; an event that cannot be decoded stops verify for its job only."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import load_events
from callwarden.events import codec
from callwarden.events.codec import encode
from callwarden.events.types import VERSIONS, Event, UpstreamFailed
from callwarden.projections.fold import fold
from callwarden.replay.audit import audit_job
from callwarden.replay.rebuild import rebuild
from callwarden.replay.verify import verify
from tests.support.audit import new_job
from tests.support.paths import completed_path, failed_path

COPY_PROJECTION = """
UPDATE jobs o SET (call_state, call_version, status, provider_kind, provider_call_started_at,
                   call_sync, reconcile_attempts, reconcile_last_error, reconcile_next_at,
                   error_message, finalize_owner, finalize_lease_until, upstream_result,
                   output_data, provider_cost, call_finished_at, call_settlement)
    = (SELECT call_state, call_version, status, provider_kind, provider_call_started_at,
              call_sync, reconcile_attempts, reconcile_last_error, reconcile_next_at,
              error_message, finalize_owner, finalize_lease_until, upstream_result,
              output_data, provider_cost, call_finished_at, call_settlement
       FROM jobs c WHERE c.id = %s)
WHERE o.id = %s
"""


def _rename_result_to_outcome(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    data["outcome"] = data.pop("result")
    return data


def _split_code(data: dict[str, Any]) -> dict[str, Any]:
    """v1 UpstreamFailed kept the code inside the message: ``"E400: content policy"``."""
    code, _, message = data["error"].partition(": ")
    return {**data, "error": message, "code": code}


@pytest.fixture
def v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend ReconcileAttempted and UpstreamFailed are at version 2, with upcasters."""
    monkeypatch.setitem(VERSIONS, "ReconcileAttempted", 2)
    monkeypatch.setitem(VERSIONS, "UpstreamFailed", 2)
    monkeypatch.setattr(codec, "_UPCASTERS", {})
    codec.register_upcaster("ReconcileAttempted", 1, _rename_result_to_outcome)
    codec.register_upcaster("UpstreamFailed", 1, _split_code)


def _as_v1(e: Event) -> tuple[str, int, bytes]:
    name, version, payload = encode(e)
    data = msgspec.json.decode(payload)
    if name == "ReconcileAttempted":
        data["result"] = data.pop("outcome")
    elif isinstance(e, UpstreamFailed):
        data["error"] = f"{e.code}: {e.error}"
        data.pop("code")
    else:
        return name, version, payload
    return name, 1, msgspec.json.encode(data)


async def _insert_raw(conn: Conn, job: uuid.UUID, rows: list[tuple[str, int, bytes]]) -> None:
    for seq, (name, version, payload) in enumerate(rows, start=1):
        await conn.execute(
            "INSERT INTO callwarden.call_events (job_id, seq, type, version, payload, actor) "
            "VALUES (%s, %s, %s, %s, %s::jsonb, 'test')",
            (job, seq, name, version, payload.decode()))


async def _old_twin(conn: Conn, current: uuid.UUID, events: list[Event]) -> uuid.UUID:
    """A job whose log is ``events`` stored at version 1, with the projection (and
    reservation) the write path gave ``current``."""
    old = await create_job(conn)
    await _insert_raw(conn, old, [_as_v1(e) for e in events])
    await conn.execute(COPY_PROJECTION, (current, old))
    await conn.execute(
        "UPDATE usage_logs o SET status = c.status FROM usage_logs c "
        "WHERE c.job_id = %s AND o.job_id = %s", (current, old))
    return old


@pytest.mark.usefixtures("v2")
async def test_old_versions_replay_to_the_same_state_as_current_ones(conn: Conn) -> None:
    events = failed_path(task="")[:1] + failed_path()[2:]  # no task id: no unique clash
    current = await new_job(conn, events)
    old = await _old_twin(conn, current, events)
    stored = await (await conn.execute(
        "SELECT array_agg(version ORDER BY seq) AS v FROM callwarden.call_events WHERE job_id = %s",
        (old,))).fetchone()
    assert stored is not None
    assert stored["v"] == [1, 1, 1]
    old_events = await load_events(conn, old)
    assert old_events == await load_events(conn, current)
    assert fold(old_events) == fold(events)


@pytest.mark.usefixtures("v2")
async def test_verify_and_rebuild_accept_old_versions(conn: Conn) -> None:
    events = failed_path(task="")[:1] + failed_path()[2:]
    current = await new_job(conn, events)
    await _old_twin(conn, current, events)
    summary, _ = await verify(conn)
    assert (summary.jobs, summary.ok) == (2, True)
    report = await rebuild(conn)
    assert (report.unchanged, report.rebuilt, report.failed) == (2, 0, 0)


@pytest.mark.usefixtures("v2")
async def test_an_old_payload_that_parses_as_current_is_still_upcast(conn: Conn) -> None:
    """v1 ``UpstreamFailed`` is also a valid v2 payload; only its version says that the
    message still carries the code. Verify must upcast it, not trust the shape."""
    events = failed_path(task="")[:1] + failed_path()[3:]
    current = await new_job(conn, events)
    old = await _old_twin(conn, current, events)
    summary, batches = await verify(conn)
    assert [m for b in batches for m in b.mismatches] == []
    assert summary.ok
    report = await audit_job(conn, old)
    assert report.timeline[-1].error == "content policy"


BAD_ROWS = {
    "unknown type": ("Teleported", 1, b'{"type": "Teleported", "at": "2026-01-01T00:00:00Z"}',
                     "unknown event type 'Teleported'"),
    "invalid payload": ("TaskCreated", 1, b'{"type": "TaskCreated", "actor": "w"}',
                        "invalid TaskCreated payload"),
    "future version": ("TaskCreated", 7, b'{"type": "TaskCreated"}',
                       "TaskCreated has no version 7"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
async def test_an_undecodable_event_stops_verify_for_its_job_only(conn: Conn,
                                                                  case: str) -> None:
    name, version, payload, reason = BAD_ROWS[case]
    good = [await new_job(conn, completed_path(task=f"g{i}")) for i in range(3)]
    bad = await create_job(conn)
    first = encode(completed_path(task="b")[0])
    await _insert_raw(conn, bad, [first, (name, version, payload)])
    summary, batches = await verify(conn, batch=2)
    (error,) = [e for b in batches for e in b.errors]
    assert (error.job_id, error.seq) == (str(bad), 2)
    assert reason in error.reason
    assert (summary.jobs, summary.errors, summary.mismatches) == (len(good) + 1, 1, 0)
