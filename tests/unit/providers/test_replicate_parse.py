"""Replicate request builders and response parsers, from the reference's payload shapes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MalformedResponse,
    MediaExpired,
    RateLimited,
    TransientError,
    UnknownProviderKind,
)
from callwarden.providers.outcomes import Failed, NotFound, Running, Succeeded
from callwarden.providers.raw import RawResponse
from callwarden.providers.replicate.client import ReplicatePredictionClient
from callwarden.providers.replicate.wire import (
    build_get_request,
    build_prediction_request,
    build_training_request,
    classify_replicate,
    classify_replicate_poll,
    output_urls,
    parse_created,
    parse_prediction,
)

CREATED = {  # reference §11.1, live 201
    "id": "hdwst0bb05rgp0cf0p29mzk2am", "model": "stability-ai/sdxl", "version": "39ed" * 16,
    "input": {"prompt": "a cat"}, "logs": "", "error": None, "status": "starting",
    "created_at": "2024-04-22T11:15:15.329Z",
    "urls": {"cancel": "https://api.replicate.com/v1/predictions/hdwst0bb05rgp0cf0p29mzk2am/cancel",
             "get": "https://api.replicate.com/v1/predictions/hdwst0bb05rgp0cf0p29mzk2am"},
}
IMG = "https://replicate.delivery/pbxt/abc/out-0.png"


def _raw(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> RawResponse:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return RawResponse(status=status, headers=headers or {}, body=data)


def _doc(**changes: Any) -> dict[str, Any]:
    return {**CREATED, **changes}


# --- builders ---

def test_version_request_posts_to_predictions_with_webhook() -> None:
    req = build_prediction_request({"version": "39ed" * 16, "input": {"prompt": "x"}},
                                   api_key="tok", callback_url="https://cb/hook")
    assert (req.method, req.path) == ("POST", "/v1/predictions")
    assert req.headers["Authorization"] == "Bearer tok"
    assert req.json == {"input": {"prompt": "x"}, "version": "39ed" * 16,
                        "webhook": "https://cb/hook", "webhook_events_filter": ["completed"]}


def test_model_request_uses_official_model_route_without_version() -> None:
    req = build_prediction_request({"model": "black-forest-labs/flux-schnell", "input": {}},
                                   api_key="tok")
    assert req.path == "/v1/models/black-forest-labs/flux-schnell/predictions"
    assert req.json == {"input": {}}


@pytest.mark.parametrize("request_", [
    {"input": {}}, {"model": "noslash", "input": {}}, {"version": "v"}, {"version": "v",
                                                                          "input": "text"},
])
def test_bad_prediction_requests_are_refused_before_sending(request_: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        build_prediction_request(request_, api_key="tok")


def test_training_request_path_and_body() -> None:
    req = build_training_request({"model": "ostris/flux-dev-lora-trainer", "version": "e440",
                                  "destination": "me/my-lora", "input": {"steps": 10}},
                                 api_key="tok")
    assert req.path == "/v1/models/ostris/flux-dev-lora-trainer/versions/e440/trainings"
    assert req.json == {"destination": "me/my-lora", "input": {"steps": 10}}
    with pytest.raises(BadRequest):
        build_training_request({"model": "o/n", "version": "v", "input": {}}, api_key="t")


def test_get_request_quotes_the_id() -> None:
    assert build_get_request("trainings", "a/b", api_key="t").path == "/v1/trainings/a%2Fb"


# --- parsers ---

def test_created_id_is_parsed_and_missing_id_is_malformed() -> None:
    assert parse_created(_raw(CREATED, 201)) == "hdwst0bb05rgp0cf0p29mzk2am"
    with pytest.raises(MalformedResponse):
        parse_created(_raw({"status": "starting"}, 201))


@pytest.mark.parametrize("status", ["starting", "processing"])
def test_running_states(status: str) -> None:
    assert parse_prediction(_raw(_doc(status=status))) == Running(raw_state=status)


@pytest.mark.parametrize(("output", "urls"), [
    (IMG, (IMG,)),
    ([IMG, IMG.replace("0", "1")], (IMG, IMG.replace("0", "1"))),
    ({"version": "me/lora:abc", "weights": "https://replicate.delivery/w.tar"},
     ("https://replicate.delivery/w.tar",)),
])
def test_succeeded_collects_every_output_url(output: Any, urls: tuple[str, ...]) -> None:
    doc = _doc(status="succeeded", output=output, logs="Done.\n", data_removed=False)
    outcome = parse_prediction(_raw(doc))
    assert isinstance(outcome, Succeeded)
    assert (outcome.media_urls, outcome.cost) == (urls, None)
    assert "logs" not in outcome.raw
    assert outcome.raw["id"] == CREATED["id"]


def test_data_removed_means_the_media_has_expired() -> None:
    doc = _doc(status="succeeded", output=None, data_removed=True)
    with pytest.raises(MediaExpired):
        parse_prediction(_raw(doc))


@pytest.mark.parametrize(("output", "text"), [
    ("just text", "just text"),
    (["", " Sure", "!", " Here", ""], " Sure! Here"),  # a language model's tokens
    ({"answer": 42, "ok": True}, '{"answer":42,"ok":true}'),
    (None, None),
])
def test_success_without_a_file_is_a_text_result(output: Any, text: str | None) -> None:
    outcome = parse_prediction(_raw(_doc(status="succeeded", output=output)))
    assert isinstance(outcome, Succeeded)
    assert (outcome.media_urls, outcome.text) == ((), text)


IMG = "https://replicate.delivery/pbxt/a/out-0.png"


@pytest.mark.parametrize(("output", "media", "text"), [
    (IMG, (IMG,), None),
    ([IMG, IMG.replace("0", "1")], (IMG, IMG.replace("0", "1")), None),
    ({"caption": "a fox", "image": IMG}, (IMG,),
     '{"caption":"a fox","image":{"media":0}}'),
    (["See ", IMG, " for details"], (IMG,), '["See ",{"media":0}," for details"]'),
    ({"version": "me/lora:abc", "weights": IMG}, (IMG,),
     '{"version":"me/lora:abc","weights":{"media":0}}'),
])
def test_an_output_with_files_keeps_the_rest_of_its_structure(
        output: Any, media: tuple[str, ...], text: str | None) -> None:
    outcome = parse_prediction(_raw(_doc(status="succeeded", output=output)))
    assert isinstance(outcome, Succeeded)
    assert (outcome.media_urls, outcome.text) == (media, text)


WIKI = "https://en.wikipedia.org/wiki/Fox"


@pytest.mark.parametrize(("output", "media", "text"), [
    (WIKI, (), WIKI),
    ({"image": IMG, "source": "https://replicate.com/owner/model"}, (IMG,),
     '{"image":{"media":0},"source":"https://replicate.com/owner/model"}'),
    (["see ", "http://evilreplicate.delivery/x.png"], (),
     "see http://evilreplicate.delivery/x.png"),  # the suffix without its dot
])
def test_a_url_off_the_media_hosts_is_text(
        output: Any, media: tuple[str, ...], text: str | None) -> None:
    outcome = parse_prediction(_raw(_doc(status="succeeded", output=output)))
    assert isinstance(outcome, Succeeded)
    assert (outcome.media_urls, outcome.text) == (media, text)


def test_the_caller_says_which_hosts_hold_files() -> None:
    mine = "http://127.0.0.1:9/media/abc"
    outcome = parse_prediction(_raw(_doc(status="succeeded", output=[mine, WIKI])),
                               is_media=lambda url: url.startswith("http://127.0.0.1:9/"))
    assert isinstance(outcome, Succeeded)
    assert (outcome.media_urls, outcome.text) == ((mine,), f'[{{"media":0}},"{WIKI}"]')


def test_data_uri_outputs_are_files_and_are_not_copied_into_raw() -> None:
    uri = "data:image/png;base64," + "A" * 4000
    outcome = parse_prediction(_raw(_doc(status="succeeded", output=[uri])))
    assert isinstance(outcome, Succeeded)
    assert outcome.media_urls == (uri,)
    assert len(msgspec.json.encode(outcome.raw)) < 2000


@pytest.mark.parametrize(("status", "error", "expected"), [
    ("failed", "CUDA out of memory", "CUDA out of memory"),
    ("canceled", None, "canceled"),
    ("aborted", None, "aborted"),
])
def test_failed_states(status: str, error: str | None, expected: str) -> None:
    outcome = parse_prediction(_raw(_doc(status=status, error=error)))
    assert isinstance(outcome, Failed)
    assert (outcome.error, outcome.code) == (expected, status)


def test_404_is_not_found_keeping_detail() -> None:
    raw = _raw({"detail": "Not found.", "status": 404}, 404)
    assert classify_replicate_poll(raw) is None
    assert parse_prediction(raw) == NotFound(message="Not found.")


@pytest.mark.parametrize("body", [b'{"id": "x", "stat', b"[1, 2]", b""])
def test_bad_json_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedResponse):
        parse_prediction(_raw(body))


def test_unknown_status_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="queued"):
        parse_prediction(_raw(_doc(status="queued")))


# --- classify ---

def _problem(status: int, detail: str, **headers: str) -> RawResponse:
    return _raw({"detail": detail, "status": status}, status,
                {"content-type": "application/problem+json", **headers})


def test_401_problem_is_authentication_error_with_detail() -> None:
    raw = _raw({"title": "Unauthenticated", "detail": "You did not pass a valid "
                "authentication token", "status": 401}, 401)
    err = classify_replicate(raw)
    assert isinstance(err, AuthenticationError)
    assert (err.message, err.code) == ("You did not pass a valid authentication token",
                                       "Unauthenticated")


def test_429_is_rate_limited_with_retry_after() -> None:
    detail = "Request was throttled. Expected available in 1 second."
    err = classify_replicate(_problem(429, detail, **{"retry-after": "1"}))
    assert isinstance(err, RateLimited)
    assert (err.message, err.retry_after) == (detail, 1.0)


@pytest.mark.parametrize(("status", "kind"), [
    (500, TransientError), (503, TransientError), (402, InsufficientCredits),
    (404, BadRequest), (422, BadRequest),
])
def test_other_statuses(status: int, kind: type[Exception]) -> None:
    err = classify_replicate(_problem(status, "The specified training destination does "
                                              "not exist"))
    assert type(err) is kind
    assert "destination" in str(err)


def test_non_json_error_body_keeps_its_text() -> None:
    err = classify_replicate(_raw(b"<html>Bad Gateway</html>", 502))
    assert isinstance(err, TransientError)
    assert "Bad Gateway" in err.message


def test_output_urls_dedupes_and_ignores_non_urls() -> None:
    assert output_urls({"a": [IMG, IMG], "b": "owner/name:v", "c": 3}) == (IMG,)


def test_client_refuses_foreign_kind() -> None:
    with pytest.raises(UnknownProviderKind):
        ReplicatePredictionClient(None, None, "replicate-training")  # type: ignore[arg-type]
