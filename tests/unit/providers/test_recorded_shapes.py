"""Every parser on the shapes the live APIs send (``tests/fixtures/providers``): each
fixture — an official SDK file, doc page or public recording — has an expectation here,
and a fixture without one fails the suite, so a new recorded shape cannot go untested."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from callwarden.providers.anthropic.wire import classify_anthropic, parse_message
from callwarden.providers.elevenlabs.operations import (
    parse_audio,
    parse_dubbing_created,
    parse_dubbing_status,
    parse_forced_alignment,
    parse_stt,
    parse_voice_clone,
    parse_voice_design,
)
from callwarden.providers.elevenlabs.webhook import parse_elevenlabs
from callwarden.providers.elevenlabs.wire import classify_elevenlabs
from callwarden.providers.errors import (
    AuthenticationError,
    BadRequest,
    InsufficientCredits,
    MediaExpired,
    RateLimited,
    TaskNotFound,
    TransientError,
)
from callwarden.providers.kie.llm import parse_llm
from callwarden.providers.kie.webhook import kie_task_id
from callwarden.providers.kie.wire import classify_kie, parse_poll, parse_task_id
from callwarden.providers.outcomes import Failed, NotFound, Running, Succeeded
from callwarden.providers.raw import RawResponse
from callwarden.providers.replicate.webhook import parse_replicate
from callwarden.providers.replicate.wire import (
    classify_replicate,
    output_urls,
    parse_created,
    parse_prediction,
)
from tests.recorded import EVIDENCE, Recorded, all_fixtures

Check = Callable[[Recorded], None]


def succeeds(*, media: int | None = None, text: str | None = None, stop: str | None = None,
             cost: float | None = None, parser: Callable[[RawResponse], Any]) -> Check:
    def check(f: Recorded) -> None:
        out = parser(f.raw())
        assert isinstance(out, Succeeded), out
        if media is not None:
            assert len(out.media_urls) == media, out.media_urls
        if text is not None:
            assert out.text is not None
            assert out.text.startswith(text), out.text
        assert out.stop_reason == stop
        assert out.cost == cost
    return check


def fails(code: str | None, parser: Callable[[RawResponse], Any]) -> Check:
    def check(f: Recorded) -> None:
        out = parser(f.raw())
        assert isinstance(out, Failed), out
        assert out.code == code
    return check


def running(parser: Callable[[RawResponse], Any]) -> Check:
    def check(f: Recorded) -> None:
        assert isinstance(parser(f.raw()), Running)
    return check


def raises(error: type[Exception], parser: Callable[[RawResponse], Any]) -> Check:
    def check(f: Recorded) -> None:
        with pytest.raises(error):
            parser(f.raw())
    return check


def classified(error: type[Exception], classify: Callable[[RawResponse], Any],
               retry_after: float | None = None) -> Check:
    def check(f: Recorded) -> None:
        found = classify(f.raw())
        assert type(found) is error, found
        if retry_after is not None:
            assert isinstance(found, RateLimited)
            assert found.retry_after == retry_after
    return check


def returns(value: Any, parser: Callable[[RawResponse], Any]) -> Check:
    def check(f: Recorded) -> None:
        assert parser(f.raw()) == value
    return check


def kie_poll(family: str) -> Callable[[RawResponse], Any]:
    return lambda raw: parse_poll(family, raw)


def callback(parser: Callable[[bytes], Any], expect: Callable[[Any], bool]) -> Check:
    def check(f: Recorded) -> None:
        assert expect(parser(f.body_bytes()))
    return check


def dubbing(raw: RawResponse) -> Any:
    return parse_dubbing_status(raw, base_url="https://api.elevenlabs.io")


P = parse_prediction
EXPECTED: dict[tuple[str, str], Check] = {
    # -- Replicate: any JSON output, files where the SDKs see them -------------------------
    ("replicate", "create_response"): returns("fakecreate2baaaaaaaaaaaaaa", parse_created),
    ("replicate", "create_response_official_model"): lambda f: None if parse_created(
        f.raw()) else pytest.fail("no id"),
    ("replicate", "create_response_stream"): lambda f: None if parse_created(
        f.raw()) else pytest.fail("no id"),
    ("replicate", "training_create_response"): lambda f: None if parse_created(
        f.raw()) else pytest.fail("no id"),
    ("replicate", "prediction_starting"): running(P),
    ("replicate", "prediction_processing"): running(P),
    ("replicate", "training_processing"): running(P),
    ("replicate", "prediction_sync_data_uri"): running(P),  # sync mode says processing
    ("replicate", "prediction_sync_text_tokens"): running(P),
    ("replicate", "prediction_succeeded_image"): succeeds(media=1, parser=P),
    ("replicate", "prediction_succeeded_image_legacy_serializer"): succeeds(media=1, parser=P),
    # (the quoted answer was cut before its status: its output is what it holds)
    ("replicate", "prediction_succeeded_image_string"): lambda f: None if output_urls(
        f.body["output"]) == (f.body["output"],) else pytest.fail("not one file"),
    ("replicate", "prediction_succeeded_text_tokens"): succeeds(
        media=0, text=" Sure! Here's a poem", parser=P),
    ("replicate", "prediction_succeeded_string_output"): succeeds(media=0, text="", parser=P),
    ("replicate", "training_succeeded"): succeeds(media=1, parser=P),
    ("replicate", "prediction_failed"): fails("failed", P),
    ("replicate", "prediction_canceled"): fails("canceled", P),
    ("replicate", "training_canceled"): fails("canceled", P),
    ("replicate", "prediction_aborted"): fails("aborted", P),
    ("replicate", "prediction_data_removed"): raises(MediaExpired, P),
    ("replicate", "error_401"): classified(AuthenticationError, classify_replicate),
    ("replicate", "error_402"): classified(InsufficientCredits, classify_replicate),
    ("replicate", "error_404_training_destination"): classified(BadRequest, classify_replicate),
    ("replicate", "error_422_input_validation"): classified(BadRequest, classify_replicate),
    ("replicate", "error_422_invalid_version"): classified(BadRequest, classify_replicate),
    ("replicate", "error_429"): classified(RateLimited, classify_replicate, retry_after=1.0),
    ("replicate", "error_429_low_credit"): classified(RateLimited, classify_replicate,
                                                      retry_after=5.0),
    ("replicate", "webhook_completed"): callback(
        parse_replicate, lambda p: isinstance(p.outcome, Succeeded)),
    ("replicate", "webhook_start"): callback(parse_replicate, lambda p: p.intermediate),
    # -- KIE: in-body codes, family vocabularies, no cost in any poll ------------------------
    ("kie", "market_create"): returns("deadbeefdeadbeefdeadbeef00000001", parse_task_id),
    ("kie", "suno_create"): lambda f: None if parse_task_id(f.raw()) else pytest.fail("id"),
    ("kie", "suno_create_missing_callback"): raises(BadRequest, parse_task_id),
    ("kie", "suno_sibling_record_does_not_exist"): raises(BadRequest, parse_task_id),
    ("kie", "market_record_waiting"): running(kie_poll("market")),
    ("kie", "market_record_queuing"): running(kie_poll("market")),
    ("kie", "market_record_generating"): running(kie_poll("market")),
    ("kie", "market_record_success_image"): succeeds(media=2, parser=kie_poll("market")),
    ("kie", "market_record_success_video"): succeeds(media=1, parser=kie_poll("market")),
    ("kie", "market_record_success_docs_example"): succeeds(media=1, parser=kie_poll("market")),
    ("kie", "market_record_success_text"): succeeds(media=0, text="{", parser=kie_poll(
        "market")),
    ("kie", "market_record_fail"): fails("500", kie_poll("market")),
    ("kie", "record_is_null"): lambda f: None if isinstance(
        parse_poll("market", f.raw()), NotFound) else pytest.fail("not NotFound"),
    ("kie", "suno_record_not_found"): lambda f: None if isinstance(
        parse_poll("suno", f.raw()), NotFound) else pytest.fail("not NotFound"),
    ("kie", "veo_record_success"): succeeds(media=1, parser=kie_poll("veo")),
    ("kie", "kontext_record_success"): succeeds(media=1, parser=kie_poll("kontext")),
    ("kie", "luma_record_success"): succeeds(media=1, parser=kie_poll("luma")),
    ("kie", "suno_record_success"): succeeds(media=1, parser=kie_poll("suno")),
    ("kie", "suno_record_fail"): fails("501", kie_poll("suno")),
    ("kie", "runway_record_success"): succeeds(media=1, parser=kie_poll("runway")),
    ("kie", "runway_record_expired"): fails("result_gone", kie_poll("runway")),
    ("kie", "error_400_taskid_required"): classified(BadRequest, classify_kie),
    ("kie", "error_401"): classified(AuthenticationError, classify_kie),
    ("kie", "error_404"): classified(TaskNotFound, classify_kie),
    ("kie", "error_429"): classified(RateLimited, classify_kie),
    ("kie", "error_500"): classified(TransientError, classify_kie),
    ("kie", "download_url_wrong"): classified(BadRequest, classify_kie),
    ("kie", "credit"): returns(None, classify_kie),
    ("kie", "suno_style_generate"): returns(None, classify_kie),
    ("kie", "llm_claude_messages"): succeeds(text="Hello", stop="end_turn", cost=0.02,
                                             parser=parse_llm),
    ("kie", "llm_chat_completions"): succeeds(text="", stop="end_turn", cost=27.0,
                                              parser=parse_llm),
    ("kie", "llm_claude_error_401"): raises(AuthenticationError, parse_llm),
    # KIE callbacks are signals: only the task id is read from an unsigned body.
    **{("kie", name): callback(kie_task_id, lambda t: isinstance(t, str) and bool(t))
       for name in ("callback_kontext_fail", "callback_kontext_success",
                    "callback_luma_success", "callback_market_fail",
                    "callback_market_success", "callback_runway_fail",
                    "callback_runway_success", "callback_suno_complete",
                    "callback_suno_error", "callback_suno_first", "callback_suno_text",
                    "callback_veo_fail", "callback_veo_success")},
    # -- ElevenLabs -------------------------------------------------------------------------
    ("elevenlabs", "dubbing_create"): returns("FAKEdub0000000000001", parse_dubbing_created),
    ("elevenlabs", "dubbing_status_live_preparing"): running(dubbing),
    ("elevenlabs", "dubbing_status_live_dubbing"): running(dubbing),
    ("elevenlabs", "dubbing_status_live_dubbed"): succeeds(media=1, parser=dubbing),
    ("elevenlabs", "dubbing_status_dubbed"): succeeds(media=3, parser=dubbing),
    ("elevenlabs", "dubbing_status_failed"): fails(None, dubbing),
    ("elevenlabs", "dubbing_audio_response"): returns(None, classify_elevenlabs),
    ("elevenlabs", "dubbing_audio_not_ready_425"): classified(TransientError,
                                                              classify_elevenlabs),
    ("elevenlabs", "dubbing_audio_not_found_404"): classified(TaskNotFound,
                                                              classify_elevenlabs),
    ("elevenlabs", "tts_response"): lambda f: None if parse_audio(f.raw()).blobs
    else pytest.fail("no audio"),
    ("elevenlabs", "sfx_response"): succeeds(cost=10.0, parser=parse_audio),
    ("elevenlabs", "stt_response"): succeeds(text="", cost=0.0, parser=parse_stt),
    ("elevenlabs", "stt_webhook_accepted"): returns(None, classify_elevenlabs),
    ("elevenlabs", "voice_clone_response"): succeeds(parser=parse_voice_clone),
    ("elevenlabs", "voice_design_response"): succeeds(parser=parse_voice_design),
    ("elevenlabs", "forced_alignment_response"): succeeds(parser=parse_forced_alignment),
    ("elevenlabs", "error_400_validation"): classified(BadRequest, classify_elevenlabs),
    ("elevenlabs", "error_401"): classified(AuthenticationError, classify_elevenlabs),
    ("elevenlabs", "error_401_legacy"): classified(AuthenticationError, classify_elevenlabs),
    ("elevenlabs", "error_401_quota_legacy"): classified(InsufficientCredits,
                                                         classify_elevenlabs),
    ("elevenlabs", "error_402"): classified(InsufficientCredits, classify_elevenlabs),
    ("elevenlabs", "error_422"): classified(BadRequest, classify_elevenlabs),
    ("elevenlabs", "error_429"): classified(RateLimited, classify_elevenlabs),
    ("elevenlabs", "error_429_legacy"): classified(RateLimited, classify_elevenlabs),
    ("elevenlabs", "webhook_speech_to_text"): callback(
        parse_elevenlabs, lambda p: p is not None and isinstance(p.outcome, Succeeded)),
    # -- Anthropic: a 200 is a result only for the stop reasons the policy accepts -----------
    ("anthropic", "message_end_turn"): succeeds(text="", stop="end_turn", parser=parse_message),
    ("anthropic", "message_end_turn_live_headers"): succeeds(stop="end_turn",
                                                             parser=parse_message),
    ("anthropic", "message_end_turn_thinking"): succeeds(stop="end_turn", parser=parse_message),
    ("anthropic", "message_stop_sequence"): succeeds(stop="stop_sequence", parser=parse_message),
    ("anthropic", "message_tool_use"): succeeds(text="[{", stop="tool_use",
                                                parser=parse_message),
    ("anthropic", "message_max_tokens"): fails("truncated:max_tokens", parse_message),
    ("anthropic", "message_max_tokens_thinking_only"): fails("truncated:max_tokens",
                                                             parse_message),
    ("anthropic", "message_context_window_exceeded"): fails("truncated:context_window",
                                                            parse_message),
    ("anthropic", "message_pause_turn"): fails("unfinished:pause_turn", parse_message),
    ("anthropic", "message_refusal"): fails("refusal", parse_message),
    ("anthropic", "error_400"): classified(BadRequest, classify_anthropic),
    ("anthropic", "error_401"): classified(AuthenticationError, classify_anthropic),
    ("anthropic", "error_402"): classified(InsufficientCredits, classify_anthropic),
    ("anthropic", "error_404"): classified(BadRequest, classify_anthropic),
    ("anthropic", "error_429"): classified(RateLimited, classify_anthropic),
    ("anthropic", "error_429_spend_limit"): classified(InsufficientCredits, classify_anthropic),
    ("anthropic", "error_500"): classified(TransientError, classify_anthropic),
    ("anthropic", "error_504"): classified(TransientError, classify_anthropic),
    ("anthropic", "error_529"): classified(TransientError, classify_anthropic),
}

FIXTURES = all_fixtures()


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f"{f.provider}/{f.name}" for f in FIXTURES])
def test_parser_reads_the_recorded_shape(fixture: Recorded) -> None:
    check = EXPECTED.get((fixture.provider, fixture.name))
    assert check is not None, f"no expectation for {fixture.provider}/{fixture.name}"
    check(fixture)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f"{f.provider}/{f.name}" for f in FIXTURES])
def test_every_fixture_names_its_source_and_evidence(fixture: Recorded) -> None:
    assert fixture.source.strip(), fixture.name
    assert fixture.evidence in EVIDENCE, fixture.evidence
    assert fixture.kind in ("response", "callback")


def test_every_expectation_has_its_fixture() -> None:
    names = {(f.provider, f.name) for f in FIXTURES}
    assert set(EXPECTED) - names == set()
