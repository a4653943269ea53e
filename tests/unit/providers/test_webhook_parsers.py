"""The webhook parsers and verifiers, through each provider's ``SCHEME`` (what the
receiver calls): recorded delivery shapes are read as the provider meant them, a good
signature gives the scheme's replay key, every bad one (tampered body, wrong secret,
missing or malformed header, stale or future timestamp) is a ``SignatureError``
(``StaleSignature`` for time), and every malformed body is a ``MalformedDelivery``.
(Signature algorithms against published vectors: test_signature_vectors.py; any body
whatsoever answered typed: test_parsers_total.py.) Pure: no I/O, no clock."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from callwarden.providers.elevenlabs.webhook import SCHEME as ELEVENLABS
from callwarden.providers.elevenlabs.webhook import elevenlabs_sign
from callwarden.providers.errors import SignatureError, StaleSignature
from callwarden.providers.kie.webhook import SCHEME as KIE
from callwarden.providers.kie.webhook import kie_sign
from callwarden.providers.outcomes import Failed, Running, Succeeded
from callwarden.providers.replicate.webhook import SCHEME as REPLICATE
from callwarden.providers.replicate.webhook import replicate_sign
from callwarden.providers.webhooks import MalformedDelivery, check_timestamp
from tests.recorded import all_fixtures, load

SVIX_TEST_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # public (Svix's SDK tests)
NOW = 1_735_689_602.0


def encoded(body: Any) -> bytes:
    return msgspec.json.encode(body)


# -- recorded shapes ----------------------------------------------------------------------------

KIE_CALLBACKS = [f for f in all_fixtures("kie") if f.name.startswith("callback_")]


@pytest.mark.parametrize("fixture", KIE_CALLBACKS, ids=[f.name for f in KIE_CALLBACKS])
def test_a_recorded_kie_callback_names_its_task_and_is_never_read_as_an_outcome(
        fixture: Any) -> None:
    body = fixture.body_bytes()
    data = fixture.body["data"]
    assert KIE.task_id(body) == (data.get("taskId") or data.get("task_id"))
    with pytest.raises(MalformedDelivery):
        KIE.parse(body)  # a signal: the receiver polls the task instead


def test_the_recorded_replicate_delivery_verifies_and_reads_as_a_success() -> None:
    """The fixture's headers were signed with Svix's public test secret over the body as
    ``json.dumps(..., separators=(',', ':'), ensure_ascii=False)``."""
    fixture = load("replicate", "webhook_completed")
    body = json.dumps(fixture.body, separators=(",", ":"), ensure_ascii=False).encode()
    now = float(fixture.headers["webhook-timestamp"])
    key = REPLICATE.verify(SVIX_TEST_SECRET, None, fixture.headers, body, now=now)
    assert key == "id:" + fixture.headers["webhook-id"]
    parsed = REPLICATE.parse(body)
    assert parsed is not None
    assert parsed.task_id == fixture.body["id"] == REPLICATE.task_id(body)
    assert isinstance(parsed.outcome, Succeeded)
    assert parsed.outcome.media_urls == tuple(fixture.body["output"])
    assert not parsed.intermediate


def test_the_recorded_replicate_start_event_is_intermediate() -> None:
    parsed = REPLICATE.parse(load("replicate", "webhook_start").body_bytes())
    assert parsed is not None
    assert parsed.intermediate
    assert isinstance(parsed.outcome, Running)


@pytest.mark.parametrize(("change", "outcome", "code"), [
    ({"status": "failed", "error": "CUDA OOM", "output": None}, Failed, None),
    ({"data_removed": True}, Failed, "result_gone"),
    ({"status": "canceled", "output": None}, Failed, None),
])
def test_replicate_terminal_failures_read_as_failed(change: dict[str, Any],
                                                     outcome: type, code: str | None) -> None:
    body = {**load("replicate", "webhook_completed").body, **change}
    parsed = REPLICATE.parse(encoded(body))
    assert parsed is not None
    assert isinstance(parsed.outcome, outcome)
    if code is not None:
        assert isinstance(parsed.outcome, Failed)
        assert parsed.outcome.code == code


def test_the_recorded_elevenlabs_transcription_reads_as_its_text() -> None:
    fixture = load("elevenlabs", "webhook_speech_to_text")
    parsed = ELEVENLABS.parse(fixture.body_bytes())
    assert parsed is not None
    assert parsed.task_id == fixture.body["data"]["request_id"]
    assert isinstance(parsed.outcome, Succeeded)
    assert parsed.outcome.text == fixture.body["data"]["transcription"]["text"]


def test_an_elevenlabs_transcription_error_reads_as_failed() -> None:
    body = load("elevenlabs", "webhook_speech_to_text").body
    body["data"] = {"request_id": "req-1", "error": "audio unreadable"}
    parsed = ELEVENLABS.parse(encoded(body))
    assert parsed is not None
    assert parsed.outcome == Failed(error="audio unreadable", raw=body["data"])


def test_an_elevenlabs_event_about_no_call_is_none_and_names_no_task() -> None:
    body = encoded({"type": "voice_removal_notice", "data": {"voice_id": "v"}})
    assert ELEVENLABS.parse(body) is None
    with pytest.raises(MalformedDelivery):
        ELEVENLABS.task_id(body)


# -- signatures: good and bad -------------------------------------------------------------------

BODY = b'{"id": "p1", "status": "succeeded", "output": ["https://replicate.delivery/x.png"]}'


def replicate_headers(secret: str = SVIX_TEST_SECRET, body: bytes = BODY,
                      ts: float = NOW, msg_id: str = "msg_1") -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(ts)),
            "webhook-signature": replicate_sign(secret, msg_id, int(ts), body)}


def test_replicate_good_signature_gives_the_webhook_id_as_replay_key() -> None:
    assert REPLICATE.verify(SVIX_TEST_SECRET, None, replicate_headers(), BODY,
                            now=NOW) == "id:msg_1"
    # Header names are case-insensitive; one good v1 entry among others is enough.
    mixed = {k.title(): v for k, v in replicate_headers().items()}
    mixed["Webhook-Signature"] = "v2,abc v1,AAAA " + mixed["Webhook-Signature"]
    assert REPLICATE.verify(SVIX_TEST_SECRET, None, mixed, BODY, now=NOW) == "id:msg_1"


@pytest.mark.parametrize(("headers", "body", "secret"), [
    (replicate_headers(), BODY + b" ", SVIX_TEST_SECRET),                 # tampered body
    (replicate_headers(), BODY, "whsec_" + "A" * 32),                     # wrong secret
    ({**replicate_headers(), "webhook-id": "msg_2"}, BODY, SVIX_TEST_SECRET),  # other id
    ({"webhook-timestamp": str(int(NOW))}, BODY, SVIX_TEST_SECRET),       # no id/signature
    ({**replicate_headers(), "webhook-timestamp": "soon"}, BODY, SVIX_TEST_SECRET),
    ({**replicate_headers(), "webhook-signature": "v2,whatever"}, BODY, SVIX_TEST_SECRET),
    (replicate_headers(), BODY, "whsec_not*base64"),                      # malformed secret
], ids=["tampered", "wrong_secret", "other_id", "missing", "bad_ts", "no_v1",
        "bad_secret"])
def test_replicate_bad_signatures_are_refused(headers: dict[str, str], body: bytes,
                                              secret: str) -> None:
    with pytest.raises(SignatureError):
        REPLICATE.verify(secret, None, headers, body, now=NOW)


def verify_signed_at(scheme: str, ts: int) -> str:
    """Verify a delivery of ``scheme`` correctly signed at ``ts``, checked at ``NOW``."""
    if scheme == "replicate":
        return REPLICATE.verify(SVIX_TEST_SECRET, None, replicate_headers(ts=ts), BODY,
                                now=NOW)
    if scheme == "kie":
        return KIE.verify("key", "t1", kie_headers(ts=ts), b"{}", now=NOW)
    return ELEVENLABS.verify("sek", None, {
        "ElevenLabs-Signature": elevenlabs_sign("sek", ts, BODY)}, BODY, now=NOW)


TOLERANCE = {"replicate": REPLICATE.tolerance_s, "kie": KIE.tolerance_s,
             "elevenlabs": ELEVENLABS.tolerance_s}


@pytest.mark.parametrize("scheme", sorted(TOLERANCE))
def test_a_timestamp_past_the_tolerance_either_way_is_stale(scheme: str) -> None:
    tolerance = int(TOLERANCE[scheme])
    assert verify_signed_at(scheme, int(NOW) - tolerance)  # at the edge: accepted
    for ts in (int(NOW) - tolerance - 1, int(NOW) + tolerance + 1):
        with pytest.raises(StaleSignature):
            verify_signed_at(scheme, ts)


def test_check_timestamp_accepts_exactly_the_tolerance() -> None:
    assert check_timestamp(str(int(NOW) - 300), NOW, 300.0) == int(NOW) - 300
    with pytest.raises(StaleSignature):
        check_timestamp(str(int(NOW) - 301), NOW, 300.0)
    for raw in (None, "", "1.5e9", "abc"):
        with pytest.raises(SignatureError):
            check_timestamp(raw, NOW, 300.0)


def kie_headers(key: str = "key", task: str = "t1", ts: float = NOW) -> dict[str, str]:
    return {"X-Webhook-Timestamp": str(int(ts)), "X-Webhook-Signature": kie_sign(
        key, task, int(ts))}


def test_kie_good_signature_covers_the_task_id_and_is_the_replay_key() -> None:
    headers = kie_headers()
    assert KIE.verify("key", "t1", headers, b"anything", now=NOW) == (
        "sig:" + headers["X-Webhook-Signature"])


@pytest.mark.parametrize(("key", "task", "headers"), [
    ("key", "t2", kie_headers(task="t1")),                        # signed for another task
    ("other", "t1", kie_headers()),                                # wrong key
    ("key", "t1", {"X-Webhook-Timestamp": str(int(NOW))}),        # no signature
    ("key", "t1", {"X-Webhook-Signature": kie_sign("key", "t1", int(NOW))}),  # no timestamp
    ("key", "t1", {**kie_headers(), "X-Webhook-Timestamp": str(int(NOW) + 1)}),
], ids=["other_task", "wrong_key", "no_signature", "no_timestamp", "other_timestamp"])
def test_kie_bad_signatures_are_refused(key: str, task: str, headers: dict[str, str]) -> None:
    with pytest.raises(SignatureError):
        KIE.verify(key, task, headers, b"{}", now=NOW)


def test_elevenlabs_good_signature_and_its_replay_key_ignore_extra_parts() -> None:
    header = elevenlabs_sign("sek", int(NOW), BODY)
    key = ELEVENLABS.verify("sek", None, {"ElevenLabs-Signature": header}, BODY, now=NOW)
    assert key == f"sig:{int(NOW)}.{header.split('v0=')[1]}"
    for variant in (header + ",x=1", f"x=2, {header}"):
        assert ELEVENLABS.verify("sek", None, {"elevenlabs-signature": variant}, BODY,
                                 now=NOW) == key


@pytest.mark.parametrize("header", [
    None, "", "t=1735689602", "v0=abc", elevenlabs_sign("other", int(NOW), BODY),
    elevenlabs_sign("sek", int(NOW), BODY + b"!"), "t=soon,v0=abc",
], ids=["absent", "empty", "no_v0", "no_t", "wrong_secret", "tampered", "bad_ts"])
def test_elevenlabs_bad_signatures_are_refused(header: str | None) -> None:
    headers = {} if header is None else {"ElevenLabs-Signature": header}
    with pytest.raises(SignatureError):
        ELEVENLABS.verify("sek", None, headers, BODY, now=NOW)


# -- malformed bodies -------------------------------------------------------------------------

NOT_AN_OBJECT = [b"", b"not json", b"[1, 2]", b'"text"', b"null", b"{" * 10 + b"}" * 10,
                 b"[" * 100 + b"]" * 100]


@pytest.mark.parametrize("body", NOT_AN_OBJECT)
@pytest.mark.parametrize("scheme", ["replicate", "kie", "elevenlabs"])
def test_a_body_that_is_not_a_json_object_is_malformed(scheme: str, body: bytes) -> None:
    readers: dict[str, Callable[[bytes], object]] = {
        "replicate": REPLICATE.parse, "kie": KIE.task_id, "elevenlabs": ELEVENLABS.parse}
    read = readers[scheme]
    with pytest.raises(MalformedDelivery):
        read(body)


@pytest.mark.parametrize("body", [
    {"code": 200, "msg": "ok"},                              # no data
    {"code": 200, "data": []},                               # data not an object
    {"code": "200", "data": {"taskId": "t"}},                # code not a number
    {"code": True, "data": {"taskId": "t"}},                 # a bool is not a code
    {"code": 200, "data": {"taskId": ""}},                   # empty task id
    {"code": 200, "data": {"taskId": 12}},                   # task id not text
    {"code": 200, "data": {"state": "success"}},             # no task id at all
    {"msg": "ok", "data": {"taskId": "t"}},                  # no code
])
def test_kie_callbacks_without_a_task_in_an_envelope_are_malformed(
        body: dict[str, Any]) -> None:
    with pytest.raises(MalformedDelivery):
        KIE.task_id(encoded(body))


@pytest.mark.parametrize("change", [
    {"id": None}, {"id": ""}, {"id": 7}, {"status": "exploded"}, {"status": None},
])
def test_replicate_deliveries_without_an_id_or_a_known_status_are_malformed(
        change: dict[str, Any]) -> None:
    body = {**load("replicate", "webhook_completed").body, **change}
    with pytest.raises(MalformedDelivery):
        REPLICATE.parse(encoded(body))
    with pytest.raises(MalformedDelivery):
        REPLICATE.task_id(encoded(body))


@pytest.mark.parametrize("body", [
    {"data": {}},                                                         # no type
    {"type": "speech_to_text_transcription"},                             # no data
    {"type": "speech_to_text_transcription", "data": []},
    {"type": "speech_to_text_transcription", "data": {"transcription": {"text": "hi"}}},
    {"type": "speech_to_text_transcription", "data": {"request_id": "r"}},  # no text
    {"type": "speech_to_text_transcription",
     "data": {"request_id": "r", "transcription": {"text": 5}}},
])
def test_elevenlabs_deliveries_missing_their_parts_are_malformed(body: dict[str, Any]) -> None:
    with pytest.raises(MalformedDelivery):
        ELEVENLABS.parse(encoded(body))
