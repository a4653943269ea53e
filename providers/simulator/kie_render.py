"""Simulated KIE, the answers' shapes: one status ``data`` renderer per family and the
callback bodies, from a task and the script phase it is in.

Every shape follows ``tests/fixtures/providers/kie/*.json`` (sources and evidence in each
fixture and in the research notes, ``/work/notes/kie.md``):

- Market ``jobs/recordInfo`` ``data`` has exactly the ten keys of 595 live answers
  (apicity HARs [O]): taskId, model, state, param, resultJson, failCode, failMsg, costTime,
  completeTime, createTime. ``resultJson`` is ``""`` until success, ``param`` is
  ``{"input": "<JSON string>", "model": ...}`` (input double-encoded), ``costTime`` whole
  seconds. No ``updateTime`` and no cost field (live recordInfo never carries one);
  ``progress`` only for the sora2 models, the only ones it is documented for [C].
- Market callbacks carry ``consumeCredits``/``remainedCredits`` and ``updateTime``, msg
  "Playground task completed successfully." / "Playground task failed." [3P: a KIE
  reference and two consumers' handlers]; the failure has no param/resultJson/costTime.
- Veo, Kontext, Luma (``successFlag``), Runway (``state``, ``expireFlag``) and Suno
  (``status``) record-info and callbacks as their doc pages show them [C, docs.kie.ai and
  the Henji-AI mirror]; Suno's callback stages are ``text`` (``data.data: []``), ``first``,
  ``complete`` and ``error`` (``data.data: null``); its failed poll keeps a ``response``
  ``{taskId, sunoData: [], errorMessage}``.

Phases map as: queued -> market ``waiting`` (later queued steps ``queuing``), Runway
``wait``/``queueing``, successFlag 0, Suno ``PENDING``; running -> ``generating``,
successFlag 0, Suno ``TEXT_SUCCESS`` (first running step) then ``FIRST_SUCCESS``;
succeeded/failed -> each family's terminal values. Result media are minted on first
success and kept 14 days, KIE's documented retention (Getting Started, Suno, Kontext and
Runway pages [C]; the recordInfo page's "typically 24 hours" is the outlier), or
``script.media_ttl_s``; Kontext's origin image lives 10 minutes [C].
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec

from callwarden.providers.simulator.core import Phase, Simulator, Task
from callwarden.providers.simulator.media import fake_media

__all__ = [
    "ACCOUNT_CREDITS",
    "CREATE_PATHS",
    "KIE_MEDIA_TTL_S",
    "KONTEXT_ORIGIN_TTL_S",
    "POLL_PATHS",
    "SUNO_STAGES",
    "callback_body",
    "new_task_id",
    "render",
    "suno_stage_body",
    "suno_stages_reached",
]

KIE_MEDIA_TTL_S: Final = 14 * 24 * 3600.0
KONTEXT_ORIGIN_TTL_S: Final = 600.0
ACCOUNT_CREDITS: Final = 5916.25  # the recorded GET /api/v1/chat/credit balance [O]
DEFAULT_TASK_CREDITS: Final = 18  # consumeCredits of a market callback, unless scripted
CREATE_PATHS: Final[dict[str, str]] = {
    "market": "/api/v1/jobs/createTask",
    "veo": "/api/v1/veo/generate",
    "suno": "/api/v1/generate",
    "kontext": "/api/v1/flux/kontext/generate",
    "luma": "/api/v1/modify/generate",
    "runway": "/api/v1/runway/generate",
}
POLL_PATHS: Final[dict[str, str]] = {
    "market": "/api/v1/jobs/recordInfo",
    "veo": "/api/v1/veo/record-info",
    "suno": "/api/v1/generate/record-info",
    "kontext": "/api/v1/flux/kontext/record-info",
    "luma": "/api/v1/modify/record-info",
    "runway": "/api/v1/runway/record-detail",
}
SUNO_STAGES: Final = ("text", "first", "complete")
_VIDEO_HINTS: Final = ("video", "kling", "veo", "lip", "avatar", "infinitalk", "omnihuman",
                       "seedance", "wan/", "sora")
_PROGRESS_MODELS: Final = ("sora-2", "sora2")
_SUNO_FAILURES: Final = frozenset({"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED",
                                   "SENSITIVE_WORD_ERROR", "CALLBACK_EXCEPTION"})


def new_task_id(sim: Simulator, family: str) -> str:
    """KIE ids: 32 lowercase hex (Runway: a UUID)."""
    bits = sim.rng.getrandbits(128)
    return str(uuid.UUID(int=bits, version=4)) if family == "runway" else f"{bits:032x}"


# -- helpers --------------------------------------------------------------------------------


def _enc(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


def _ymd(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _uuid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(parts)))


def _done_at(task: Task) -> float | None:
    at = task.extra.get("completed_at")
    return float(at) if at is not None else None


def _code(task: Task, default: int | str) -> int | str:
    code = task.script.error_code
    if code is None:
        return default
    return int(code) if code.isdigit() else code


def _status_code(task: Task, default: int) -> int:
    """An envelope ``code`` for a failure: the script's numeric code when it is one
    (>= 400), else the family's documented default."""
    code = task.script.error_code
    return int(code) if code and code.isdigit() and int(code) >= 400 else default


def _ttl(task: Task) -> float:
    return task.script.media_ttl_s if task.script.media_ttl_s is not None else KIE_MEDIA_TTL_S


def _content_type(task: Task) -> str:
    if task.family == "suno":
        return "audio/mpeg"
    if task.family in ("veo", "luma", "runway"):
        return "video/mp4"
    model = str(task.input.get("model", "")).lower()
    is_video = task.family == "market" and any(h in model for h in _VIDEO_HINTS)
    return "video/mp4" if is_video else "image/png"


def media(sim: Simulator, task: Task) -> list[str]:
    """The task's result URLs, minted once (14 days unless the script says otherwise)."""
    if not task.media_urls:
        count = max(2, task.script.media_count) if task.family == "suno" else \
            max(1, task.script.media_count)
        ctype = _content_type(task)
        task.media_urls = list(task.script.result_urls) if task.script.result_urls else [
            sim.media.put(fake_media(ctype, f"{task.id}/{i}"), ctype, _ttl(task),
                          script=task.script)
            for i in range(count)]
    return task.media_urls


def _extra_media(sim: Simulator, task: Task, key: str, ctype: str, ttl: float) -> str:
    """A secondary file of the task (cover, origin image), minted once."""
    if key not in task.extra:
        task.extra[key] = sim.media.put(fake_media(ctype, f"{task.id}/{key}"), ctype, ttl)
    return str(task.extra[key])


def _ok(phase: Phase) -> bool:
    return phase.name == "succeeded"


def _failed(phase: Phase) -> bool:
    return phase.name == "failed"


# -- market ---------------------------------------------------------------------------------


def _market_state(phase: Phase) -> str:
    if phase.name == "queued":
        return "waiting" if phase.step_index == 0 else "queuing"
    return {"succeeded": "success", "failed": "fail"}.get(phase.name, "generating")


def _market_param(task: Task) -> str:
    """``param`` as live: only ``input`` (itself a JSON string) and ``model``."""
    return _enc({"input": _enc(task.input.get("input", {})), "model": task.input.get("model")})


def _market_result(sim: Simulator, task: Task) -> str:
    """``resultJson`` on success: ``resultUrls`` [O], or ``resultObject`` for a text model
    (a script ``output``) [C]."""
    if task.script.output is not None:
        return _enc({"resultObject": task.script.output})
    return _enc({"resultUrls": media(sim, task)})


def _cost_time(sim: Simulator, task: Task) -> int:
    done = _done_at(task)
    return round((sim.clock.now() if done is None else done) - task.created_at)


def _reports_progress(task: Task) -> bool:
    model = str(task.input.get("model", "")).lower()
    return any(m in model for m in _PROGRESS_MODELS)


def _market(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    ok, failed = _ok(phase), _failed(phase)
    data: dict[str, Any] = {
        "taskId": task.id, "model": task.input.get("model"), "state": _market_state(phase),
        "param": _market_param(task),
        "resultJson": _market_result(sim, task) if ok else "",
        "failCode": str(_code(task, 500)) if failed else None,
        "failMsg": task.script.error if failed else None,
        "costTime": _cost_time(sim, task) if ok else None,
        "completeTime": _ms(_done_at(task)), "createTime": _ms(task.created_at),
    }
    if _reports_progress(task) and phase.progress is not None and not phase.terminal:
        data["progress"] = phase.progress
    return data


def _credits(task: Task) -> int | float:
    cost = task.script.cost
    if cost is None:
        return DEFAULT_TASK_CREDITS
    return int(cost) if float(cost).is_integer() else cost


_CALLBACK_SUCCESS_KEYS: Final = ("taskId", "model", "state", "param", "resultJson", "costTime",
                                  "completeTime", "createTime")
_CALLBACK_FAIL_KEYS: Final = ("taskId", "model", "state", "failCode", "failMsg", "completeTime")


def _market_callback(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    """The 3P-documented market callback: success adds cost and balance, failure is short."""
    data = _market(sim, task, phase)
    if _ok(phase):
        return {"code": 200, "msg": "Playground task completed successfully.",
                "data": {**{k: data[k] for k in _CALLBACK_SUCCESS_KEYS},
                         "updateTime": data["completeTime"], "consumeCredits": _credits(task),
                         "remainedCredits": int(ACCOUNT_CREDITS)}}
    return {"code": 501, "msg": "Playground task failed.",
            "data": {**{k: data[k] for k in _CALLBACK_FAIL_KEYS}, "consumeCredits": 0}}


# -- successFlag families (Veo, Kontext, Luma) ----------------------------------------------


def _flag(task: Task, phase: Phase) -> int:
    if _ok(phase):
        return 4 if task.family == "luma" and task.script.error_code == "4" else 1
    if _failed(phase):
        return 2 if task.script.error_code == "2" else 3
    return 0


def _flag_error(task: Task, phase: Phase) -> tuple[int | str | None, str | None]:
    if not _failed(phase):
        return None, ("" if task.family != "luma" else None)
    code = task.script.error_code
    return (None if code in (None, "2", "3") else _code(task, 500)), task.script.error


def _flag_response(sim: Simulator, task: Task) -> dict[str, Any]:
    urls = media(sim, task)
    if task.family == "kontext":
        origin = _extra_media(sim, task, "origin", "image/png", KONTEXT_ORIGIN_TTL_S)
        return {"originImageUrl": origin, "resultImageUrl": urls[0]}
    if task.family == "luma":
        return {"taskId": task.id, "originUrls": [task.input.get("videoUrl")],
                "resultUrls": urls}
    return {"taskId": task.id, "resultUrls": urls, "originUrls": [], "resolution": "1080p"}


def _flagged(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    """Veo, Kontext and Luma: ``successFlag`` and family-specific time formats."""
    fmt: Callable[[float | None], Any] = {"veo": _ymd, "kontext": _iso}.get(task.family, _ms)
    code, message = _flag_error(task, phase)
    flag = _flag(task, phase)
    data = {"taskId": task.id, "paramJson": _enc(task.input),
            "completeTime": fmt(_done_at(task)), "createTime": fmt(task.created_at),
            "response": _flag_response(sim, task) if flag in (1, 4) else None,
            "successFlag": flag, "errorCode": code, "errorMessage": message}
    if task.family == "veo":
        data["fallbackFlag"] = False
    return data


# -- Runway ---------------------------------------------------------------------------------


def _runway_state(phase: Phase) -> str:
    if phase.name == "queued":
        return "wait" if phase.step_index == 0 else "queueing"
    return {"succeeded": "success", "failed": "fail"}.get(phase.name, "generating")


def _runway_video(sim: Simulator, task: Task) -> dict[str, Any]:
    url = media(sim, task)[0]
    cover = _extra_media(sim, task, "cover", "image/png", _ttl(task))
    return {"videoId": _uuid(task.id, "video"), "taskId": task.id, "videoUrl": url,
            "imageUrl": cover}


def _expired(sim: Simulator, task: Task) -> bool:
    """Runway sets ``expireFlag`` once the video's 14 days are over [C]."""
    done = _done_at(task)
    return done is not None and sim.clock.now() >= done + _ttl(task)


def _runway(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    ok, failed = _ok(phase), _failed(phase)
    return {"taskId": task.id, "parentTaskId": "",
            "generateParam": {"prompt": task.input.get("prompt", ""),
                              "imageUrl": task.input.get("imageUrl", ""),
                              "expandPrompt": True},
            "state": _runway_state(phase), "generateTime": _ymd(task.created_at),
            "videoInfo": _runway_video(sim, task) if ok else None,
            "failCode": _code(task, 400) if failed else "",
            "failMsg": task.script.error if failed else "",
            "expireFlag": 1 if ok and _expired(sim, task) else 0}


# -- Suno -----------------------------------------------------------------------------------


def suno_status(task: Task, phase: Phase) -> str:
    """The Suno ``status`` a phase shows."""
    code = task.script.error_code
    if _ok(phase):
        return "CALLBACK_EXCEPTION" if code == "CALLBACK_EXCEPTION" else "SUCCESS"
    if _failed(phase):
        return code if code in _SUNO_FAILURES else "GENERATE_AUDIO_FAILED"
    if phase.name == "queued":
        return "PENDING"
    first_running = next((i for i, s in enumerate(task.script.steps) if s.phase == "running"),
                         phase.step_index)
    return "TEXT_SUCCESS" if phase.step_index <= first_running else "FIRST_SUCCESS"


def suno_stages_reached(task: Task, phase: Phase) -> tuple[str, ...]:
    """The success callback stages a Suno task has reached, in order (none on failure)."""
    if _failed(phase):
        return ()
    if _ok(phase):
        return SUNO_STAGES
    reached = {"TEXT_SUCCESS": 1, "FIRST_SUCCESS": 2}.get(suno_status(task, phase), 0)
    return SUNO_STAGES[:reached]


def _snake(key: str) -> str:
    if key == "createTime":
        return key  # the documented callback keeps this one camelCase
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def _suno_track(sim: Simulator, task: Task, i: int, url: str) -> dict[str, Any]:
    cover = _extra_media(sim, task, f"cover{i}", "image/png", _ttl(task)) if url else ""
    return {"id": _uuid(task.id, "track", str(i)), "audioUrl": url, "streamAudioUrl": url,
            "imageUrl": cover, "prompt": str(task.input.get("prompt", "")),
            "modelName": "chirp-v3-5", "title": str(task.input.get("title", "Untitled")),
            "tags": str(task.input.get("style", "")), "createTime": _ymd(task.created_at),
            "duration": 198.44}


def _suno_tracks(sim: Simulator, task: Task, status: str, *, snake: bool) -> list[dict[str, Any]]:
    ready = {"SUCCESS": 99, "CALLBACK_EXCEPTION": 99, "FIRST_SUCCESS": 1}.get(status, 0)
    urls = media(sim, task) if ready else ["", ""]
    tracks = [_suno_track(sim, task, i, url if i < ready else "") for i, url in enumerate(urls)]
    return [{_snake(k): v for k, v in t.items()} for t in tracks] if snake else tracks


def _suno_error_code(task: Task) -> int | None:
    """``errorCode`` of a failed Suno task: the script's number, the documented 501 by
    default, none for a status variant (``SENSITIVE_WORD_ERROR``, ...)."""
    code = task.script.error_code
    if code is None:
        return 501
    return int(code) if code.isdigit() else None


def _suno_response(sim: Simulator, task: Task, phase: Phase, status: str
                   ) -> dict[str, Any] | None:
    if _failed(phase):
        return {"taskId": task.id, "sunoData": [], "errorMessage": task.script.error}
    if status == "PENDING":
        return None
    return {"taskId": task.id, "sunoData": _suno_tracks(sim, task, status, snake=False)}


def _suno(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    status = suno_status(task, phase)
    failed = _failed(phase)
    return {"taskId": task.id, "parentMusicId": "", "param": _enc(task.input),
            "response": _suno_response(sim, task, phase, status), "status": status,
            "type": "GENERATE", "errorCode": _suno_error_code(task) if failed else None,
            "errorMessage": task.script.error if failed else None}


_RENDERERS: Final[dict[str, Callable[[Simulator, Task, Phase], dict[str, Any]]]] = {
    "market": _market, "veo": _flagged, "kontext": _flagged, "luma": _flagged,
    "runway": _runway, "suno": _suno,
}


def render(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    """The status ``data`` object of ``task`` in ``phase``."""
    return _RENDERERS[task.family](sim, task, phase)


# -- callbacks ------------------------------------------------------------------------------

_CALLBACK_MSG: Final = {
    "veo": "Veo3.1 video generated successfully.",
    "kontext": "BFL image generated successfully.",
    "luma": "Modify record generated successfully.",
    "runway": "All generated successfully.",
}
_CALLBACK_FAIL_CODE: Final = {"veo": 501, "kontext": 501, "luma": 500, "runway": 400}
_SUNO_MSG: Final = {"text": "Text generation completed successfully.",
                    "first": "First track generated successfully.",
                    "complete": "All generated successfully."}


def _runway_callback(sim: Simulator, task: Task, ok: bool) -> dict[str, Any]:
    info = _runway_video(sim, task) if ok else {}
    return {"task_id": task.id, "video_id": info.get("videoId", ""),
            "video_url": info.get("videoUrl", ""), "image_url": info.get("imageUrl", "")}


def _veo_callback(sim: Simulator, task: Task, ok: bool) -> dict[str, Any]:
    if not ok:
        return {"taskId": task.id, "fallbackFlag": False}  # no info key on failure [C]
    info = {"resultUrls": media(sim, task), "originUrls": [], "resolution": "1080p"}
    return {"taskId": task.id, "promptJson": _enc(task.input), "info": info,
            "fallbackFlag": False}


def _callback_data(sim: Simulator, task: Task, ok: bool) -> dict[str, Any]:
    if task.family == "runway":
        return _runway_callback(sim, task, ok)
    if task.family == "luma":
        return {"taskId": task.id, "promptJson": _enc(task.input),
                "resultUrls": media(sim, task) if ok else []}
    if task.family == "kontext":
        info = _flag_response(sim, task) if ok else {"originImageUrl": "", "resultImageUrl": ""}
        return {"taskId": task.id, "info": info}
    return _veo_callback(sim, task, ok)


def callback_body(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    """The terminal callback of a non-Suno task, in its family's documented shape."""
    if task.family == "market":
        return _market_callback(sim, task, phase)
    ok = _ok(phase)
    code = 200 if ok else _status_code(task, _CALLBACK_FAIL_CODE[task.family])
    msg = _CALLBACK_MSG[task.family] if ok else task.script.error
    return {"code": code, "msg": msg, "data": _callback_data(sim, task, ok)}


def suno_stage_body(sim: Simulator, task: Task, stage: str) -> dict[str, Any]:
    """A Suno callback of ``stage`` (text, first, complete, error), snake_case tracks:
    none at ``text`` (``[]``), ``null`` on ``error`` [C]."""
    if stage == "error":
        return {"code": _status_code(task, 501), "msg": task.script.error,
                "data": {"callbackType": "error", "task_id": task.id, "data": None}}
    status = {"text": "", "first": "FIRST_SUCCESS"}.get(stage, "SUCCESS")
    tracks = _suno_tracks(sim, task, status, snake=True) if status else []
    return {"code": 200, "msg": _SUNO_MSG[stage],
            "data": {"callbackType": stage, "task_id": task.id, "data": tracks}}
