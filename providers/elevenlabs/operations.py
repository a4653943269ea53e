"""ElevenLabs operations, pure: dubbing (``elevenlabs-async``) and the one-round-trip operations
(``elevenlabs-sync``, and the sync operations filed under ``elevenlabs-async``).

Sans-I/O: ``build_*_request`` turn a job's request mapping into a :class:`Request`,
``parse_*`` turn a :class:`~callwarden.providers.raw.RawResponse` into an outcome (or raise a
typed :mod:`callwarden.providers.errors` error keeping ElevenLabs' message and code), and
:func:`classify_elevenlabs` decides errors for the transport. The clients
(:mod:`callwarden.providers.elevenlabs.client`) only glue them to
:func:`callwarden.providers.transport.send`.

Request mappings (our shape; every other key is passed through to ElevenLabs):

- dubbing: ``file`` (bytes or :class:`FilePart`) or ``source_url``; ``target_lang``;
  ``source_lang`` (default ``"auto"``); ``name``, ``num_speakers``, ``watermark``...
- ``operation`` selects a sync call: ``tts`` (``voice_id``, ``text``, ``output_format``),
  ``sfx`` (``text``), ``stt`` (``model_id``, ``file``), ``voice-clone`` (``name``,
  ``files``), ``voice-design`` (``voice_description``), ``forced-alignment`` (``file``,
  ``text``).

A dubbing result URL (``/v1/dubbing/{id}/audio/{lang}``) is only served with the API key:
outcomes never carry secrets, so the media downloader must add
:func:`media_auth_headers` when it fetches an ElevenLabs URL.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from callwarden.providers.base import Endpoint
from callwarden.providers.elevenlabs.wire import (
    PROVIDER,
    Request,
    bad_request,
    form_fields,
    json_object,
    require,
)
from callwarden.providers.errors import MalformedResponse
from callwarden.providers.outcomes import (
    Blob,
    Failed,
    PollOutcome,
    Running,
    Succeeded,
    Usage,
    reported_cost,
)
from callwarden.providers.raw import RawResponse

__all__ = ["FILE_OPERATIONS", "SYNC_OPERATIONS", "build_dubbing_create_request",
           "build_dubbing_poll_request", "build_sync_request", "media_auth_headers",
           "parse_audio", "parse_dubbing_created", "parse_dubbing_status",
           "parse_forced_alignment", "parse_stt", "parse_sync", "parse_voice_clone",
           "parse_voice_design"]


RUNNING_STATUSES = frozenset({"queued", "preparing", "dubbing"})

DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"

def build_dubbing_create_request(request: Mapping[str, Any]) -> Request:
    """``POST /v1/dubbing`` (multipart) from a dubbing request mapping."""
    require(request, "target_lang")
    if request.get("file") is None and not request.get("source_url"):
        raise bad_request("dubbing needs 'file' or 'source_url'")
    fields = {"source_lang": "auto", **request}
    return Request(method="POST", path="/v1/dubbing",
                   form=form_fields(fields, skip=("operation",)))

def build_dubbing_poll_request(dubbing_id: str) -> Request:
    """``GET /v1/dubbing/{dubbing_id}``."""
    if not dubbing_id:
        raise bad_request("empty dubbing id")
    return Request(method="GET", path=f"/v1/dubbing/{dubbing_id}")

def _build_tts(request: Mapping[str, Any]) -> Request:
    voice_id = require(request, "voice_id")
    require(request, "text")
    body = {k: v for k, v in request.items()
            if k not in ("operation", "voice_id", "output_format")}
    fmt = str(request.get("output_format") or DEFAULT_OUTPUT_FORMAT)
    return Request(method="POST", path=f"/v1/text-to-speech/{voice_id}",
                   params={"output_format": fmt}, json_body=body)

def _json_call(path: str, required: str) -> Callable[[Mapping[str, Any]], Request]:
    def build(request: Mapping[str, Any]) -> Request:
        require(request, required)
        body = {k: v for k, v in request.items() if k != "operation"}
        return Request(method="POST", path=path, json_body=body)
    return build

def _form_call(path: str, *required: str) -> Callable[[Mapping[str, Any]], Request]:
    def build(request: Mapping[str, Any]) -> Request:
        for key in required:
            require(request, key)
        return Request(method="POST", path=path,
                       form=form_fields(request, skip=("operation",)))
    return build

def _build_stt(request: Mapping[str, Any]) -> Request:
    if request.get("file") is None and not request.get("cloud_storage_url"):
        raise bad_request("speech-to-text needs 'file' or 'cloud_storage_url'")
    if request.get("webhook") in (True, "true"):
        raise bad_request("speech-to-text with webhook=true is asynchronous, not a sync call")
    return _form_call("/v1/speech-to-text", "model_id")(request)

_BUILDERS: dict[str, Callable[[Mapping[str, Any]], Request]] = {
    "tts": _build_tts,
    "sfx": _json_call("/v1/sound-generation", "text"),
    "stt": _build_stt,
    "voice-clone": _form_call("/v1/voices/add", "name", "files"),
    "voice-design": _json_call("/v1/text-to-voice/design", "voice_description"),
    "forced-alignment": _form_call("/v1/forced-alignment", "file", "text"),
}

SYNC_OPERATIONS = frozenset(_BUILDERS)

def build_sync_request(request: Mapping[str, Any]) -> Request:
    """The request of a sync operation (``request["operation"]``, default ``tts``)."""
    builder = _BUILDERS.get(_operation(request))
    if builder is None:
        raise bad_request(f"unknown ElevenLabs operation {request.get('operation')!r}")
    return builder(request)

def _operation(request: Mapping[str, Any]) -> str:
    return str(request.get("operation") or "tts")

def media_auth_headers(endpoint: Endpoint) -> dict[str, str]:
    """Headers the media downloader must send to fetch an ElevenLabs result URL."""
    return {"xi-api-key": endpoint.api_key}

def parse_dubbing_created(raw: RawResponse) -> str:
    """The ``dubbing_id`` of a create response."""
    dubbing_id = json_object(raw).get("dubbing_id")
    if not isinstance(dubbing_id, str) or not dubbing_id:
        raise MalformedResponse(f"dubbing create response without dubbing_id: {raw.body[:200]!r}",
                                provider=PROVIDER, status=raw.status)
    return dubbing_id

def parse_dubbing_status(raw: RawResponse, *, base_url: str) -> PollOutcome:
    """A ``GET /v1/dubbing/{id}`` body as an outcome; result URLs are built on ``base_url``."""
    body = json_object(raw)
    status = body.get("status")
    if not isinstance(status, str):
        raise MalformedResponse(f"dubbing status is not a string: {status!r}",
                                provider=PROVIDER, status=raw.status)
    if status in RUNNING_STATUSES:
        return Running(raw_state=str(status))
    if status == "dubbed":
        return Succeeded(media_urls=_dub_urls(body, base_url, raw.status), raw=body)
    if status == "failed":
        return Failed(error=str(body.get("error") or "dubbing failed"), raw=body)
    raise MalformedResponse(f"unknown dubbing status {status!r}", provider=PROVIDER,
                            status=raw.status)

def _dub_urls(body: Mapping[str, Any], base_url: str, http_status: int) -> tuple[str, ...]:
    dubbing_id, langs = body.get("dubbing_id"), body.get("target_languages")
    if not (isinstance(dubbing_id, str) and dubbing_id and isinstance(langs, list) and langs
            and all(isinstance(lang, str) and lang for lang in langs)):
        raise MalformedResponse("dubbed without dubbing_id or target_languages",
                                provider=PROVIDER, status=http_status)
    root = base_url.rstrip("/")
    return tuple(f"{root}/v1/dubbing/{dubbing_id}/audio/{lang}" for lang in langs)

def _cost(raw: RawResponse) -> float | None:
    return reported_cost(raw.headers.get("character-cost"))

def _usage(cost: float | None) -> Usage:
    return {"characters": cost} if cost is not None else {}

def parse_audio(raw: RawResponse) -> Succeeded:
    """TTS / SFX: the body is the audio; ``character-cost`` is the cost."""
    content_type = raw.headers.get("content-type", "audio/mpeg").split(";")[0].strip()
    if not raw.body or not content_type.startswith(("audio/", "application/octet-stream")):
        raise MalformedResponse(f"expected audio, got {content_type!r} "
                                f"({len(raw.body)} bytes)", provider=PROVIDER,
                                status=raw.status)
    cost = _cost(raw)
    return Succeeded(blobs=(Blob(content_type=content_type, data=raw.body),), cost=cost,
                     usage=_usage(cost))

def _field(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...],
           raw: RawResponse) -> Any:
    value = body.get(key)
    if not isinstance(value, kind):
        raise MalformedResponse(f"response field {key!r} missing or not {kind}",
                                provider=PROVIDER, status=raw.status)
    return value

def parse_stt(raw: RawResponse) -> Succeeded:
    """Speech-to-text: the transcript as ``text``, the whole JSON as ``raw``."""
    body = json_object(raw)
    cost = _cost(raw)
    return Succeeded(text=_field(body, "text", str, raw), raw=body, cost=cost,
                     usage=_usage(cost))

def parse_voice_clone(raw: RawResponse) -> Succeeded:
    """Instant voice clone: ``raw = {voice_id, requires_verification}``."""
    body = json_object(raw)
    voice_id = _field(body, "voice_id", str, raw)
    return Succeeded(raw={"voice_id": voice_id,
                          "requires_verification": bool(body.get("requires_verification"))})

def parse_voice_design(raw: RawResponse) -> Succeeded:
    """Voice design: each preview's audio decoded as a blob; ``raw`` keeps the previews'
    metadata (without the base64 bodies) and ``text``."""
    body = json_object(raw)
    previews = _field(body, "previews", list, raw)
    if not previews or not all(isinstance(p, dict) for p in previews):
        raise MalformedResponse("voice design response without previews",
                                provider=PROVIDER, status=raw.status)
    blobs = tuple(_preview_blob(p, raw) for p in previews)
    meta = [{k: v for k, v in p.items() if k != "audio_base_64"} for p in previews]
    return Succeeded(blobs=blobs, raw={"text": body.get("text"), "previews": meta})

def _preview_blob(preview: Mapping[str, Any], raw: RawResponse) -> Blob:
    encoded = _field(preview, "audio_base_64", str, raw)
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedResponse(f"preview audio is not base64: {exc}", provider=PROVIDER,
                                status=raw.status) from exc
    return Blob(content_type=str(preview.get("media_type") or "audio/mpeg"), data=data)

def parse_forced_alignment(raw: RawResponse) -> Succeeded:
    """Forced alignment: ``raw = {characters, words, loss}``."""
    body = json_object(raw)
    _field(body, "characters", list, raw)
    _field(body, "words", list, raw)
    return Succeeded(raw=body)

_PARSERS: dict[str, Callable[[RawResponse], Succeeded]] = {
    "tts": parse_audio,
    "sfx": parse_audio,
    "stt": parse_stt,
    "voice-clone": parse_voice_clone,
    "voice-design": parse_voice_design,
    "forced-alignment": parse_forced_alignment,
}

#: The operations whose answer is the file itself (the audio), not a document to parse.
FILE_OPERATIONS = frozenset(op for op, parser in _PARSERS.items() if parser is parse_audio)

def parse_sync(operation: str, raw: RawResponse) -> Succeeded:
    """The outcome of a sync ``operation`` from its successful response."""
    parser = _PARSERS.get(operation)
    if parser is None:
        raise bad_request(f"unknown ElevenLabs operation {operation!r}")
    return parser(raw)
