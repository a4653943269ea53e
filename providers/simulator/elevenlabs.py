"""Simulated ElevenLabs API: dubbing (polled) and the one-round-trip endpoints.

Routes (names in brackets, for the journal and faults):

- ``POST /v1/dubbing`` [create] multipart -> ``{dubbing_id, expected_duration_sec}``
- ``GET /v1/dubbing/{id}`` [poll]: ``queued -> preparing -> dubbing -> dubbed|failed``
  driven by the task script (a script's queued steps are ``queued``; the first running
  observation is ``preparing``, later ones ``dubbing``); a vanished task is 404.
- ``GET /v1/dubbing/{id}/audio/{lang}`` [result]: 425 ``dubbing_not_ready`` until dubbed,
  then ``audio/mpeg`` bytes (404 once ``media_ttl_s`` has passed, if the script sets one).
- ``POST /v1/text-to-speech/{voice_id}`` [tts], ``/v1/sound-generation`` [sfx]: audio with a
  ``character-cost`` header; ``/v1/speech-to-text`` [stt], ``/v1/voices/add``
  [voice-clone], ``/v1/text-to-voice/design`` [voice-design], ``/v1/forced-alignment``
  [forced-alignment]: JSON.

Every route wants ``xi-api-key``; errors are ``{"detail": {type, code, message, status,
request_id, param}}`` (FastAPI's list shape for 422). Responses carry
``current-concurrent-requests`` / ``maximum-concurrent-requests``; over the maximum a
request gets ``429 concurrent_limit_exceeded``. A sync call's script (``_sim`` field, JSON
in multipart) may hang (``hang_s``) or fail (``end="failed"``; ``error_code`` picks the
status from :data:`CODE_STATUS`, default 500).
"""

from __future__ import annotations

import asyncio
import base64
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

import msgspec
from aiohttp import web

from providers.simulator.core import MAX_HANG_S, Script, Simulator, Task
from providers.simulator.media import fake_media

__all__ = ["CODE_STATUS", "MAX_CONCURRENT", "NAME", "parse_multipart", "render_error",
           "routes"]

NAME = "elevenlabs"
MAX_CONCURRENT = 8
ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
CODE_STATUS: dict[str, int] = {
    "invalid_api_key": 401, "quota_exceeded": 401, "voice_not_found": 400,
    "max_character_limit_exceeded": 400, "invalid_parameters": 400, "not_found": 404,
    "dubbing_not_ready": 425, "rate_limit_exceeded": 429, "concurrent_limit_exceeded": 429,
    "internal_server_error": 500, "service_unavailable": 503,
}
_DEFAULT_CODE: dict[int, str] = {
    400: "invalid_parameters", 401: "invalid_api_key", 403: "forbidden", 404: "not_found",
    425: "dubbing_not_ready", 429: "rate_limit_exceeded",
}
_TYPES: dict[int, str] = {
    400: "validation_error", 401: "authentication_error", 403: "authorization_error",
    404: "not_found", 425: "not_ready", 429: "rate_limit_error",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def render_error(status: int, message: str, *, retry_after: float | None = None,
                 in_body: bool = False, code: str | None = None,
                 param: str | None = None) -> web.Response:
    """The current ``detail`` error shape (ElevenLabs has no in-body errors: ``in_body`` is
    ignored); 422 uses FastAPI's list shape."""
    headers = {} if retry_after is None else {"retry-after": str(max(0, round(retry_after)))}
    if status == 422:
        detail: Any = [{"loc": ["body", param or "body"], "msg": message,
                        "type": "value_error"}]
    else:
        code = code or _DEFAULT_CODE.get(status, "internal_server_error")
        detail = {"type": _TYPES.get(status, "internal_error"), "code": code,
                  "message": message, "status": code, "request_id": uuid.uuid4().hex,
                  "param": param}
    return web.json_response({"detail": detail}, status=status, headers=headers)


def _now_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


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


def _script(sim: Simulator, fields: Mapping[str, Any]) -> Script | web.Response:
    """The script for a request; ``_sim`` may arrive as JSON text (multipart)."""
    sim_field = fields.get("_sim")
    try:
        if isinstance(sim_field, str | bytes):
            fields = {"_sim": msgspec.json.decode(sim_field)}
        return sim.script_for(NAME, fields)
    except (msgspec.DecodeError, web.HTTPBadRequest) as exc:
        return render_error(400, f"invalid _sim script: {exc}", code="invalid_parameters")


# ------------------------------------------------------------------ dubbing

def _dub_body(task: Task, status: str) -> dict[str, Any]:
    return {"dubbing_id": task.id, "name": task.extra["name"], "status": status,
            "source_language": task.extra["source_language"],
            "target_languages": task.extra["target_languages"], "editable": False,
            "created_at": _now_iso(task.created_at),
            "media_metadata": {"content_type": "video/mp4", "duration": 12.5},
            "error": task.script.error if status == "failed" else None}


def _dub_status(task: Task, phase_name: str) -> str:
    if phase_name == "running":
        seen = task.extra["running_polls"] = task.extra.get("running_polls", 0) + 1
        return "preparing" if seen == 1 else "dubbing"
    return {"queued": "queued", "succeeded": "dubbed", "failed": "failed"}[phase_name]


def _task_or_404(sim: Simulator, request: web.Request) -> Task | web.Response:
    task = sim.tasks.get(NAME, request.match_info["dubbing_id"])
    if task is None or task.peek(sim.clock.now()).name == "vanished":
        return render_error(404, "Dubbing not found", code="dubbing_not_found")
    return task


def _dub_problem(form: Mapping[str, list[str | bytes]]) -> web.Response | None:
    target = _first(form, "target_lang")
    if not isinstance(target, str) or not target:
        return render_error(422, "field required", param="target_lang")
    if _first(form, "file") is None and not _first(form, "source_url"):
        return render_error(400, "Either file or source_url must be provided", param="file")
    return None


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
    task.extra |= {"name": str(_first(form, "name") or "dub"),
                   "source_language": str(_first(form, "source_lang") or "auto"),
                   "target_languages": [str(_first(form, "target_lang"))]}
    seconds = sum(step.seconds or 0 for step in script.steps) or 10.0
    return web.json_response({"dubbing_id": dubbing_id, "expected_duration_sec": seconds})


async def _poll(sim: Simulator, request: web.Request) -> web.StreamResponse:
    task = _task_or_404(sim, request)
    if isinstance(task, web.Response):
        return task
    phase = task.observe(sim.clock.now())
    if phase.name == "vanished" or task.polls <= task.script.not_found_first_polls:
        return render_error(404, "Dubbing not found", code="dubbing_not_found")
    return web.json_response(_dub_body(task, _dub_status(task, phase.name)))


async def _result(sim: Simulator, request: web.Request) -> web.StreamResponse:
    task = _task_or_404(sim, request)
    if isinstance(task, web.Response):
        return task
    lang = request.match_info["lang"]
    if lang not in task.extra["target_languages"]:
        return render_error(404, f"Language {lang} not found", code="language_not_found")
    return _audio_answer(sim, task, lang)


def _dubbing_routes(sim: Simulator) -> list[web.RouteDef]:
    path = "/v1/dubbing/{dubbing_id}"
    return [web.post("/v1/dubbing", partial(_create, sim), name="create"),
            web.get(path, partial(_poll, sim), name="poll"),
            web.get(path + "/audio/{lang}", partial(_result, sim), name="result")]


def _audio_answer(sim: Simulator, task: Task, lang: str) -> web.Response:
    now = sim.clock.now()
    name = task.peek(now).name
    if name == "failed":
        return render_error(400, f"Dubbing failed: {task.script.error}", code="dubbing_failed")
    if name != "succeeded":
        return render_error(425, "Dubbing not ready", code="dubbing_not_ready")
    done_at = task.extra.setdefault("dubbed_at", now)
    ttl = task.script.media_ttl_s
    if ttl is not None and now >= done_at + ttl:
        return render_error(404, "Dubbed audio not found", code="not_found")
    data = fake_media("audio/mpeg", f"{task.id}/{lang}")
    return web.Response(body=data, content_type="audio/mpeg")


# ------------------------------------------------------------------ sync endpoints

async def _run_script(script: Script) -> web.Response | None:
    if script.hang_s:
        await asyncio.sleep(min(script.hang_s, MAX_HANG_S))
    if script.end == "failed":
        status = CODE_STATUS.get(script.error_code or "", 500)
        return render_error(status, script.error, code=script.error_code)
    if script.end == "vanished":
        return render_error(404, script.error, code="not_found")
    return None


def _audio(text: str, seed: str) -> web.Response:
    return web.Response(body=fake_media("audio/mpeg", seed), content_type="audio/mpeg",
                        headers={"character-cost": str(len(text))})


def _words(text: str) -> list[dict[str, Any]]:
    return [{"text": w, "start": i * 0.5, "end": i * 0.5 + 0.4, "type": "word", "logprob": 0.0}
            for i, w in enumerate(text.split())]


def _tts(request: web.Request, body: Mapping[str, Any]) -> web.Response:
    voice = request.match_info.get("voice_id", "sfx")
    return _audio(str(body["text"]), f"{voice}/{body['text']}")


def _stt(request: web.Request, form: Mapping[str, Any]) -> web.Response:
    text = "Simulated transcript of the uploaded audio."
    return web.json_response({"language_code": "eng", "language_probability": 1.0,
                              "text": text, "words": _words(text),
                              "transcription_id": uuid.uuid4().hex[:20],
                              "audio_duration_secs": 2.5})


def _voice_clone(request: web.Request, form: Mapping[str, Any]) -> web.Response:
    return web.json_response({"voice_id": uuid.uuid4().hex[:20],
                              "requires_verification": False})


def _voice_design(request: web.Request, body: Mapping[str, Any]) -> web.Response:
    previews = [{"audio_base_64": base64.b64encode(
                    fake_media("audio/mpeg", f"{body['voice_description']}/{i}")).decode(),
                 "generated_voice_id": uuid.uuid4().hex[:20], "media_type": "audio/mpeg",
                 "duration_secs": 3.0, "language": "en"} for i in range(3)]
    return web.json_response({"previews": previews, "text": "Simulated preview text."})


def _alignment(request: web.Request, form: Mapping[str, Any]) -> web.Response:
    text = str(form["text"])
    chars = [{"text": c, "start": i * 0.05, "end": i * 0.05 + 0.05}
             for i, c in enumerate(text)]
    words = [{"text": w["text"], "start": w["start"], "end": w["end"], "loss": 0.1}
             for w in _words(text)]
    return web.json_response({"characters": chars, "words": words, "loss": 0.1})


SyncAnswer = Callable[[web.Request, Mapping[str, Any]], web.Response]
# (path, route name, multipart?, required fields, answer)
_SYNC: list[tuple[str, str, bool, tuple[str, ...], SyncAnswer]] = [
    ("/v1/text-to-speech/{voice_id}", "tts", False, ("text",), _tts),
    ("/v1/sound-generation", "sfx", False, ("text",), _tts),
    ("/v1/speech-to-text", "stt", True, ("model_id",), _stt),
    ("/v1/voices/add", "voice-clone", True, ("name", "files"), _voice_clone),
    ("/v1/text-to-voice/design", "voice-design", False, ("voice_description",),
     _voice_design),
    ("/v1/forced-alignment", "forced-alignment", True, ("file", "text"), _alignment),
]


async def _fields(request: web.Request, multipart: bool) -> dict[str, Any] | web.Response:
    if multipart:
        form = await _form(request)
        return form if isinstance(form, web.Response) else {k: v[0] for k, v in form.items()}
    try:
        body = msgspec.json.decode(await request.read())
    except msgspec.DecodeError as exc:
        return render_error(400, f"invalid JSON body: {exc}", code="invalid_json")
    if not isinstance(body, dict):
        return render_error(422, "body must be an object")
    return body


def _sync_handler(sim: Simulator, multipart: bool, required: tuple[str, ...],
                  answer: SyncAnswer) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        fields = await _fields(request, multipart)
        if isinstance(fields, web.Response):
            return fields
        missing = [k for k in required if fields.get(k) in (None, "")]
        if missing:
            return render_error(422, "field required", param=missing[0])
        script = _script(sim, fields)
        if isinstance(script, web.Response):
            return script
        return await _run_script(script) or answer(request, fields)
    return handler


# ------------------------------------------------------------------ auth and concurrency

def _guarded(sim: Simulator, handler: Handler, inflight: list[int]) -> Handler:
    """Check ``xi-api-key``, count concurrent requests, add the concurrency headers."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        if request.headers.get("xi-api-key") != sim.api_key:
            return render_error(401, "Invalid API key", code="invalid_api_key")
        if inflight[0] >= MAX_CONCURRENT:
            return render_error(429, "Too many concurrent requests",
                                code="concurrent_limit_exceeded")
        inflight[0] += 1
        try:
            resp = await handler(request)
            resp.headers["current-concurrent-requests"] = str(inflight[0])
            resp.headers["maximum-concurrent-requests"] = str(MAX_CONCURRENT)
            return resp
        finally:
            inflight[0] -= 1
    return guarded


def routes(sim: Simulator) -> list[web.RouteDef]:
    """Every simulated ElevenLabs route (see the module docstring)."""
    inflight = [0]
    defs = _dubbing_routes(sim) + [
        web.post(path, _sync_handler(sim, multipart, required, answer), name=name)
        for path, name, multipart, required, answer in _SYNC
    ]
    return [web.route(d.method, d.path, _guarded(sim, d.handler, inflight),
                      **d.kwargs) for d in defs]
