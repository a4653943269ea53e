"""Event codec: round trips, typed errors naming job and seq, upcasting old versions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from callwarden.events import codec
from callwarden.events.codec import EventDecodeError, UnknownEventType, decode, encode
from callwarden.events.types import (
    EVENT_TYPES,
    VERSIONS,
    Completed,
    Event,
    ReconcileAttempted,
    StoredMedia,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)

T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_round_trip_keeps_every_field() -> None:
    events: list[Event] = [
        TaskCreated(at=T, actor="worker:1", task_id="abc"),
        UpstreamSucceeded(at=T, actor="reconciler:2", result=UpstreamResult(
            media_urls=("http://a/1.png", "http://a/2.png"), cost=1.5, raw={"k": [1]})),
        Completed(at=T, actor="w", cost=2.0, media=(
            StoredMedia(key="media/j/0.png", url="file:///x", content_type="image/png",
                        size=3),)),
    ]
    for e in events:
        name, version, payload = encode(e)
        assert (name, version) == (type(e).__name__, VERSIONS[name])
        assert decode(name, version, payload) == e


def test_unknown_type_names_job_and_seq() -> None:
    with pytest.raises(UnknownEventType, match="job J seq 7"):
        decode("Teleported", 1, b"{}", job_id="J", seq=7)


@pytest.mark.parametrize("payload", [
    b'{"type":"TaskCreated","at":"2026-01-01T00:00:00Z","actor":"w"}',  # missing task_id
    b'{"type":"TaskCreated","at":"yesterday","actor":"w","task_id":"a"}',
    b'{"type":"TaskCreated","at":"2026-01-01T00:00:00Z","actor":"w","task_id":',
    b"not json",
])
def test_invalid_payload_is_a_typed_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError, match="job 9 seq 3"):
        decode("TaskCreated", 1, payload, job_id=9, seq=3)


def test_type_column_must_agree_with_payload_tag() -> None:
    _, _, payload = encode(TaskCreated(at=T, actor="w", task_id="a"))
    with pytest.raises(EventDecodeError, match="disagrees"):
        decode("Completed", 1, payload, job_id=1, seq=1)


def test_future_version_is_refused() -> None:
    _, _, payload = encode(TaskCreated(at=T, actor="w", task_id="a"))
    with pytest.raises(EventDecodeError, match="no version 99"):
        decode("TaskCreated", 99, payload)


def test_old_versions_are_upcast_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 ReconcileAttempted stored ``result`` (later renamed ``outcome``); pretend the
    current version is 2 and register the upcaster that renames it."""
    monkeypatch.setitem(VERSIONS, "ReconcileAttempted", 2)
    monkeypatch.setattr(codec, "_UPCASTERS", {})

    def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
        data = dict(data)
        data["outcome"] = data.pop("result")
        return data

    codec.register_upcaster("ReconcileAttempted", 1, v1_to_v2)
    old = msgspec.json.encode({"type": "ReconcileAttempted", "at": T.isoformat(),
                               "actor": "r", "result": "still_running"})
    assert decode("ReconcileAttempted", 1, old, job_id=1, seq=2) == ReconcileAttempted(
        at=T, actor="r", outcome="still_running")


def test_missing_upcaster_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(VERSIONS, "TaskCreated", 2)
    monkeypatch.setattr(codec, "_UPCASTERS", {})
    with pytest.raises(EventDecodeError, match="no upcaster"):
        decode("TaskCreated", 1, b'{"type":"TaskCreated"}', job_id=1, seq=1)


def test_every_event_type_has_a_version() -> None:
    assert set(VERSIONS) == set(EVENT_TYPES)
    assert all(v >= 1 for v in VERSIONS.values())
