"""ElevenLabs builders and parsers against the reference's payload shapes (no I/O)."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import pytest

from callwarden.providers.base import Endpoint
from callwarden.providers.elevenlabs.client import (
    ElevenLabsDubbingClient,
    ElevenLabsSyncClient,
    elevenlabs_client_for,
)
from callwarden.providers.elevenlabs.operations import (
    build_dubbing_create_request,
    build_dubbing_poll_request,
    build_sync_request,
    media_auth_headers,
    parse_audio,
    parse_dubbing_created,
    parse_dubbing_status,
    parse_forced_alignment,
    parse_stt,
    parse_sync,
    parse_voice_clone,
    parse_voice_design,
)
from callwarden.providers.elevenlabs.wire import FilePart, classify_elevenlabs, encode_multipart
from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    RateLimited,
    TaskNotFound,
    TransientError,
    UnknownProviderKind,
)
from callwarden.providers.outcomes import Failed, Running, Succeeded
from callwarden.providers.raw import RawResponse

BASE = "https://api.elevenlabs.io"


def resp(body: Any, status: int = 200, **headers: str) -> RawResponse:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return RawResponse(status=status, headers={k.replace("_", "-"): v
                                               for k, v in headers.items()}, body=data)


def dub(status: str, **extra: Any) -> dict[str, Any]:
    return {"dubbing_id": "21m00Tcm4TlvDq8ikWAM", "name": "clip", "status": status,
            "source_language": "en", "target_languages": ["es"], "editable": False,
            "created_at": "2025-01-01T00:00:00Z",
            "media_metadata": {"content_type": "video/mp4", "duration": 12.5},
            "error": None, **extra}


# ------------------------------------------------------------------ dubbing

def test_dubbing_create_returns_dubbing_id() -> None:
    raw = resp({"dubbing_id": "21m00Tcm4TlvDq8ikWAM", "expected_duration_sec": 123.4})
    assert parse_dubbing_created(raw) == "21m00Tcm4TlvDq8ikWAM"


@pytest.mark.parametrize("body", [{"expected_duration_sec": 1.0}, {"dubbing_id": ""}, [1]])
def test_dubbing_create_without_id_is_malformed(body: Any) -> None:
    with pytest.raises(MalformedResponse):
        parse_dubbing_created(resp(body))


def test_truncated_json_is_malformed_and_keeps_the_body() -> None:
    with pytest.raises(MalformedResponse, match="dubbing_id"):
        parse_dubbing_created(resp(b'{"dubbing_id": "abc'))


@pytest.mark.parametrize("status", ["queued", "preparing", "dubbing"])
def test_dubbing_in_progress_statuses_are_running(status: str) -> None:
    assert parse_dubbing_status(resp(dub(status)), base_url=BASE) == Running(raw_state=status)


def test_dubbed_gives_one_audio_url_per_target_language() -> None:
    out = parse_dubbing_status(resp(dub("dubbed", target_languages=["es", "fr"])),
                               base_url=BASE + "/")
    assert isinstance(out, Succeeded)
    assert out.media_urls == (f"{BASE}/v1/dubbing/21m00Tcm4TlvDq8ikWAM/audio/es",
                              f"{BASE}/v1/dubbing/21m00Tcm4TlvDq8ikWAM/audio/fr")
    assert out.raw["status"] == "dubbed"


@pytest.mark.parametrize("langs", [[], None, [""], [3]])
def test_dubbed_without_languages_is_malformed_not_success(langs: Any) -> None:
    with pytest.raises(MalformedResponse):
        parse_dubbing_status(resp(dub("dubbed", target_languages=langs)), base_url=BASE)


def test_failed_dub_keeps_the_error() -> None:
    out = parse_dubbing_status(resp(dub("failed", error="no speech found")), base_url=BASE)
    assert out == Failed(error="no speech found", raw=dub("failed", error="no speech found"))


def test_unknown_dubbing_status_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="cloning"):
        parse_dubbing_status(resp(dub("cloning")), base_url=BASE)


def test_dubbing_create_is_multipart_with_auto_source_language() -> None:
    req = build_dubbing_create_request({"file": b"\x00video", "target_lang": "es",
                                        "name": "clip", "watermark": True, "num_speakers": 0})
    form = dict(req.form or ())
    assert (req.method, req.path) == ("POST", "/v1/dubbing")
    assert form["source_lang"] == "auto"
    assert form["file"] == FilePart(data=b"\x00video", filename="file")
    assert (form["watermark"], form["num_speakers"]) == ("true", "0")


def test_dubbing_create_without_source_or_language_is_refused_locally() -> None:
    with pytest.raises(BadRequest, match="source_url"):
        build_dubbing_create_request({"target_lang": "es"})
    with pytest.raises(BadRequest, match="target_lang"):
        build_dubbing_create_request({"source_url": "https://x/v.mp4"})


def test_dubbing_poll_request_path() -> None:
    assert build_dubbing_poll_request("abc").path == "/v1/dubbing/abc"


def test_media_auth_headers_carry_the_key() -> None:
    assert media_auth_headers(Endpoint(base_url=BASE, api_key="k")) == {"xi-api-key": "k"}


# ------------------------------------------------------------------ sync operations

def test_tts_request_puts_voice_in_path_and_format_in_query() -> None:
    req = build_sync_request({"operation": "tts", "voice_id": "JBFqnCBsd6RMkjVDRZzb",
                              "text": "hi", "model_id": "eleven_multilingual_v2"})
    assert req.path == "/v1/text-to-speech/JBFqnCBsd6RMkjVDRZzb"
    assert req.params == {"output_format": "mp3_44100_128"}
    assert req.json_body == {"text": "hi", "model_id": "eleven_multilingual_v2"}


def test_tts_audio_becomes_a_blob_with_character_cost() -> None:
    out = parse_audio(resp(b"ID3\x03audio", content_type="audio/mpeg", character_cost="10"))
    assert out.blobs[0].data == b"ID3\x03audio"
    assert (out.blobs[0].content_type, out.cost) == ("audio/mpeg", 10.0)


def test_audio_response_that_is_json_or_empty_is_malformed() -> None:
    with pytest.raises(MalformedResponse):
        parse_audio(resp({"detail": "x"}, content_type="application/json"))
    with pytest.raises(MalformedResponse):
        parse_audio(resp(b"", content_type="audio/mpeg"))


def test_stt_returns_the_transcript_and_raw_json() -> None:
    body = {"language_code": "eng", "language_probability": 1.0, "text": "Hello.",
            "words": [{"text": "Hello.", "start": 0.0, "end": 0.4, "type": "word",
                       "logprob": 0.0}],
            "transcription_id": "CeeidI2QJ8kkN1mcq8HX", "audio_duration_secs": 0.5}
    out = parse_stt(resp(body))
    assert (out.text, out.raw["transcription_id"]) == ("Hello.", "CeeidI2QJ8kkN1mcq8HX")


def test_stt_webhook_acknowledgement_is_not_a_transcript() -> None:
    with pytest.raises(MalformedResponse, match="text"):
        parse_stt(resp({"message": "ok", "request_id": "r", "transcription_id": "t"}))


def test_stt_with_webhook_is_refused_as_a_sync_call() -> None:
    with pytest.raises(BadRequest, match="webhook"):
        build_sync_request({"operation": "stt", "model_id": "scribe_v1", "file": b"a",
                            "webhook": True})


def test_voice_clone_sends_every_file_and_returns_the_voice_id() -> None:
    req = build_sync_request({"operation": "voice-clone", "name": "Me",
                              "files": [b"a", b"b"], "labels": {"accent": "en"}})
    names = [name for name, _ in req.form or ()]
    assert (req.path, names) == ("/v1/voices/add", ["name", "files", "files", "labels"])
    assert dict(req.form or ())["labels"] == '{"accent":"en"}'
    out = parse_voice_clone(resp({"voice_id": "c38kUX8pkfYO2kHyqfFy",
                                  "requires_verification": False}))
    assert out.raw == {"voice_id": "c38kUX8pkfYO2kHyqfFy", "requires_verification": False}


def test_voice_design_decodes_previews_and_drops_base64_from_raw() -> None:
    audio = base64.b64encode(b"mp3bytes").decode()
    body = {"previews": [{"audio_base_64": audio, "generated_voice_id": "g1",
                          "media_type": "audio/mpeg", "duration_secs": 2.0,
                          "language": "en"}], "text": "sample"}
    out = parse_voice_design(resp(body))
    assert out.blobs[0].data == b"mp3bytes"
    assert out.raw["previews"] == [{"generated_voice_id": "g1", "media_type": "audio/mpeg",
                                    "duration_secs": 2.0, "language": "en"}]


@pytest.mark.parametrize("previews", [[], [{"audio_base_64": "!!!"}], [{"x": 1}], "p"])
def test_voice_design_without_usable_previews_is_malformed(previews: Any) -> None:
    with pytest.raises(MalformedResponse):
        parse_voice_design(resp({"previews": previews, "text": "t"}))


def test_forced_alignment_requires_characters_and_words() -> None:
    body = {"characters": [{"text": "h", "start": 0.0, "end": 0.1}],
            "words": [{"text": "hi", "start": 0.0, "end": 0.2}], "loss": 0.1}
    assert parse_forced_alignment(resp(body)).raw == body
    with pytest.raises(MalformedResponse):
        parse_forced_alignment(resp({"words": []}))


def test_unknown_operation_is_a_bad_request() -> None:
    with pytest.raises(BadRequest):
        build_sync_request({"operation": "dance"})
    with pytest.raises(BadRequest):
        parse_sync("dance", resp({}))


def test_missing_required_field_is_refused_locally() -> None:
    with pytest.raises(BadRequest, match="voice_id"):
        build_sync_request({"operation": "tts", "text": "hi"})


def test_multipart_encoding_is_well_formed() -> None:
    body, ctype = encode_multipart(
        (("text", "hé"), ("file", FilePart(data=b"\x00\x01", filename='a"b.wav',
                                           content_type="audio/wav"))), "BOUND")
    assert ctype == "multipart/form-data; boundary=BOUND"
    assert body == (b'--BOUND\r\nContent-Disposition: form-data; name="text"\r\n\r\n'
                    + "hé".encode() + b"\r\n"
                    b'--BOUND\r\nContent-Disposition: form-data; name="file"; '
                    b'filename="a%22b.wav"\r\nContent-Type: audio/wav\r\n\r\n\x00\x01\r\n'
                    b"--BOUND--\r\n")


# ------------------------------------------------------------------ errors

def detail(code: str, status: int, message: str = "m") -> RawResponse:
    return resp({"detail": {"type": "x", "code": code, "message": message, "status": code,
                            "request_id": "3c80", "param": None}}, status)


@pytest.mark.parametrize(("raw", "cls"), [
    (detail("invalid_api_key", 401), AuthenticationError),
    (detail("quota_exceeded", 401), InsufficientCredits),
    (detail("voice_not_found", 400), BadRequest),
    (detail("dubbing_not_found", 404), TaskNotFound),
    (detail("dubbing_not_ready", 425), TransientError),
    (detail("rate_limit_exceeded", 429), RateLimited),
    (detail("concurrent_limit_exceeded", 429), RateLimited),
    (detail("internal", 500), TransientError),
    (resp(b"<html>bad gateway</html>", 502), TransientError),
])
def test_error_shapes_map_to_typed_errors(raw: RawResponse, cls: type[Exception]) -> None:
    err = classify_elevenlabs(raw)
    assert type(err) is cls


def test_current_error_shape_keeps_message_code_and_request_id() -> None:
    raw = resp({"detail": {"type": "validation_error", "code": "invalid_parameters",
                           "message": "keyterms too long", "status": "invalid_parameters",
                           "request_id": "3c80", "param": "keyterms"}}, 400)
    err = classify_elevenlabs(raw)
    assert isinstance(err, BadRequest)
    assert (err.code, err.status, err.provider) == ("invalid_parameters", 400, "elevenlabs")
    assert "keyterms too long" in err.message
    assert "3c80" in err.message


def test_legacy_error_shape_uses_status_as_code() -> None:
    raw = resp({"detail": {"status": "invalid_api_key", "message": "Invalid API key"}}, 401)
    err = classify_elevenlabs(raw)
    assert isinstance(err, AuthenticationError)
    assert (err.code, err.message) == ("invalid_api_key", "Invalid API key")


def test_fastapi_validation_error_lists_the_fields() -> None:
    raw = resp({"detail": [{"loc": ["body", "text"], "msg": "field required",
                            "type": "value_error.missing"}]}, 422)
    err = classify_elevenlabs(raw)
    assert isinstance(err, BadRequest)
    assert (err.code, err.message) == ("validation_error", "body.text: field required")


def test_rate_limit_honours_retry_after() -> None:
    err = classify_elevenlabs(resp({"detail": {"code": "rate_limit_exceeded",
                                               "message": "slow down"}}, 429, retry_after="3"))
    assert isinstance(err, RateLimited)
    assert err.retry_after == 3.0


def test_success_is_not_an_error() -> None:
    assert classify_elevenlabs(resp(b"audio", 200)) is None


# ------------------------------------------------------------------ client_for

async def test_client_for_dispatches_on_kind_and_operation() -> None:
    ep = Endpoint(base_url=BASE, api_key="k")
    session: Any = object()  # never used: no request is sent
    assert isinstance(elevenlabs_client_for("elevenlabs-async", session, ep),
                      ElevenLabsDubbingClient)
    for kind, op in [("elevenlabs-async", "voice-clone"), ("elevenlabs-sync", "tts"),
                     ("elevenlabs-sync", None)]:
        client = elevenlabs_client_for(kind, session, ep, op)
        assert isinstance(client, ElevenLabsSyncClient)
        assert client.kind == kind
    for kind, op in [("kie-standard", None), ("elevenlabs-sync", "dubbing"),
                     ("elevenlabs-async", "dance")]:
        with pytest.raises(UnknownProviderKind):
            elevenlabs_client_for(kind, session, ep, op)
