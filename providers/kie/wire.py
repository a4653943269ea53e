"""KIE.ai, sans-I/O: request builders, response parsers and error classification.

Every ``/api/v1`` answer is an envelope ``{"code", "msg", "data"}`` that usually arrives with
HTTP 200 even for errors, so the in-body ``code`` is always read (reference §1, §14):

- 200 ok · 401 :class:`AuthenticationError` · 402, 433 :class:`InsufficientCredits`
- 404 :class:`TaskNotFound` (a poll answers :class:`NotFound`)
- 422 :class:`BadRequest`; ``"recordInfo is null"`` on a poll is :class:`NotFound` (the
  client adds a grace window)
- 429 in body or HTTP: :class:`RateLimited` (``Retry-After`` when sent)
- 455, 500, HTTP 5xx: :class:`TransientError` (the transport bounds the retries)
- 501 :class:`BadRequest` on create, :class:`Failed` on a poll; 505 and others :class:`BadRequest`
- HTTP 403 ``error code: 1010``: :class:`AuthenticationError` (Cloudflare refused our
  ``User-Agent``)

The per-family status vocabularies (market ``state``, Runway ``state``, ``successFlag`` for
Veo/Kontext/Luma, Suno ``status``) are mapped onto :mod:`callwarden.providers.outcomes`; anything
undocumented raises :class:`MalformedResponse` with the provider's message kept. Request
builders, the ``kie-llm`` parser and the clients live in :mod:`callwarden.providers.kie`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    ProviderError,
    RateLimited,
    TaskNotFound,
    TransientError,
)
from callwarden.providers.outcomes import (
    Failed,
    NotFound,
    PollOutcome,
    Running,
    Succeeded,
    Usage,
    finite,
)
from callwarden.providers.raw import JSONTooDeep, RawResponse, decode_json

__all__ = [
    "FAMILIES",
    "PROVIDER",
    "classify_kie",
    "classify_kie_poll",
    "decode_envelope",
    "error_for_code",
    "http_error",
    "is_record_missing",
    "parse_poll",
    "parse_poll_data",
    "parse_task_id",
]

PROVIDER: Final = "kie"

_MISSING_RECORD_PHRASES: Final = ("recordinfo is null", "record does not exist")


# -- errors ---------------------------------------------------------------------------------


def error_for_code(code: int, msg: str, *, retry_after: float | None = None) -> ProviderError:
    """The typed error for a non-200 envelope ``code`` (or HTTP status); ``msg`` is kept."""
    message = msg or f"KIE error code {code}"
    kw: dict[str, Any] = {"provider": PROVIDER, "status": code}
    if code == 401:
        return AuthenticationError(message, **kw)
    if code in (402, 433):
        return InsufficientCredits(message, **kw)
    if code == 404:
        return TaskNotFound(message, **kw)
    if code == 429:
        return RateLimited(message, retry_after=retry_after, **kw)
    if code in (501, 505):
        return BadRequest(message, **kw)
    if code == 455 or code >= 500:
        return TransientError(message, **kw)
    return BadRequest(message, **kw)


def _http_message(raw: RawResponse) -> str:
    try:
        body = decode_json(raw.body)
    except (msgspec.DecodeError, JSONTooDeep):
        return raw.body[:200].decode("utf-8", "replace").strip()
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        for key in ("msg", "message", "detail"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return raw.body[:200].decode("utf-8", "replace")


def http_error(raw: RawResponse) -> ProviderError:
    """The typed error for a non-2xx HTTP answer."""
    text = _http_message(raw)
    if raw.status == 403 and "1010" in text:
        return AuthenticationError(
            f"Cloudflare refused the request ({text}): KIE needs a browser-like User-Agent "
            "header", provider=PROVIDER, status=403)
    if raw.status == 403:
        return AuthenticationError(text or "forbidden", provider=PROVIDER, status=403)
    if raw.status == 404:
        return BadRequest(text or "no such endpoint", provider=PROVIDER, status=404)
    retry_after = raw.retry_after()
    return error_for_code(raw.status, text, retry_after=retry_after)


def _envelope_code(raw: RawResponse) -> tuple[int, str] | ProviderError | None:
    try:
        body = raw.json(PROVIDER)
    except MalformedResponse as err:
        return err
    if not isinstance(body, dict):
        return None
    code = body.get("code")
    if not isinstance(code, int) or isinstance(code, bool) or code == 200:
        return None
    return code, _msg(body)


def _classify(raw: RawResponse, *, poll: bool) -> ProviderError | None:
    if not 200 <= raw.status < 300:
        return http_error(raw)
    found = _envelope_code(raw)
    if found is None or isinstance(found, ProviderError):
        return found
    code, msg = found
    if poll and (code in (404, 501) or is_record_missing(code, msg)):
        return None  # a poll answer: parse_poll turns it into an outcome
    return error_for_code(code, msg, retry_after=raw.retry_after())


def classify_kie(raw: RawResponse) -> ProviderError | None:
    """Transport classifier for creates and ``kie-llm`` calls."""
    return _classify(raw, poll=False)


def classify_kie_poll(raw: RawResponse) -> ProviderError | None:
    """Transport classifier for polls: lets not-found and 501 answers through to
    :func:`parse_poll`."""
    return _classify(raw, poll=True)


def is_record_missing(code: int, msg: str) -> bool:
    """KIE's "no such task" answer: ``code 422`` + ``"recordInfo is null"``."""
    return code == 422 and any(p in msg.lower() for p in _MISSING_RECORD_PHRASES)


# -- envelope and parsers -------------------------------------------------------------------


def _msg(body: Mapping[str, Any]) -> str:
    msg = body.get("msg", body.get("message"))
    return msg if isinstance(msg, str) else ""


def decode_envelope(raw: RawResponse) -> tuple[int, str, Any]:
    """``(code, msg, data)`` of a KIE envelope; :class:`MalformedResponse` otherwise."""
    if not 200 <= raw.status < 300:
        raise http_error(raw)
    body = raw.json(PROVIDER)
    code = body.get("code") if isinstance(body, dict) else None
    if not isinstance(code, int) or isinstance(code, bool):
        raise MalformedResponse(f"KIE answer is not a {{code, msg, data}} envelope: "
                                f"{raw.body[:200]!r}", provider=PROVIDER, status=raw.status)
    return code, _msg(body), body.get("data")


def _raise_for(raw: RawResponse, code: int, msg: str) -> None:
    if code != 200:
        retry_after = raw.retry_after()
        raise error_for_code(code, msg, retry_after=retry_after)


def parse_task_id(raw: RawResponse) -> str:
    """The ``data.taskId`` of a create answer (any family)."""
    code, msg, data = decode_envelope(raw)
    _raise_for(raw, code, msg)
    task_id = data.get("taskId") if isinstance(data, dict) else None
    if not isinstance(task_id, str) or not task_id:
        raise MalformedResponse(f"create answer without data.taskId (msg {msg!r})",
                                provider=PROVIDER, status=code)
    return task_id


def parse_poll(family: str, raw: RawResponse) -> PollOutcome:
    """The outcome of one status answer of ``family``.

    Not-found answers (``422 recordInfo is null``, in-body 404, ``data: null``) are
    :class:`NotFound`; in-body 501 is :class:`Failed`."""
    code, msg, data = decode_envelope(raw)
    if code == 404 or is_record_missing(code, msg) or (code == 200 and data is None):
        return NotFound(message=msg or "task data is null")
    if code == 501:
        return Failed(error=msg or "generation failed", code="501")
    _raise_for(raw, code, msg)
    if not isinstance(data, dict):
        raise MalformedResponse(f"status answer data is not an object (msg {msg!r})",
                                provider=PROVIDER)
    return parse_poll_data(family, data)


def parse_poll_data(family: str, data: dict[str, Any]) -> PollOutcome:
    """The outcome of a status ``data`` object (also the shape of most callbacks). KIE
    echoes the create body in ``param`` (a JSON string, or an object), its ``callBackUrl``
    with the job's secret callback token included: it is dropped before the answer is kept
    as the outcome's ``raw`` (which the call's log and the host's row record)."""
    parser = _PARSERS.get(family)
    if parser is None:
        raise ValueError(f"unknown KIE family {family!r}")
    return parser(_without_callback_url(data))


def _without_callback_url(data: dict[str, Any]) -> dict[str, Any]:
    param = data.get("param")
    if isinstance(param, dict) and "callBackUrl" in param:
        return {**data, "param": {k: v for k, v in param.items() if k != "callBackUrl"}}
    if isinstance(param, str) and "callBackUrl" in param:
        try:
            echoed = decode_json(param.encode())
        except (msgspec.DecodeError, JSONTooDeep):
            return {**data, "param": None}  # unreadable, and it names the URL: not kept
        if isinstance(echoed, dict):
            echoed.pop("callBackUrl", None)
            return {**data, "param": msgspec.json.encode(echoed).decode()}
        return {**data, "param": None}
    return data


def _malformed(message: str) -> MalformedResponse:
    return MalformedResponse(message, provider=PROVIDER)


def _unknown(field: str, value: object) -> MalformedResponse:
    return _malformed(f"unknown KIE {field} {value!r}")


def _urls(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(u, str) and u for u in value):
        return ()
    return tuple(value)


def _code(value: object) -> str | None:
    return None if value in (None, "") else str(value)


def _failed(data: dict[str, Any], msg_key: str, code_key: str, default: str) -> Failed:
    message = data.get(msg_key)
    error = message if isinstance(message, str) and message else default
    return Failed(error=error, code=_code(data.get(code_key)), raw=data)


def _decode_result_json(value: object) -> dict[str, Any]:
    if not isinstance(value, str) or not value:
        raise _malformed("market task succeeded without a resultJson")
    try:
        result = decode_json(value.encode())
    except (msgspec.DecodeError, JSONTooDeep) as exc:
        raise _malformed(f"market resultJson is not JSON ({exc}): {value[:200]!r}") from exc
    if not isinstance(result, dict):
        raise _malformed(f"market resultJson is not an object: {value[:200]!r}")
    return result


def _usage(data: dict[str, Any]) -> Usage:
    model = data.get("model")
    return {"model": model} if isinstance(model, str) and model else {}


def _market_success(data: dict[str, Any]) -> Succeeded:
    # No cost: live recordInfo answers carry no cost field at all (595 recorded answers,
    # docs/providers.md); the cost KIE puts in a market callback (consumeCredits) is in an
    # unsigned body, which is never trusted.
    result = _decode_result_json(data.get("resultJson"))
    urls = _urls(result.get("resultUrls"))
    if urls:
        return Succeeded(media_urls=urls, raw=data, usage=_usage(data))
    if result.get("resultObject") is not None:
        text = msgspec.json.encode(result["resultObject"]).decode()
        return Succeeded(text=text, raw=data, usage=_usage(data))
    raise _malformed("market task succeeded without resultUrls or resultObject")


def _market(data: dict[str, Any]) -> PollOutcome:
    state = data.get("state")
    if state in ("waiting", "queuing", "generating"):
        return Running(raw_state=state, progress=finite(data.get("progress")))
    if state == "success":
        return _market_success(data)
    if state == "fail":
        return _failed(data, "failMsg", "failCode", "generation failed")
    raise _unknown("market state", state)


def _runway(data: dict[str, Any]) -> PollOutcome:
    state = data.get("state")
    if state in ("wait", "queueing", "generating"):
        return Running(raw_state=state)
    if state == "success":
        if data.get("expireFlag") == 1:  # the video is gone (kept 14 days): fail, refund
            return Failed(error="runway result expired (expireFlag 1)", code="result_gone",
                          raw=data)
        info = data.get("videoInfo")
        url = info.get("videoUrl") if isinstance(info, dict) else None
        if not isinstance(url, str) or not url:
            raise _malformed("runway task succeeded without videoInfo.videoUrl")
        return Succeeded(media_urls=(url,), raw=data)
    if state == "fail":
        return _failed(data, "failMsg", "failCode", "generation failed")
    raise _unknown("runway state", state)


def _result_urls(response: dict[str, Any]) -> tuple[str, ...]:
    return _urls(response.get("resultUrls"))


def _result_image(response: dict[str, Any]) -> tuple[str, ...]:
    url = response.get("resultImageUrl")
    return (url,) if isinstance(url, str) and url else ()


def _flag_parser(
    name: str, ok: frozenset[int], extract: Callable[[dict[str, Any]], tuple[str, ...]],
) -> Callable[[dict[str, Any]], PollOutcome]:
    """A parser for the ``successFlag`` families: 0 running, ``ok`` success, 2/3 failed."""

    def parse(data: dict[str, Any]) -> PollOutcome:
        flag = data.get("successFlag")
        if isinstance(flag, bool) or not isinstance(flag, int):
            raise _unknown(f"{name} successFlag", flag)
        if flag == 0:
            return Running(raw_state="successFlag=0")
        if flag in ok:
            response = data.get("response")
            urls = extract(response) if isinstance(response, dict) else ()
            if not urls:
                raise _malformed(f"{name} task succeeded (successFlag={flag}) without URLs")
            return Succeeded(media_urls=urls, raw=data)
        if flag in (2, 3):
            return _failed(data, "errorMessage", "errorCode", f"{name} failed (successFlag={flag})")
        raise _unknown(f"{name} successFlag", flag)

    return parse


_SUNO_RUNNING: Final = frozenset({"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"})
_SUNO_FAILED: Final = frozenset({"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED",
                                 "SENSITIVE_WORD_ERROR"})


def _suno_urls(data: dict[str, Any]) -> tuple[str, ...]:
    response = data.get("response")
    tracks = response.get("sunoData") if isinstance(response, dict) else None
    if not isinstance(tracks, list):
        return ()
    urls = (t.get("audioUrl") for t in tracks if isinstance(t, dict))
    return tuple(u for u in urls if isinstance(u, str) and u)


def _suno_failed(data: dict[str, Any], status: str) -> Failed:
    failed = _failed(data, "errorMessage", "errorCode", f"suno task ended {status}")
    return Failed(error=failed.error, code=failed.code or status, raw=data)


def _suno(data: dict[str, Any]) -> PollOutcome:
    status = data.get("status")
    if not isinstance(status, str):
        raise MalformedResponse(f"suno status is not a string: {status!r}",
                                provider=PROVIDER)
    if status in _SUNO_RUNNING:
        return Running(raw_state=status)
    if status in ("SUCCESS", "CALLBACK_EXCEPTION"):
        urls = _suno_urls(data)
        if urls:
            return Succeeded(media_urls=urls, raw=data)
        if status == "SUCCESS":
            raise _malformed("suno task SUCCESS without sunoData audio URLs")
        return _suno_failed(data, status)
    if status in _SUNO_FAILED:
        return _suno_failed(data, status)
    raise _unknown("suno status", status)


_PARSERS: Final[Mapping[str, Callable[[dict[str, Any]], PollOutcome]]] = {
    "market": _market,
    "veo": _flag_parser("veo", frozenset({1}), _result_urls),
    "suno": _suno,
    "kontext": _flag_parser("kontext", frozenset({1}), _result_image),
    "luma": _flag_parser("luma", frozenset({1, 4}), _result_urls),
    "runway": _runway,
}
FAMILIES: Final = frozenset(_PARSERS)
