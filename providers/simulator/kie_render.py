"""Simulated KIE, the answers' shapes: one status ``data`` renderer per family and the
callback bodies (reference §2–§8), from a task and the script phase it is in.

Phases map as: queued -> market ``waiting`` (later queued steps ``queuing``), Runway
``wait``/``queueing``, successFlag 0, Suno ``PENDING``; running -> ``generating``,
successFlag 0, Suno ``TEXT_SUCCESS`` (first running step) then ``FIRST_SUCCESS``;
succeeded/failed -> each family's terminal values. Result media are minted on first
success with KIE's 24 h TTL (or ``script.media_ttl_s``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec

from providers.simulator.core import Phase, Simulator, Task
from providers.simulator.media import fake_media

__all__ = [
    "CREATE_PATHS",
    "KIE_MEDIA_TTL_S",
    "POLL_PATHS",
    "callback_body",
    "new_task_id",
    "render",
    "suno_stage_body",
    "suno_status",
]

KIE_MEDIA_TTL_S: Final = 24 * 3600.0
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
_VIDEO_HINTS: Final = ("video", "kling", "veo", "lip", "avatar", "infinitalk", "omnihuman",
                       "seedance", "wan/")
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


def _done_at(task: Task) -> float | None:
    at = task.extra.get("completed_at")
    return float(at) if at is not None else None


def _code(task: Task, default: int | str) -> int | str:
    code = task.script.error_code
    if code is None:
        return default
    return int(code) if code.isdigit() else code


def _content_type(task: Task) -> str:
    if task.family == "suno":
        return "audio/mpeg"
    if task.family in ("veo", "luma", "runway"):
        return "video/mp4"
    model = str(task.input.get("model", "")).lower()
    is_video = task.family == "market" and any(h in model for h in _VIDEO_HINTS)
    return "video/mp4" if is_video else "image/png"


def media(sim: Simulator, task: Task) -> list[str]:
    """The task's result URLs, minted once (24 h TTL unless the script says otherwise)."""
    if not task.media_urls:
        count = max(2, task.script.media_count) if task.family == "suno" else \
            max(1, task.script.media_count)
        ttl = task.script.media_ttl_s if task.script.media_ttl_s is not None \
            else KIE_MEDIA_TTL_S
        ctype = _content_type(task)
        task.media_urls = list(task.script.result_urls) if task.script.result_urls else [
            sim.media.put(fake_media(ctype, f"{task.id}/{i}"), ctype, ttl, script=task.script)
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


# -- status data per family -----------------------------------------------------------------


def _market_state(phase: Phase) -> str:
    if phase.name == "queued":
        return "waiting" if phase.step_index == 0 else "queuing"
    return {"succeeded": "success", "failed": "fail"}.get(phase.name, "generating")


def _market(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    inner = {k: v for k, v in task.input.items() if k != "input"}
    param = _enc({**inner, "input": _enc(task.input.get("input", {}))})
    done = _done_at(task)
    data: dict[str, Any] = {
        "taskId": task.id, "model": task.input.get("model"), "state": _market_state(phase),
        "param": param, "resultJson": "", "failCode": None, "failMsg": None,
        "costTime": None if done is None else round(done - task.created_at),
        "completeTime": _ms(done), "createTime": _ms(task.created_at),
        "updateTime": _ms(done or sim.clock.now()),
    }
    if phase.progress is not None and not phase.terminal:
        data["progress"] = phase.progress
    if _ok(phase):
        data["resultJson"] = _enc({"resultUrls": media(sim, task)})
        data["creditsConsumed"] = 18
    elif _failed(phase):
        data["failCode"], data["failMsg"] = str(_code(task, 500)), task.script.error
    return data


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
        origin = _extra_media(sim, task, "origin", "image/png", 600)  # lives 10 min
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


def _runway_state(phase: Phase) -> str:
    if phase.name == "queued":
        return "wait" if phase.step_index == 0 else "queueing"
    return {"succeeded": "success", "failed": "fail"}.get(phase.name, "generating")


def _runway_video(sim: Simulator, task: Task) -> dict[str, Any]:
    url = media(sim, task)[0]
    cover = _extra_media(sim, task, "cover", "image/png", KIE_MEDIA_TTL_S)
    return {"videoId": uuid.uuid5(uuid.NAMESPACE_URL, task.id).hex, "taskId": task.id,
            "videoUrl": url, "imageUrl": cover}


def _runway(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    info = _runway_video(sim, task) if _ok(phase) else None
    expired = bool(task.media_urls) and sim.media.is_expired(task.media_urls[0])
    return {"taskId": task.id, "parentTaskId": "",
            "generateParam": {"prompt": task.input.get("prompt", ""),
                              "imageUrl": task.input.get("imageUrl", ""),
                              "expandPrompt": True},
            "state": _runway_state(phase), "generateTime": _ymd(task.created_at),
            "videoInfo": info, "failCode": _code(task, 400) if _failed(phase) else "",
            "failMsg": task.script.error if _failed(phase) else "",
            "expireFlag": 1 if expired else 0}


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


def _suno_tracks(sim: Simulator, task: Task, status: str, *, snake: bool) -> list[dict[str, Any]]:
    ready = {"SUCCESS": 99, "CALLBACK_EXCEPTION": 99, "FIRST_SUCCESS": 1}.get(status, 0)
    urls = media(sim, task) if ready else ["", ""]
    tracks = []
    for i, url in enumerate(urls):
        audio = url if i < ready else ""
        track = {"id": f"{task.id[:24]}{i:08x}", "audioUrl": audio, "streamAudioUrl": audio,
                 "imageUrl": "", "prompt": str(task.input.get("prompt", "")),
                 "modelName": "chirp-v3-5", "title": str(task.input.get("title", "Untitled")),
                 "tags": str(task.input.get("style", "")),
                 "createTime": _ymd(task.created_at), "duration": 198.44}
        tracks.append({_snake(k): v for k, v in track.items()} if snake else track)
    return tracks


def _snake(key: str) -> str:
    if key == "createTime":
        return key  # the documented callback keeps this one camelCase
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def _suno(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    status = suno_status(task, phase)
    failed = _failed(phase)
    tracks = None if failed or status == "PENDING" else \
        _suno_tracks(sim, task, status, snake=False)
    numeric = (task.script.error_code or "").isdigit()
    return {"taskId": task.id, "parentMusicId": "", "param": _enc(task.input),
            "response": None if tracks is None else {"taskId": task.id, "sunoData": tracks},
            "status": status, "type": "GENERATE", "operationType": "generate",
            "errorCode": _code(task, 500) if failed and numeric else None,
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
    "veo": "Veo3 video generated successfully.", "kontext": "Image generated successfully.",
    "luma": "Modify record generated successfully.", "runway": "All generated successfully.",
    "market": "success",
}


def _callback_data(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    if task.family == "market":
        return render(sim, task, phase)
    ok = _ok(phase)
    if task.family == "runway":
        info = _runway_video(sim, task) if ok else {}
        return {"task_id": task.id, "video_id": info.get("videoId", ""),
                "video_url": info.get("videoUrl", ""), "image_url": info.get("imageUrl", "")}
    if task.family == "luma":
        return {"taskId": task.id, "promptJson": _enc(task.input),
                "resultUrls": media(sim, task) if ok else []}
    if task.family == "kontext":
        info = _flag_response(sim, task) if ok else {"originImageUrl": "", "resultImageUrl": ""}
        return {"taskId": task.id, "info": info}
    info = {"resultUrls": media(sim, task), "originUrls": [], "resolution": "1080p"}
    return {"taskId": task.id, "info": info if ok else None, "fallbackFlag": False}


def callback_body(sim: Simulator, task: Task, phase: Phase) -> dict[str, Any]:
    """The terminal callback of a non-Suno task (§2–§8 shapes)."""
    ok = _ok(phase)
    fail_code = {"luma": 500, "runway": 400}.get(task.family, 501)
    code = 200 if ok else _code(task, fail_code)
    code = code if isinstance(code, int) else fail_code
    msg = _CALLBACK_MSG[task.family] if ok else task.script.error
    return {"code": code, "msg": msg, "data": _callback_data(sim, task, phase)}


def suno_stage_body(sim: Simulator, task: Task, phase: Phase, stage: str) -> dict[str, Any]:
    """A Suno callback of ``stage`` (text, first, complete, error), snake_case tracks."""
    if stage == "error":
        return {"code": 501, "msg": task.script.error,
                "data": {"callbackType": "error", "task_id": task.id, "data": None}}
    status = {"text": "TEXT_SUCCESS", "first": "FIRST_SUCCESS"}.get(stage, "SUCCESS")
    msg = "All generated successfully." if stage == "complete" else f"{stage} generated."
    return {"code": 200, "msg": msg,
            "data": {"callbackType": stage, "task_id": task.id,
                     "data": _suno_tracks(sim, task, status, snake=True)}}
