"""safe_error (callwarden.rules.redact): what an error message may keep."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.rules.redact import MAX_ERROR, safe_error
from tests.support.leaks import LEAKS, S


def test_a_url_keeps_its_host_and_path_and_loses_query_and_user_info() -> None:
    text = ("ClientResponseError: 502, message='Bad Gateway', url='https://bob:pw@api.example"
            ".com/v1/run?X-Amz-Signature=abc123&key=k1#frag'")
    out = safe_error(text)
    assert "https://[redacted]@api.example.com/v1/run?[redacted]'" in out
    for secret in ("pw", "abc123", "k1", "frag"):
        assert secret not in out


def test_credentials_in_text_keep_their_names_only() -> None:
    out = safe_error('401: Authorization: Bearer sk-ant-abcdefgh1234\n{"xi-api-key": "zz9"} '
                     "api_key=AKIA123 password: hunter2, token='t0k'")
    for secret in ("sk-ant-abcdefgh1234", "zz9", "AKIA123", "hunter2", "t0k"):
        assert secret not in out
    assert "Authorization: [redacted]" in out  # the header's whole value
    assert "api_key=[redacted]" in out


def test_an_ordinary_message_is_kept_as_it_is() -> None:
    text = "upstream failed: model overloaded (status 529), retry later"
    assert safe_error(text) == text


@given(st.text(max_size=3000))
def test_safe_error_is_bounded_and_idempotent(text: str) -> None:
    """For any text: the result is at most MAX_ERROR characters plus the note saying how
    much was cut, and redacting it again changes nothing once it fits."""
    out = safe_error(text)
    assert len(out) <= MAX_ERROR + len("... (999999 characters cut)")
    if len(out) <= MAX_ERROR:
        assert safe_error(out) == out


def test_words_near_credential_names_are_not_taken_for_keys() -> None:
    text = "max token count exceeded: 210000 tokens > 200000 maximum; Token r8_Abc123def456ghi789"
    out = safe_error(text)
    assert out.startswith("max token count exceeded: 210000 tokens > 200000 maximum;")
    assert "r8_Abc123def456ghi789" not in out




@pytest.mark.parametrize("text", list(LEAKS.values()), ids=list(LEAKS))
def test_no_credential_shape_survives(text: str) -> None:
    assert S not in safe_error(text.replace("$S", S))


@pytest.mark.parametrize("text", [
    "HTTP 429 Too Many Requests: rate limited, retry after 30 s",
    "KIE error code 501: generation failed",
    "[replicate 422] Invalid version or not permitted",
    "result expired: https://replicate.delivery/xyz/out.png",
    "prompt is too long: 210000 tokens > 200000 maximum",
    "KeyError: 'choices'", "TokenError: 'unexpected end'",
])
def test_a_provider_error_reads_as_it_was_written(text: str) -> None:
    assert safe_error(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    (r'upstream said {\"api_key\": \"abcd1234efgh5678\", \"x\": 1}', "abcd1234efgh5678"),
    ("headers: [('xi-api-key', '0123456789abcdef0123456789abcdef'), ('accept', 'json')]",
     "0123456789abcdef0123456789abcdef"),
    ('headers=(("Authorization", "Bearer-less-opaque-value"),)', "Bearer-less-opaque-value"),
    ("(('api_key', 'hunter2hunter2'),)", "hunter2hunter2"),
    ("[(b'xi-api-key', b'0123456789abcdef0123')]", "0123456789abcdef0123"),
    ("ElevenLabs refused sk_3f9a0c1e2b4d6f8a0c1e2b4d6f8a0c1e2b4d6f8a0c1e2b4d",
     "sk_3f9a0c1e2b4d6f8a0c1e2b4d6f8a0c1e2b4d6f8a0c1e2b4d"),
])
def test_secrets_in_escaped_json_tuples_and_elevenlabs_shapes_are_dropped(
        text: str, secret: str) -> None:
    """JSON escaped inside a string, headers printed as tuples, ElevenLabs' ``sk_`` keys
    (issue 40, item 3): the secret is gone, the rest of the text is kept."""
    out = safe_error(text)
    assert secret not in out, out
    assert "[redacted]" in out


def test_a_tuple_of_harmless_names_is_kept() -> None:
    assert safe_error("[('accept', 'json'), ('task_id', 'abc')]") == (
        "[('accept', 'json'), ('task_id', 'abc')]")
