"""Bad input stays typed: every response parser, fed any body (hypothesis-generated JSON,
random bytes, recorded shapes truncated at any byte, recorded shapes with any one value
swapped for another JSON type, huge bodies) under any HTTP status, returns an outcome or
raises a :class:`ProviderError` subclass — never another exception. Webhook body parsers
return a delivery (or ``None``) or raise ``MalformedDelivery``."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.providers.anthropic import wire as anthropic
from callwarden.providers.elevenlabs import operations as elevenlabs
from callwarden.providers.elevenlabs.webhook import parse_elevenlabs
from callwarden.providers.elevenlabs.wire import classify_elevenlabs
from callwarden.providers.errors import ProviderError
from callwarden.providers.kie import llm as kie
from callwarden.providers.kie import wire as kie_parse
from callwarden.providers.kie.webhook import kie_task_id
from callwarden.providers.raw import RawResponse
from callwarden.providers.replicate import wire as replicate
from callwarden.providers.replicate.webhook import parse_replicate
from callwarden.providers.webhooks import MalformedDelivery
from tests.recorded import all_fixtures

ELEVENLABS_OPS = sorted(elevenlabs.SYNC_OPERATIONS)


def _kie_poll(family: str, raw: RawResponse) -> Any:
    return kie_parse.parse_poll(family, raw)


PARSERS: dict[str, Callable[[RawResponse], Any]] = {
    "replicate.parse_prediction": replicate.parse_prediction,
    "replicate.parse_created": replicate.parse_created,
    "replicate.classify": replicate.classify_replicate,
    "replicate.classify_poll": replicate.classify_replicate_poll,
    "kie.parse_task_id": kie_parse.parse_task_id,
    "kie.parse_llm": kie.parse_llm,
    "kie.classify": kie_parse.classify_kie,
    "kie.classify_poll": kie_parse.classify_kie_poll,
    **{f"kie.parse_poll[{f}]": functools.partial(_kie_poll, f)
       for f in sorted(kie_parse.FAMILIES)},
    "elevenlabs.parse_dubbing_status": lambda raw: elevenlabs.parse_dubbing_status(
        raw, base_url="https://api.elevenlabs.io"),
    "elevenlabs.parse_dubbing_created": elevenlabs.parse_dubbing_created,
    "elevenlabs.classify": classify_elevenlabs,
    **{f"elevenlabs.parse_sync[{op}]": functools.partial(elevenlabs.parse_sync, op)
       for op in ELEVENLABS_OPS},
    "anthropic.parse_message": anthropic.parse_message,
    "anthropic.classify": anthropic.classify_anthropic,
}
WEBHOOKS: dict[str, Callable[[bytes], Any]] = {
    "replicate": parse_replicate, "elevenlabs": parse_elevenlabs, "kie": kie_task_id,
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
    | st.text(max_size=20) | st.sampled_from([
        "succeeded", "failed", "processing", "success", "fail", "dubbed", "message", "text",
        "end_turn", "max_tokens", "SUCCESS", "error", "https://x.y/z.png", "data:,x"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from([
        "id", "status", "output", "code", "msg", "data", "state", "resultJson", "type",
        "content", "stop_reason", "successFlag", "response", "videoInfo", "error", "detail",
        "dubbing_id", "target_languages", "choices", "usage", "credits_consumed",
        "data_removed", "metrics", "text", "voice_id", "previews", "words", "characters",
        "retry_after", "expireFlag", "sunoData", "taskId", "task_id", "callbackType"]),
        inner, max_size=6),
    max_leaves=25)
statuses = st.sampled_from([200, 201, 202, 400, 401, 402, 403, 404, 409, 422, 425, 429, 500,
                            503, 529])
headers = st.dictionaries(st.sampled_from(["retry-after", "content-type", "character-cost",
                                           "x-should-retry", "retry-after-ms"]),
                          st.text(max_size=12), max_size=3)
bodies = (json_values.map(msgspec.json.encode) | st.binary(max_size=200))
RECORDED = [f.body_bytes() for f in all_fixtures()]
truncated = st.sampled_from(RECORDED).flatmap(
    lambda b: st.integers(0, len(b)).map(lambda n: b[:n]))


def _total(parser: Callable[[RawResponse], Any], raw: RawResponse) -> None:
    with contextlib.suppress(ProviderError):
        parser(raw)


@pytest.mark.parametrize("name", sorted(PARSERS))
@given(body=bodies | truncated, status=statuses, hdrs=headers)
def test_every_parser_answers_any_body_with_an_outcome_or_a_provider_error(
        name: str, body: bytes, status: int, hdrs: dict[str, str]) -> None:
    """Invariant: for any body, status and headers, the parser returns or raises a
    ProviderError subclass (nothing else escapes)."""
    _total(PARSERS[name], RawResponse(status=status, headers=hdrs, body=body))


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_a_huge_body_is_still_a_typed_answer(name: str) -> None:
    """Invariant: a 5 MB body (a huge JSON array, or junk) or a deeply nested one is
    parsed or refused typed."""
    for body in (b"[" + b"1," * 2_500_000 + b"1]", b"x" * 5_000_000,
                 b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5_000 + b"1" + b"}" * 5_000):
        _total(PARSERS[name], RawResponse(status=200, headers={}, body=body))


@pytest.mark.parametrize("name", sorted(WEBHOOKS))
@given(body=bodies | truncated)
def test_every_webhook_parser_answers_any_body_typed(name: str, body: bytes) -> None:
    """Invariant: a webhook body parser returns a delivery (or None) or raises
    MalformedDelivery, for any body."""
    with contextlib.suppress(MalformedDelivery):
        WEBHOOKS[name](body)


SWAPS: list[Any] = [None, [], {}, 1.5, -1, "", True, ["x"], {"x": 1}, "__BIG__", "__DEEP__"]
# Stand-ins replaced in the encoded body: an integer no float holds, and a nesting deeper
# than any answer (msgspec itself gives up near 1,000 levels; our readers recurse).
RAW_SWAPS = {b'"__BIG__"': b"1" + b"0" * 400, b'"__DEEP__"': b"[" * 600 + b"]" * 600}


def _encoded(body: Any) -> bytes:
    data = msgspec.json.encode(body)
    for marker, raw in RAW_SWAPS.items():
        data = data.replace(marker, raw)
    return data


def _swapped(value: Any) -> Iterator[Any]:
    """``value`` with each one of its values (at any depth) replaced by each of
    :data:`SWAPS` in turn."""
    for swap in SWAPS:
        if type(swap) is not type(value) or swap != value:
            yield swap
    if isinstance(value, dict):
        for key, inner in value.items():
            for other in _swapped(inner):
                yield {**value, key: other}
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            for other in _swapped(inner):
                yield [*value[:i], other, *value[i + 1:]]


@pytest.mark.parametrize("provider", ["anthropic", "elevenlabs", "kie", "replicate"])
def test_a_recorded_shape_with_any_value_of_another_type_is_a_typed_answer(
        provider: str) -> None:
    """Invariant: a recorded answer in which any one value (a status, a URL, a count, a
    nested object) has another JSON type is parsed or refused typed by every parser of
    its provider, under the recorded status and headers."""
    parsers = [p for name, p in PARSERS.items() if name.startswith(provider + ".")]
    for fixture in all_fixtures(provider):
        if fixture.body_text is not None:
            continue
        for body in _swapped(fixture.body):
            raw = RawResponse(status=fixture.status, headers=fixture.headers,
                              body=_encoded(body))
            for parser in parsers:
                _total(parser, raw)


@pytest.mark.parametrize("provider", sorted(WEBHOOKS))
def test_a_recorded_callback_with_any_value_of_another_type_is_typed(provider: str) -> None:
    """Invariant: a recorded callback or webhook body with any one value of another JSON
    type is read or refused with MalformedDelivery, never another exception."""
    bodies = [f.body for f in all_fixtures(provider)
              if f.kind in ("callback", "webhook") and f.body_text is None]
    assert bodies
    for recorded in bodies:
        for body in _swapped(recorded):
            with contextlib.suppress(MalformedDelivery):
                WEBHOOKS[provider](_encoded(body))
