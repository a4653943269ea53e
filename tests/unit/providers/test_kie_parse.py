"""KIE parsers and builders against the reference's example payloads (providers.md §1–§10)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

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
from callwarden.providers.kie.llm import parse_llm
from callwarden.providers.kie.requests import (
    build_create_request,
    build_llm_request,
    build_poll_request,
)
from callwarden.providers.kie.wire import classify_kie, classify_kie_poll, parse_poll, parse_task_id
from callwarden.providers.outcomes import Failed, NotFound, Running, Succeeded
from callwarden.providers.raw import RawResponse

TID = "5f48a1c0d2e34b5f8a9b0c1d2e3f4a5b"


def raw(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> RawResponse:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return RawResponse(status=status, headers=headers or {}, body=data)


def ok(data: Any) -> RawResponse:
    return raw({"code": 200, "msg": "success", "data": data})


# -- market (§2) ----------------------------------------------------------------------------

MARKET_PENDING = {
    "taskId": TID, "model": "grok-imagine/text-to-image", "state": "waiting",
    "param": msgspec.json.encode({"input": '{"aspect_ratio":"1:1"}', "model": "m"}).decode(),
    "resultJson": "", "failCode": None, "failMsg": None, "costTime": None,
    "completeTime": None, "createTime": 1776323915587,
}
MARKET_URLS = ["https://tempfile.aiquickdraw.com/r/a.jpg", "https://tempfile.aiquickdraw.com/r/b.jpg"]


def market(**fields: Any) -> RawResponse:
    return ok({**MARKET_PENDING, **fields})


@pytest.mark.parametrize("state", ["waiting", "queuing", "generating"])
def test_market_pending_states_are_running(state: str) -> None:
    assert parse_poll("market", market(state=state)) == Running(raw_state=state)


def test_market_success_decodes_result_json_string_and_reports_no_cost() -> None:
    """Live recordInfo answers carry no cost field (docs/providers.md): none is read, not
    even a field an old simulator invented."""
    out = parse_poll("market", market(
        state="success", resultJson=msgspec.json.encode({"resultUrls": MARKET_URLS}).decode(),
        costTime=12, completeTime=1776323928526, creditsConsumed=18))
    assert isinstance(out, Succeeded)
    assert out.media_urls == tuple(MARKET_URLS)
    assert out.cost is None
    assert out.raw["costTime"] == 12


def test_market_text_model_result_object_becomes_text() -> None:
    out = parse_poll("market", market(state="success",
                                      resultJson='{"resultObject":{"answer":42}}'))
    assert isinstance(out, Succeeded)
    assert out.text == '{"answer":42}'
    assert out.cost is None


def test_market_fail_keeps_fail_code_and_message() -> None:
    out = parse_poll("market", market(state="fail", failCode="500",
                                      failMsg="internal error, please try again later."))
    assert out == Failed(error="internal error, please try again later.", code="500",
                         raw={**MARKET_PENDING, "state": "fail", "failCode": "500",
                              "failMsg": "internal error, please try again later."})


@pytest.mark.parametrize(("fields", "needle"), [
    ({"state": "success", "resultJson": ""}, "without a resultJson"),
    ({"state": "success", "resultJson": '{"resultUrls":[]}'}, "without resultUrls"),
    ({"state": "success", "resultJson": "{not json"}, "not JSON"),
    ({"state": "success", "resultJson": "[1]"}, "not an object"),
    ({"state": "exploded"}, "exploded"),
    ({"state": None}, "None"),
])
def test_market_bad_payloads_are_malformed(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(MalformedResponse, match=needle):
        parse_poll("market", market(**fields))


def test_record_info_null_is_not_found_on_poll_but_bad_request_elsewhere() -> None:
    answer = raw({"code": 422, "msg": "recordInfo is null", "data": None})
    assert parse_poll("market", answer) == NotFound(message="recordInfo is null")
    assert classify_kie_poll(answer) is None
    err = classify_kie(answer)
    assert isinstance(err, BadRequest)
    assert err.message == "recordInfo is null"


def test_in_body_501_is_failed_on_poll_and_bad_request_on_create() -> None:
    answer = raw({"code": 501, "msg": "Generation failed", "data": None})
    assert parse_poll("market", answer) == Failed(error="Generation failed", code="501")
    with pytest.raises(BadRequest, match="Generation failed"):
        parse_task_id(answer)


# -- create answers -------------------------------------------------------------------------


def test_create_answer_gives_task_id() -> None:
    assert parse_task_id(ok({"taskId": TID, "recordId": TID})) == TID


@pytest.mark.parametrize("data", [None, {}, {"taskId": ""}, {"taskId": 7}, ["x"]])
def test_create_answer_without_task_id_is_malformed(data: Any) -> None:
    with pytest.raises(MalformedResponse, match="taskId"):
        parse_task_id(ok(data))


@pytest.mark.parametrize("body", [b'{"code":200,"msg":"succ', b"<html>oops</html>", b"",
                                  b'{"msg":"no code"}', b"[1,2]"])
def test_truncated_or_foreign_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedResponse):
        parse_task_id(raw(body))
    with pytest.raises(MalformedResponse):
        parse_poll("veo", raw(body))


# -- error envelope -------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "kind"), [
    (401, AuthenticationError), (402, InsufficientCredits), (433, InsufficientCredits),
    (404, TaskNotFound), (422, BadRequest), (429, RateLimited), (455, TransientError),
    (500, TransientError), (501, BadRequest), (505, BadRequest), (451, BadRequest),
])
def test_in_body_codes_map_to_typed_errors_keeping_msg(
    code: int, kind: type[ProviderError],
) -> None:
    answer = raw({"code": code, "msg": f"upstream says {code}", "data": None},
                 headers={"retry-after": "7"})
    err = classify_kie(answer)
    assert type(err) is kind
    assert err.message == f"upstream says {code}"
    assert err.status == code
    with pytest.raises(kind, match=f"upstream says {code}"):
        parse_task_id(answer)


def test_in_body_429_carries_retry_after() -> None:
    err = classify_kie(raw({"code": 429, "msg": "slow down", "data": None},
                           headers={"retry-after": "3"}))
    assert isinstance(err, RateLimited)
    assert err.retry_after == 3.0


@pytest.mark.parametrize(("status", "body", "kind"), [
    (429, b"Too Many Requests", RateLimited),
    (502, b"<html>bad gateway</html>", TransientError),
    (503, b'{"code":503,"msg":"maintenance"}', TransientError),
    (401, b'{"error":{"type":"authentication_error","message":"bad key"}}', AuthenticationError),
    (400, b'{"error":{"type":"invalid_request_error","message":"max_tokens"}}', BadRequest),
])
def test_http_errors_map_to_typed_errors(status: int, body: bytes, kind: type[Exception]) -> None:
    err = classify_kie(raw(body, status=status, headers={"retry-after": "2"}))
    assert type(err) is kind
    assert err is not None
    assert err.message


def test_cloudflare_1010_is_an_authentication_error_about_the_user_agent() -> None:
    err = classify_kie(raw(b"error code: 1010", status=403))
    assert isinstance(err, AuthenticationError)
    assert "User-Agent" in err.message
    assert "1010" in err.message


# -- veo / kontext / luma (§3, §5, §6) ------------------------------------------------------

VEO = {"taskId": "veo_task_abcdef123456", "paramJson": "{}", "completeTime": None,
       "createTime": "2025-06-06 10:25:00", "response": None, "successFlag": 0,
       "errorCode": None, "errorMessage": "", "fallbackFlag": False}
VEO_RESPONSE = {"taskId": "veo_task_abcdef123456", "resultUrls": ["https://x/v.mp4"],
                "originUrls": ["https://x/o.mp4"], "resolution": "1080p"}
KONTEXT_RESPONSE = {"originImageUrl": "https://x/o.png", "resultImageUrl": "https://x/r.png"}
LUMA_RESPONSE = {"taskId": "774d", "originUrls": ["https://x/o.mp4"],
                 "resultUrls": ["https://tempfile.aiquickdraw.com/l/r.mp4"]}


@pytest.mark.parametrize(("family", "flag", "response", "urls"), [
    ("veo", 1, VEO_RESPONSE, ("https://x/v.mp4",)),
    ("kontext", 1, KONTEXT_RESPONSE, ("https://x/r.png",)),
    ("luma", 1, LUMA_RESPONSE, ("https://tempfile.aiquickdraw.com/l/r.mp4",)),
    ("luma", 4, LUMA_RESPONSE, ("https://tempfile.aiquickdraw.com/l/r.mp4",)),
])
def test_success_flag_families_succeed_with_their_urls(
    family: str, flag: int, response: dict[str, Any], urls: tuple[str, ...],
) -> None:
    out = parse_poll(family, ok({**VEO, "successFlag": flag, "response": response}))
    assert isinstance(out, Succeeded)
    assert out.media_urls == urls


@pytest.mark.parametrize("family", ["veo", "kontext", "luma"])
def test_success_flag_zero_is_running(family: str) -> None:
    assert parse_poll(family, ok(VEO)) == Running(raw_state="successFlag=0")


@pytest.mark.parametrize(("family", "flag"), [("veo", 2), ("veo", 3), ("kontext", 3),
                                              ("luma", 2)])
def test_success_flag_two_and_three_fail_with_message(family: str, flag: int) -> None:
    out = parse_poll(family, ok({**VEO, "successFlag": flag, "errorCode": 400,
                                 "errorMessage": "content policy"}))
    assert isinstance(out, Failed)
    assert (out.error, out.code) == ("content policy", "400")


@pytest.mark.parametrize(("family", "flag"), [("veo", 4), ("kontext", 4), ("luma", 5),
                                              ("veo", "1"), ("veo", True), ("luma", None)])
def test_undocumented_success_flags_are_malformed(family: str, flag: Any) -> None:
    with pytest.raises(MalformedResponse, match="successFlag"):
        parse_poll(family, ok({**VEO, "successFlag": flag, "response": LUMA_RESPONSE}))


@pytest.mark.parametrize(("family", "response"), [
    ("veo", None), ("veo", {"resultUrls": []}), ("kontext", {"resultImageUrl": ""}),
    ("luma", {"resultUrls": [None]}),
])
def test_success_without_urls_is_malformed(family: str, response: Any) -> None:
    with pytest.raises(MalformedResponse, match="without URLs"):
        parse_poll(family, ok({**VEO, "successFlag": 1, "response": response}))


# -- runway (§8) ----------------------------------------------------------------------------

RUNWAY = {"taskId": "ee603959-debb-48d1-98c4-a6d1c717eba6", "parentTaskId": "",
          "generateParam": {"prompt": "p"}, "state": "wait", "generateTime": "2023-08-15 14:30:45",
          "videoInfo": None, "failCode": "", "failMsg": "", "expireFlag": 0}


@pytest.mark.parametrize("state", ["wait", "queueing", "generating"])
def test_runway_pending_spellings_are_running(state: str) -> None:
    assert parse_poll("runway", ok({**RUNWAY, "state": state})) == Running(raw_state=state)


def test_runway_market_spelling_queuing_is_unknown() -> None:
    with pytest.raises(MalformedResponse, match="queuing"):
        parse_poll("runway", ok({**RUNWAY, "state": "queuing"}))


def test_runway_success_reads_video_info() -> None:
    info = {"videoId": "485d", "taskId": RUNWAY["taskId"], "videoUrl": "https://x/r.mp4",
            "imageUrl": "https://x/r.png"}
    out = parse_poll("runway", ok({**RUNWAY, "state": "success", "videoInfo": info}))
    assert isinstance(out, Succeeded)
    assert out.media_urls == ("https://x/r.mp4",)


def test_runway_success_without_video_url_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="videoUrl"):
        parse_poll("runway", ok({**RUNWAY, "state": "success", "videoInfo": {}}))


@pytest.mark.parametrize(("fail_code", "code"), [(400, "400"), ("", None), (None, None)])
def test_runway_fail_accepts_int_str_or_null_fail_code(fail_code: Any, code: str | None) -> None:
    out = parse_poll("runway", ok({**RUNWAY, "state": "fail", "failCode": fail_code,
                                   "failMsg": "moderation"}))
    assert out == Failed(error="moderation", code=code,
                         raw={**RUNWAY, "state": "fail", "failCode": fail_code,
                              "failMsg": "moderation"})


# -- suno (§4) ------------------------------------------------------------------------------

TRACKS = [{"id": "e231", "audioUrl": "https://x/1.mp3", "streamAudioUrl": "https://x/s1",
           "imageUrl": "https://x/1.jpeg", "title": "t", "duration": 198.44},
          {"id": "e232", "audioUrl": "https://x/2.mp3", "streamAudioUrl": "https://x/s2",
           "imageUrl": "https://x/2.jpeg", "title": "t", "duration": 201.0}]


def suno(status: str, tracks: list[dict[str, Any]] | None = None, **extra: Any) -> RawResponse:
    response = None if tracks is None else {"taskId": TID, "sunoData": tracks}
    return ok({"taskId": TID, "parentMusicId": "", "param": "{}", "response": response,
               "status": status, "type": "GENERATE", "operationType": "generate",
               "errorCode": None, "errorMessage": None, **extra})


@pytest.mark.parametrize("status", ["PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"])
def test_suno_intermediate_stages_are_running(status: str) -> None:
    assert parse_poll("suno", suno(status, TRACKS[:1])) == Running(raw_state=status)


def test_suno_success_returns_every_track() -> None:
    out = parse_poll("suno", suno("SUCCESS", TRACKS))
    assert isinstance(out, Succeeded)
    assert out.media_urls == ("https://x/1.mp3", "https://x/2.mp3")


def test_suno_success_without_audio_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="sunoData"):
        parse_poll("suno", suno("SUCCESS", [{"id": "x", "audioUrl": ""}]))


def test_suno_callback_exception_with_audio_is_success() -> None:
    out = parse_poll("suno", suno("CALLBACK_EXCEPTION", TRACKS))
    assert isinstance(out, Succeeded)
    assert len(out.media_urls) == 2


def test_suno_callback_exception_without_audio_is_failed() -> None:
    out = parse_poll("suno", suno("CALLBACK_EXCEPTION", None, errorMessage="callback died"))
    assert isinstance(out, Failed)
    assert (out.error, out.code) == ("callback died", "CALLBACK_EXCEPTION")


@pytest.mark.parametrize("status", ["CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED",
                                    "SENSITIVE_WORD_ERROR"])
def test_suno_failures_keep_error_code(status: str) -> None:
    out = parse_poll("suno", suno(status, None, errorCode=400, errorMessage="copyrighted"))
    assert isinstance(out, Failed)
    assert (out.error, out.code) == ("copyrighted", "400")


def test_suno_unknown_status_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="HALF_DONE"):
        parse_poll("suno", suno("HALF_DONE"))


def test_suno_unknown_id_is_code_200_data_null() -> None:
    assert parse_poll("suno", ok(None)) == NotFound(message="success")


# -- builders -------------------------------------------------------------------------------


def test_market_create_adds_callback_and_bearer_auth() -> None:
    req = build_create_request("market", {"model": "nano-banana-pro", "input": {"prompt": "p"}},
                               api_key="k", callback_url="https://cb")
    assert (req.method, req.path) == ("POST", "/api/v1/jobs/createTask")
    assert req.json == {"model": "nano-banana-pro", "input": {"prompt": "p"},
                        "callBackUrl": "https://cb"}
    assert req.headers["Authorization"] == "Bearer k"


def test_suno_create_without_callback_is_refused_before_sending() -> None:
    with pytest.raises(BadRequest, match="callBackUrl"):
        build_create_request("suno", {"prompt": "p"}, api_key="k")
    req = build_create_request("suno", {"prompt": "p", "callBackUrl": "https://cb"}, api_key="k")
    assert req.path == "/api/v1/generate"


@pytest.mark.parametrize(("family", "path"), [
    ("market", "/api/v1/jobs/recordInfo"), ("veo", "/api/v1/veo/record-info"),
    ("suno", "/api/v1/generate/record-info"), ("kontext", "/api/v1/flux/kontext/record-info"),
    ("luma", "/api/v1/modify/record-info"), ("runway", "/api/v1/runway/record-detail"),
])
def test_poll_requests_use_each_family_path(family: str, path: str) -> None:
    req = build_poll_request(family, TID, api_key="k")
    assert (req.method, req.path, req.params) == ("GET", path, {"taskId": TID})


# -- kie-llm (§10) --------------------------------------------------------------------------


def test_llm_messages_request_forces_stream_false() -> None:
    req = build_llm_request({"model": "claude-sonnet-4-6", "messages": [], "stream": True},
                            api_key="k")
    assert req.path == "/claude/v1/messages"
    assert req.json is not None
    assert req.json["stream"] is False


def test_llm_chat_request_puts_model_in_path() -> None:
    req = build_llm_request({"api": "chat", "model": "gemini-2.5-pro", "messages": []},
                            api_key="k")
    assert req.path == "/gemini-2.5-pro/v1/chat/completions"
    assert req.json is not None
    assert "api" not in req.json


def test_llm_anthropic_answer_gives_text_and_credits() -> None:
    out = parse_llm(raw({"id": "msg_baca", "type": "message", "role": "assistant",
                         "model": "claude-sonnet-4-6",
                         "content": [{"type": "text", "text": "Hello! "},
                                     {"type": "text", "text": "Hi."}],
                         "stop_reason": "end_turn",
                         "usage": {"input_tokens": 13, "output_tokens": 17},
                         "credits_consumed": 0.02}))
    assert isinstance(out, Succeeded)
    assert (out.text, out.cost, out.stop_reason) == ("Hello! Hi.", 0.02, "end_turn")
    assert out.usage == {"input_tokens": 13, "output_tokens": 17,
                         "model": "claude-sonnet-4-6", "provider_credits": 0.02}


def test_llm_chat_completion_answer_gives_text() -> None:
    out = parse_llm(raw({"object": "chat.completion",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "ok"}}]}))
    assert isinstance(out, Succeeded)
    assert (out.text, out.cost, out.stop_reason) == ("ok", None, "end_turn")


def test_llm_tool_calls_are_the_output_not_an_empty_success() -> None:
    claude = parse_llm(raw({"type": "message", "model": "claude-sonnet-4-6",
                            "content": [{"type": "tool_use", "id": "t", "name": "lookup",
                                         "input": {"q": "x"}}],
                            "stop_reason": "tool_use", "credits_consumed": 0.01}))
    chat = parse_llm(raw({"object": "chat.completion", "choices": [{
        "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                                                   "tool_calls": [{"id": "c1", "type":
                                                                   "function"}]}}]}))
    assert isinstance(claude, Succeeded)
    assert isinstance(chat, Succeeded)
    assert ('"lookup"' in (claude.text or ""), claude.stop_reason) == (True, "tool_use")
    assert ('"c1"' in (chat.text or ""), chat.stop_reason) == (True, "tool_use")


def test_llm_text_block_without_text_is_malformed_not_the_word_none() -> None:
    with pytest.raises(MalformedResponse):
        parse_llm(raw({"type": "message", "content": [{"type": "text", "text": None}],
                       "stop_reason": "end_turn"}))


def test_llm_chat_completion_cut_at_the_length_limit_is_truncated() -> None:
    out = parse_llm(raw({"object": "chat.completion",
                         "choices": [{"index": 0, "finish_reason": "length",
                                      "message": {"role": "assistant", "content": "o"}}]}))
    assert isinstance(out, Failed)
    assert out.code == "truncated:max_tokens"


@pytest.mark.parametrize(("answer", "kind"), [
    (raw({"unexpected": True}), MalformedResponse),
    (raw(b'{"content": [{"type":'), MalformedResponse),
    (raw({"code": 402, "msg": "credits insufficient", "data": None}), InsufficientCredits),
    (raw({"error": {"type": "authentication_error", "message": "nope"}}, status=401),
     AuthenticationError),
])
def test_llm_bad_answers_raise_typed_errors(answer: RawResponse, kind: type[Exception]) -> None:
    with pytest.raises(kind):
        parse_llm(answer)


@pytest.mark.parametrize("param", [
    msgspec.json.encode({"model": "m", "callBackUrl": "https://h/webhooks/kie/j/SECRET",
                         "input": {"prompt": "p"}}).decode(),
    {"model": "m", "callBackUrl": "https://h/webhooks/kie/j/SECRET"},
    '{"callBackUrl": "https://h/webhooks/kie/j/SECRET", broken',
])
def test_the_echoed_callback_url_and_its_token_are_not_kept(param: object) -> None:
    """KIE echoes the create body in ``param``, the callback URL with the job's secret
    token in it; the outcome's raw answer (recorded in the log and on the host's row,
    which a user's own-row policy shows) keeps the rest of it and never the URL."""
    out = parse_poll("market", market(
        state="success", resultJson=msgspec.json.encode({"resultUrls": MARKET_URLS}).decode(),
        param=param))
    assert isinstance(out, Succeeded)
    assert "SECRET" not in msgspec.json.encode(out.raw).decode()
    if not isinstance(param, str) or not param.endswith("broken"):
        kept = out.raw["param"]
        assert (msgspec.json.decode(kept) if isinstance(kept, str) else kept)["model"] == "m"
