"""Simulated ElevenLabs API: dubbing (polled), the one-round-trip endpoints, and the
speech-to-text webhook delivery.

Every answer follows a recorded or documented shape (``tests/fixtures/providers/
elevenlabs/``, research notes ``/work/notes/elevenlabs.md``); the sources are the
official OpenAPI (elevenlabs-docs ``fern/apis/api/openapi.json``), SDK 2.59
(elevenlabs-python), the errors page (elevenlabs.io/docs/eleven-api/resources/errors)
and live recordings (justintanner/apicity ``tests/recordings/elevenlabs_2379486140/``:
``dubbing_1207881722``, ``sound-generation_3519036185``, ``speech-to-text_1600104305``,
``forced-alignment_1489639904``). Names in brackets are route names (journal, faults).

Dubbing:

- ``POST /v1/dubbing`` [create] multipart -> ``{dubbing_id, expected_duration_sec}``.
- ``GET /v1/dubbing/{id}`` [poll]: ``queued -> preparing -> dubbing -> dubbed|failed``,
  driven by the task script (its queued steps are ``queued``; the first running
  observation is ``preparing``, later ones ``dubbing``). As recorded live,
  ``target_languages`` is ``[]`` and ``media_metadata`` ``null`` until dubbed; then the
  languages and ``{content_type, duration}`` appear. ``source_language`` is the request's
  ``source_lang`` in every state when one was given (live), and with ``auto`` it is absent
  until dubbed, then a detected ISO code (SDK: "once dubbing has completed").
  ``created_at`` has no timezone (``2025-07-15T14:49:41.149000``). A vanished task is 404.
- ``GET /v1/dubbing/{id}/audio/{lang}`` [result]: the OpenAPI's flat bodies, 425
  ``{"error": "dubbing_not_dubbed", ...}`` until dubbed and 404 ``dubbing_not_found``
  for a language without a dub (also a failed dub, and after ``media_ttl_s``, both
  unverified); then the bytes, ``video/mp4`` for a video source, else ``audio/mpeg``.

One round trip (the script's ``_sim`` may arrive as JSON text in multipart; ``hang_s``
delays the answer, ``end="failed"`` answers ``error_code``'s status, default 500):

- ``POST /v1/text-to-speech/{voice_id}`` [tts]: audio, ``request-id`` and
  ``character-cost`` headers (documented). ``/v1/sound-generation`` [sfx]: audio with
  ``character-cost`` and no ``request-id`` (recorded). ``character-cost`` is a reported
  figure, never the text length: the script's ``cost``, else :data:`CHARACTER_COST`.
- ``POST /v1/speech-to-text`` [stt]: the recorded JSON and headers (``character-cost: 0``,
  ``fiat-cost-before-overages``, ``fiat-currency``, concurrency headers); ``keyterms``
  without ``scribe_v2`` is the errors page's own 400 example. With ``webhook=true``: HTTP
  202 ``{message, request_id}`` (OpenAPI), then a signed ``speech_to_text_transcription``
  delivery to each workspace webhook (:func:`set_workspace_webhook`; ``webhook_id``
  picks one), after ``hang_s`` simulated seconds, mistreated per the script's ``webhook``
  plan. A failing script answers its error at once; ``stuck``/``vanished`` never deliver.
- ``/v1/voices/add`` [voice-clone], ``/v1/text-to-voice/design`` [voice-design],
  ``/v1/forced-alignment`` [forced-alignment, with ``character-cost`` as recorded]: JSON.

Errors (errors page): ``{"detail": {type, code, message, status, request_id, param}}``
with the documented code -> type table; a bad key gets the live 401 (``code:
"unauthorized"``, legacy ``status: "invalid_api_key"``, no ``param``); codes recorded only
in the legacy shape (``quota_exceeded`` as 401, ``too_many_concurrent_requests``) keep
it; 422 is pydantic's list ``{"detail": [{type, loc, msg, input}]}``. Every response has
``x-region``/``x-trace-id`` (recorded); TTS and STT also the concurrency headers
(documented, recorded on STT; absent from the SFX, dubbing and forced-alignment
recordings); over :data:`MAX_CONCURRENT` a request gets ``429
concurrent_limit_exceeded``.

Account limits (off unless set: ``sim.accounts["elevenlabs"].limits``, ``POST
/_sim/limits``; :mod:`callwarden.providers.simulator.limits`) apply to the generation
requests (:data:`GENERATION_ROUTES`: the dubbing create and every one-round-trip call).
As ElevenLabs' concurrency limit counts requests, such a request is in flight until it is
answered (a dub is not counted while it dubs). ``max_in_flight`` refuses with the same
``429 concurrent_limit_exceeded``, ``create_rate`` with ``429 rate_limit_exceeded``; the
account also counts the :data:`MAX_CONCURRENT` refusals of generation requests.
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, NamedTuple
from urllib.parse import urlparse

import msgspec
from aiohttp import web

from callwarden.providers.elevenlabs.webhook import elevenlabs_sign
from callwarden.providers.simulator.core import MAX_HANG_S, Account, Script, Simulator, Task
from callwarden.providers.simulator.limits import Refusal
from callwarden.providers.simulator.media import fake_media
from callwarden.providers.simulator.webhooks import retry_server_errors

__all__ = ["CHARACTER_COST", "CODE_STATUS", "GENERATION_ROUTES", "MAX_CONCURRENT", "NAME",
           "parse_multipart", "render_error", "routes", "set_workspace_webhook",
           "workspace_webhooks"]

NAME = "elevenlabs"
MAX_CONCURRENT = 8
REGION = "us-central1"  # the recorded ``x-region``
ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
DETECTED_LANGUAGE = "en"  # what an ``auto`` dub reports as its source once dubbed
MEDIA_DURATION_S = 12.5
STT_ACCEPTED = "Request accepted. Transcription result will be sent to the webhook."
STT_EXPOSED = ("current-concurrent-requests, maximum-concurrent-requests, "
               "workspace-concurrent-requests, character-cost, fiat-cost-before-overages, "
               "fiat-currency")  # the recorded access-control-expose-headers
CONCURRENCY_ROUTES = frozenset({"tts", "stt"})

#: The ``character-cost`` each operation reports when the script sets no ``cost``: the
#: recorded figures (SFX 10 for a 13-character 0.5 s prompt, STT 0, forced alignment 3
#: for a 31-character text) and the documented TTS placeholder.
CHARACTER_COST: dict[str, float] = {"tts": 12, "sfx": 10, "stt": 0, "forced-alignment": 3}

#: Error code -> (HTTP status, type), from the errors page's tables. ``voice_not_found``
#: is typed ``not_found`` there, but the help centre files it under 400 (kept).
ERRORS: dict[str, tuple[int, str]] = {
    "invalid_parameters": (400, "validation_error"),
    "missing_required_field": (400, "validation_error"),
    "text_too_long": (400, "validation_error"),
    "max_character_limit_exceeded": (400, "validation_error"),
    "voice_not_found": (400, "not_found"),
    "malformed_json": (400, "invalid_request"),
    "invalid_content_type": (400, "invalid_request"),
    "invalid_api_key": (401, "authentication_error"),
    "unauthorized": (401, "authentication_error"),
    "insufficient_credits": (402, "payment_required"),
    "forbidden": (403, "authorization_error"),
    "dubbing_not_found": (404, "not_found"),
    "task_not_found": (404, "not_found"),
    "conflict": (409, "conflict"),
    "rate_limit_exceeded": (429, "rate_limit_error"),
    "concurrent_limit_exceeded": (429, "rate_limit_error"),
    "system_busy": (429, "rate_limit_error"),
    "internal_error": (500, "internal_error"),
    "service_unavailable": (503, "service_unavailable"),
    "maintenance": (503, "service_unavailable"),
}
#: Codes recorded only in the legacy ``{"detail": {"status", "message"?}}`` shape:
#: (HTTP status, whether the recorded body has a message).
LEGACY: dict[str, tuple[int, bool]] = {"quota_exceeded": (401, True),
                                       "too_many_concurrent_requests": (429, False)}
CODE_STATUS: dict[str, int] = ({code: status for code, (status, _) in ERRORS.items()}
                               | {code: status for code, (status, _) in LEGACY.items()})
_DEFAULT_CODE: dict[int, str] = {
    400: "invalid_parameters", 401: "unauthorized", 402: "insufficient_credits",
    403: "forbidden", 404: "task_not_found", 409: "conflict", 429: "rate_limit_exceeded",
    503: "service_unavailable",
}
_TYPES: dict[int, str] = {
    400: "validation_error", 401: "authentication_error", 402: "payment_required",
    403: "authorization_error", 404: "not_found", 409: "conflict", 429: "rate_limit_error",
    503: "service_unavailable",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# ------------------------------------------------------------------ errors

def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False, code: str | None = None,
                 param: str | None = None) -> web.Response:
    """An ElevenLabs error answer (there are no in-body errors: ``in_body`` is ignored):
    pydantic's list for 422, else the ``detail`` object of ``code`` (see the module
    docstring)."""
    headers = {} if retry_after is None else {"retry-after": str(max(0, round(retry_after)))}
    if status == 422:
        body: dict[str, Any] = {"detail": [_validation_item(message, param)]}
    else:
        body = {"detail": _detail(status, message, code or _DEFAULT_CODE.get(status),
                                  param)}
    return web.json_response(body, status=status, headers=headers)


def _validation_item(message: str, param: str | None) -> dict[str, Any]:
    """One pydantic v2 item, as recorded live (``input`` beside the schema's keys)."""
    if param is None:
        return {"type": "value_error", "loc": ["body"], "msg": message, "input": None}
    return {"type": "missing", "loc": ["body", param], "msg": message, "input": None}


def _detail(status: int, message: str, code: str | None, param: str | None
            ) -> dict[str, Any]:
    code = code or "internal_error"
    if code in LEGACY:
        return {"status": code, "message": message} if LEGACY[code][1] else {"status": code}
    if status == 401 and code in ("invalid_api_key", "unauthorized"):
        return {"type": "authentication_error", "code": "unauthorized", "message": message,
                "status": "invalid_api_key", "request_id": uuid.uuid4().hex}
    kind = ERRORS[code][1] if code in ERRORS else _TYPES.get(status, "internal_error")
    return {"type": kind, "code": code, "message": message, "status": code,
            "request_id": uuid.uuid4().hex, "param": param}


def _flat_error(status: int, error: str, message: str) -> web.Response:
    """The dubbed-audio endpoint's own error shape (OpenAPI examples): no ``detail``."""
    return web.json_response({"error": error, "message": message}, status=status)


def _script_error(script: Script) -> web.Response:
    status = CODE_STATUS.get(script.error_code or "", 500)
    return render_error(status, script.error, code=script.error_code)


# ------------------------------------------------------------------ multipart

_DISPOSITION = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_multipart(body: bytes, content_type: str) -> dict[str, list[str | bytes]]:
    """Fields of a ``multipart/form-data`` body: text fields as ``str``, files as ``bytes``.

    (The journal middleware has already read the body, so aiohttp's reader cannot.)"""
    match = re.search(r"boundary=\"?([^\";]+)\"?", content_type)
    if not content_type.startswith("multipart/form-data") or match is None:
        raise ValueError("expected multipart/form-data")
    fields: dict[str, list[str | bytes]] = {}
    for part in body.split(b"--" + match.group(1).encode())[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        params = dict(_DISPOSITION.findall(head.decode("utf-8", "replace")))
        value = data.removesuffix(b"\r\n")
        if "name" in params:
            fields.setdefault(params["name"], []).append(
                value if "filename" in params else value.decode("utf-8", "replace"))
    return fields


async def _form(request: web.Request) -> dict[str, list[str | bytes]] | web.Response:
    try:
        return parse_multipart(await request.read(), request.headers.get("content-type", ""))
    except ValueError as exc:
        return render_error(400, str(exc), code="invalid_content_type")


def _first(form: Mapping[str, list[str | bytes]], key: str) -> str | bytes | None:
    values = form.get(key)
    return values[0] if values else None


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _script(sim: Simulator, fields: Mapping[str, Any]) -> Script | web.Response:
    """The script for a request; ``_sim`` may arrive as JSON text (multipart)."""
    sim_field = fields.get("_sim")
    try:
        if isinstance(sim_field, str | bytes):
            fields = {"_sim": msgspec.json.decode(sim_field)}
        return sim.script_for(NAME, fields)
    except (msgspec.DecodeError, web.HTTPBadRequest) as exc:
        return render_error(400, f"invalid _sim script: {exc}", code="invalid_parameters")


def _figure(value: float) -> str:
    """A header figure as ElevenLabs writes it (``10``, ``0``; a fraction stays one)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# ------------------------------------------------------------------ dubbing

def _created_at(ts: float) -> str:
    """``2025-07-15T14:49:41.149000``: UTC, milliseconds padded to six digits, no zone."""
    moment = datetime.fromtimestamp(ts, UTC).replace(tzinfo=None)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000).isoformat(
        timespec="microseconds")


def _dub_body(task: Task, status: str) -> dict[str, Any]:
    dubbed = status == "dubbed"
    body: dict[str, Any] = {"dubbing_id": task.id, "name": task.extra["name"],
                            "status": status}
    source = task.extra["source_language"] or (DETECTED_LANGUAGE if dubbed else None)
    if source is not None:
        body["source_language"] = source
    media = {"content_type": task.extra["content_type"], "duration": MEDIA_DURATION_S}
    return body | {
        "target_languages": list(task.extra["target_languages"]) if dubbed else [],
        "editable": False, "created_at": _created_at(task.created_at),
        "media_metadata": media if dubbed else None,
        "error": task.script.error if status == "failed" else None}


def _dub_status(task: Task, phase_name: str) -> str:
    if phase_name == "running":
        seen = task.extra["running_polls"] = task.extra.get("running_polls", 0) + 1
        return "preparing" if seen == 1 else "dubbing"
    return {"queued": "queued", "succeeded": "dubbed", "failed": "failed"}[phase_name]


def _live_task(sim: Simulator, request: web.Request) -> Task | None:
    task = sim.tasks.get(NAME, request.match_info["dubbing_id"])
    if task is None or task.peek(sim.clock.now()).name == "vanished":
        return None
    return task


def _dub_problem(form: Mapping[str, list[str | bytes]]) -> web.Response | None:
    target = _first(form, "target_lang")
    if not isinstance(target, str) or not target:
        return render_error(422, "Field required", param="target_lang")
    if _first(form, "file") is None and not _first(form, "source_url"):
        return render_error(400, "Either file or source_url must be provided", param="file",
                            code="invalid_parameters")
    return None


_VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov", ".webm", ".mkv", ".avi")


def _is_video(data: bytes) -> bool:
    """An ISO-BMFF file that is not an M4A/M4B audio one, or a Matroska/WebM file."""
    if data[4:8] == b"ftyp":
        return data[8:11] not in (b"M4A", b"M4B")
    return data.startswith(b"\x1aE\xdf\xa3")


def _dub_content_type(form: Mapping[str, list[str | bytes]]) -> str:
    """The dub's media type: ``video/mp4`` for a video source, else ``audio/mpeg`` (the
    two the OpenAPI names; a live MP3 dub reported ``audio/mpeg``)."""
    file = _first(form, "file")
    if isinstance(file, bytes):
        return "video/mp4" if _is_video(file) else "audio/mpeg"
    url = _first(form, "source_url")
    if isinstance(url, str) and urlparse(url).path.lower().endswith(_VIDEO_SUFFIXES):
        return "video/mp4"
    return "audio/mpeg"


async def _create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    form = await _form(request)
    if isinstance(form, web.Response):
        return form
    script = _dub_problem(form) or _script(sim, {k: v[0] for k, v in form.items()})
    if isinstance(script, web.Response):
        return script
    dubbing_id = "".join(sim.rng.choices(ID_ALPHABET, k=20))
    kept = {k: v for k, v in form.items() if k not in ("file", "csv_file")}
    task = sim.tasks.create(NAME, "dubbing", kept, script, callback_url=None,
                            task_id=dubbing_id)
    source = str(_first(form, "source_lang") or "auto")
    task.extra |= {"name": str(_first(form, "name") or "dub"),
                   "source_language": None if source == "auto" else source,
                   "target_languages": [str(_first(form, "target_lang"))],
                   "content_type": _dub_content_type(form)}
    seconds = float(sum(step.seconds or 0 for step in script.steps) or 10.0)
    return web.json_response({"dubbing_id": dubbing_id, "expected_duration_sec": seconds})


async def _poll(sim: Simulator, request: web.Request) -> web.StreamResponse:
    task = _live_task(sim, request)
    if task is None:
        return render_error(404, "Dubbing not found", code="dubbing_not_found")
    phase = task.observe(sim.clock.now())
    if phase.name == "vanished" or task.polls <= task.script.not_found_first_polls:
        return render_error(404, "Dubbing not found", code="dubbing_not_found")
    return web.json_response(_dub_body(task, _dub_status(task, phase.name)))


def _no_dub(lang: str) -> web.Response:
    return _flat_error(404, "dubbing_not_found", f"There is no dubbing for language {lang}.")


async def _result(sim: Simulator, request: web.Request) -> web.StreamResponse:
    task = _live_task(sim, request)
    lang = request.match_info["lang"]
    if task is None or lang not in task.extra["target_languages"]:
        return _no_dub(lang)
    return _audio_answer(sim, task, lang)


def _audio_answer(sim: Simulator, task: Task, lang: str) -> web.Response:
    now = sim.clock.now()
    name = task.peek(now).name
    if name == "failed":
        return _no_dub(lang)
    if name != "succeeded":
        return _flat_error(425, "dubbing_not_dubbed", "Dubbing has not finished yet.")
    done_at = task.extra.setdefault("dubbed_at", now)
    ttl = task.script.media_ttl_s
    if ttl is not None and now >= done_at + ttl:
        return _no_dub(lang)
    content_type = task.extra["content_type"]
    return web.Response(body=fake_media(content_type, f"{task.id}/{lang}"),
                        content_type=content_type)


def _dubbing_routes(sim: Simulator) -> list[web.RouteDef]:
    path = "/v1/dubbing/{dubbing_id}"
    return [web.post("/v1/dubbing", partial(_create, sim), name="create"),
            web.get(path, partial(_poll, sim), name="poll"),
            web.get(path + "/audio/{lang}", partial(_result, sim), name="result")]


# ------------------------------------------------------------------ workspace webhooks

def set_workspace_webhook(sim: Simulator, url: str, webhook_id: str | None = None) -> str:
    """Register ``url`` as a workspace webhook of ``sim`` subscribed to speech-to-text (what
    the dashboard or ``POST /v1/workspace/webhooks`` does upstream); return its
    ``webhook_id``. Deliveries are signed with ``sim.webhook_secrets["elevenlabs"]``."""
    return sim.register_webhook(NAME, url, webhook_id)


def workspace_webhooks(sim: Simulator) -> dict[str, str]:
    """``sim``'s workspace webhooks: ``webhook_id -> url``."""
    return dict(sim.workspace_webhooks.get(NAME, {}))



# ------------------------------------------------------------------ sync endpoints

@dataclass(frozen=True)
class _Call:
    """One sync request: the simulator, the request, its fields and its script."""

    sim: Simulator
    request: web.Request
    fields: Mapping[str, Any]
    script: Script

    def cost(self, operation: str) -> str:
        """The ``character-cost`` header: the script's figure, else the recorded one."""
        cost = self.script.cost
        return _figure(CHARACTER_COST[operation] if cost is None else cost)


async def _run_script(script: Script) -> web.Response | None:
    if script.hang_s:
        await asyncio.sleep(min(script.hang_s, MAX_HANG_S))
    if script.end == "failed":
        return _script_error(script)
    if script.end == "vanished":
        return render_error(404, script.error)
    return None


def _tts(call: _Call) -> web.Response:
    voice, text = call.request.match_info["voice_id"], str(call.fields["text"])
    return web.Response(body=fake_media("audio/mpeg", f"{voice}/{text}"),
                        content_type="audio/mpeg",
                        headers={"request-id": uuid.uuid4().hex,
                                 "character-cost": call.cost("tts")})


def _sfx(call: _Call) -> web.Response:
    return web.Response(body=fake_media("audio/mpeg", f"sfx/{call.fields['text']}"),
                        content_type="audio/mpeg",
                        headers={"character-cost": call.cost("sfx"),
                                 "access-control-expose-headers": "character-cost"})


def _words(text: str, speaker: str | None) -> list[dict[str, Any]]:
    """Words with ``spacing`` items between them, as STT answers (``speaker_id`` only
    when diarized)."""
    out: list[dict[str, Any]] = []
    for i, word in enumerate(text.split()):
        start = i * 0.5
        if i:
            out.append({"text": " ", "start": start - 0.1, "end": start, "type": "spacing",
                        "logprob": 0.0})
        out.append({"text": word, "start": start, "end": start + 0.4, "type": "word",
                    "logprob": -0.1})
    if speaker is not None:
        out = [w | {"speaker_id": speaker} for w in out]
    return out


def _transcription(fields: Mapping[str, Any]) -> dict[str, Any]:
    text = "Simulated transcript of the uploaded audio."
    speaker = "speaker_0" if _truthy(fields.get("diarize")) else None
    return {"language_code": "eng", "language_probability": 1.0, "text": text,
            "words": _words(text, speaker)}


def _stt(call: _Call) -> web.Response:
    body = _transcription(call.fields) | {"transcription_id": uuid.uuid4().hex[:20],
                                          "audio_duration_secs": 2.5}
    return web.json_response(body, headers={
        "character-cost": call.cost("stt"), "fiat-cost-before-overages": "0.0",
        "fiat-currency": "usd", "access-control-expose-headers": STT_EXPOSED})


_BAD = object()  # ``webhook_metadata`` that is not a JSON object


def _stt_problem(sim: Simulator, fields: Mapping[str, Any]) -> web.Response | None:
    """The errors page's example 400, and the webhook parameters' checks."""
    model = str(fields.get("model_id"))
    if fields.get("keyterms") not in (None, "") and model != "scribe_v2":
        return render_error(400, "The 'keyterms' parameter is only supported with the "
                            f"'scribe_v2' model. You specified '{model}'.",
                            code="invalid_parameters", param="keyterms")
    if not _truthy(fields.get("webhook")):
        return None
    if _metadata(fields) is _BAD:
        return render_error(400, "webhook_metadata must be a JSON object",
                            code="invalid_parameters", param="webhook_metadata")
    hook = fields.get("webhook_id")
    if hook not in (None, "") and hook not in workspace_webhooks(sim):
        return render_error(400, f"Webhook {hook} not found", code="invalid_parameters",
                            param="webhook_id")
    return None


def _metadata(fields: Mapping[str, Any]) -> Any:
    """``webhook_metadata`` as JSON (``None`` when absent, :data:`_BAD` when not an
    object)."""
    raw = fields.get("webhook_metadata")
    if raw in (None, ""):
        return None
    try:
        value = msgspec.json.decode(raw) if isinstance(raw, str | bytes) else raw
    except msgspec.DecodeError:
        return _BAD
    return value if isinstance(value, dict) else _BAD


def _stt_accept(call: _Call) -> web.Response:
    """``webhook=true``: 202 now; the transcription goes to the workspace webhooks."""
    if call.script.end == "failed":
        return _script_error(call.script)
    request_id = uuid.uuid4().hex
    if call.script.end == "succeeded":
        hooks = workspace_webhooks(call.sim)
        chosen = call.fields.get("webhook_id")
        urls = [hooks[chosen]] if chosen else list(hooks.values())
        call.sim.spawn(_deliver_transcription(call, request_id, urls))
    return web.json_response({"message": STT_ACCEPTED, "request_id": request_id},
                             status=202)


async def _deliver_transcription(call: _Call, request_id: str, urls: list[str]) -> None:
    """After ``hang_s`` simulated seconds: one signed delivery per URL, each attempt
    re-signed (``ElevenLabs-Signature: t=<ts>,v0=<hex>``)."""
    sim = call.sim
    await sim.clock.sleep(min(call.script.hang_s, MAX_HANG_S))
    body = msgspec.json.encode({
        "type": "speech_to_text_transcription", "event_timestamp": int(sim.clock.now()),
        "data": {"request_id": request_id, "webhook_metadata": _metadata(call.fields),
                 "transcription": _transcription(call.fields)}})
    secret = sim.webhook_secrets[NAME]

    def sign(ts: int) -> dict[str, str]:
        return {"content-type": "application/json",
                "ElevenLabs-Signature": elevenlabs_sign(secret, ts, body)}

    for url in urls:
        sim.webhooks.deliver(url, body, sign, call.script.webhook,
                             retry_on=retry_server_errors)


def _voice_clone(call: _Call) -> web.Response:
    return web.json_response({"requires_verification": False,
                              "voice_id": uuid.uuid4().hex[:20]})


def _voice_design(call: _Call) -> web.Response:
    description = call.fields["voice_description"]
    previews = [{"audio_base_64": base64.b64encode(
                    fake_media("audio/mpeg", f"{description}/{i}")).decode(),
                 "generated_voice_id": uuid.uuid4().hex[:20], "media_type": "audio/mpeg",
                 "duration_secs": 3.0, "language": "en"} for i in range(3)]
    return web.json_response({"previews": previews, "text": "Simulated preview text."})


def _alignment(call: _Call) -> web.Response:
    """Characters, and words with the spaces between them (as recorded live)."""
    text = str(call.fields["text"])
    chars = [{"text": c, "start": i * 0.05, "end": i * 0.05 + 0.05}
             for i, c in enumerate(text)]
    words = [{"text": w["text"], "start": w["start"], "end": w["end"], "loss": 0.1}
             for w in _words(text, None)]
    return web.json_response({"characters": chars, "words": words, "loss": 0.1},
                             headers={"character-cost": call.cost("forced-alignment"),
                                      "access-control-expose-headers": "character-cost"})


Check = Callable[[Simulator, Mapping[str, Any]], web.Response | None]


class _SyncOp(NamedTuple):
    path: str
    name: str
    multipart: bool
    required: tuple[str, ...]
    answer: Callable[[_Call], web.Response]
    check: Check | None = None


_SYNC: list[_SyncOp] = [
    _SyncOp("/v1/text-to-speech/{voice_id}", "tts", False, ("text",), _tts),
    _SyncOp("/v1/sound-generation", "sfx", False, ("text",), _sfx),
    _SyncOp("/v1/speech-to-text", "stt", True, ("model_id",), _stt, _stt_problem),
    _SyncOp("/v1/voices/add", "voice-clone", True, ("name", "files"), _voice_clone),
    _SyncOp("/v1/text-to-voice/design", "voice-design", False, ("voice_description",),
            _voice_design),
    _SyncOp("/v1/forced-alignment", "forced-alignment", True, ("file", "text"), _alignment),
]
#: The routes whose requests the account limits count: the dubbing create and every
#: one-round-trip call.
GENERATION_ROUTES = frozenset({"create"} | {op.name for op in _SYNC})


async def _fields(request: web.Request, multipart: bool) -> dict[str, Any] | web.Response:
    if multipart:
        form = await _form(request)
        return form if isinstance(form, web.Response) else {k: v[0] for k, v in form.items()}
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as exc:
        return render_error(400, f"invalid JSON body: {exc}", code="malformed_json")
    if not isinstance(body, dict):
        return render_error(422, "Input should be a valid dictionary")
    return body


async def _validated(sim: Simulator, op: _SyncOp, request: web.Request
                     ) -> dict[str, Any] | web.Response:
    fields = await _fields(request, op.multipart)
    if isinstance(fields, web.Response):
        return fields
    missing = [k for k in op.required if fields.get(k) in (None, "")]
    if missing:
        return render_error(422, "Field required", param=missing[0])
    problem = op.check(sim, fields) if op.check is not None else None
    return fields if problem is None else problem


def _sync_handler(sim: Simulator, op: _SyncOp) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        fields = await _validated(sim, op, request)
        if isinstance(fields, web.Response):
            return fields
        script = _script(sim, fields)
        if isinstance(script, web.Response):
            return script
        call = _Call(sim=sim, request=request, fields=fields, script=script)
        if op.name == "stt" and _truthy(fields.get("webhook")):
            return _stt_accept(call)
        return await _run_script(script) or op.answer(call)
    return handler


# ------------------------------------------------------------------ auth and concurrency

def _route(request: web.Request) -> str:
    return request.match_info.route.name or ""


def _guarded(sim: Simulator, handler: Handler, inflight: list[int], account: Account
             ) -> Handler:
    """Check ``xi-api-key``, count concurrent requests, apply the account limits, add the
    recorded headers."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        resp = await _admitted(sim, handler, inflight, account, request)
        resp.headers["x-region"] = REGION
        resp.headers["x-trace-id"] = uuid.uuid4().hex
        return resp
    return guarded


def _limit_error(reason: Refusal) -> web.Response:
    if reason == "rate":
        return render_error(429, "Too many requests", code="rate_limit_exceeded")
    return render_error(429, "Too many concurrent requests", code="concurrent_limit_exceeded")


def _refusal(sim: Simulator, inflight: list[int], account: Account, request: web.Request
             ) -> Refusal | None:
    """The plan's cap on concurrent requests, then (for a generation request) the
    account limits; a refused generation request is counted."""
    generation = _route(request) in GENERATION_ROUTES
    if inflight[0] >= MAX_CONCURRENT:
        if generation:
            sim.refused(account, request, "concurrency")
        return "concurrency"
    return sim.refusal(account, request) if generation else None


async def _admitted(sim: Simulator, handler: Handler, inflight: list[int], account: Account,
                    request: web.Request) -> web.StreamResponse:
    if request.headers.get("xi-api-key") != sim.api_key:
        return render_error(401, "Invalid API key", code="invalid_api_key")
    refused = _refusal(sim, inflight, account, request)
    if refused is not None:
        return _limit_error(refused)
    answered = asyncio.Event()
    if _route(request) in GENERATION_ROUTES:
        account.accept(answered.is_set)
    inflight[0] += 1
    try:
        resp = await handler(request)
        if _route(request) in CONCURRENCY_ROUTES:
            resp.headers["current-concurrent-requests"] = str(inflight[0])
            resp.headers["maximum-concurrent-requests"] = str(MAX_CONCURRENT)
            resp.headers["workspace-concurrent-requests"] = str(inflight[0])
        return resp
    finally:
        inflight[0] -= 1
        answered.set()


def routes(sim: Simulator) -> list[web.RouteDef]:
    """Every simulated ElevenLabs route (see the module docstring)."""
    inflight = [0]
    account = sim.accounts.enrol(NAME)
    defs = _dubbing_routes(sim) + [
        web.post(op.path, _sync_handler(sim, op), name=op.name) for op in _SYNC]
    return [web.route(d.method, d.path, _guarded(sim, d.handler, inflight, account),
                      **d.kwargs) for d in defs]
