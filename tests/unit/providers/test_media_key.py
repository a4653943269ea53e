"""Deterministic media keys: safe job ids map under the prefix, everything else is refused."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.providers.storage import InvalidMediaKey, check_key, extension_for, media_key

SAFE_JOB_ID = r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"
job_ids = st.from_regex(re.compile(SAFE_JOB_ID, re.ASCII), fullmatch=True)
indexes = st.integers(min_value=0, max_value=10**6)
content_types = st.sampled_from(
    ["image/png", "video/mp4", "audio/mpeg", "AUDIO/MPEG; charset=binary", "x/unknown"]
)


@given(job_ids, indexes, content_types)
def test_safe_job_id_maps_to_a_key_under_the_prefix(job_id: str, index: int, ctype: str) -> None:
    key = media_key(job_id, index, ctype)
    assert key == f"media/{job_id}/{index}.{extension_for(ctype)}"
    assert check_key(key) == key


@given(job_ids, indexes, content_types)
def test_key_is_the_same_every_time(job_id: str, index: int, ctype: str) -> None:
    assert media_key(job_id, index, ctype) == media_key(job_id, index, ctype)


@given(job_ids, job_ids, indexes)
def test_distinct_jobs_never_share_a_key(a: str, b: str, index: int) -> None:
    if a != b:
        assert media_key(a, index, "image/png") != media_key(b, index, "image/png")


@given(st.text(max_size=200).filter(lambda s: not re.fullmatch(SAFE_JOB_ID, s, re.ASCII)))
def test_any_other_job_id_is_refused(job_id: str) -> None:
    with pytest.raises(InvalidMediaKey):
        media_key(job_id, 0, "image/png")


@pytest.mark.parametrize(
    "job_id",
    ["", "..", "../etc", "a/b", "a\\b", "/abs", ".hidden", "-flag", "job\n", "jöb", "a" * 129,
     "a\x00b", "a b"],
)
def test_traversal_and_odd_job_ids_are_refused(job_id: str) -> None:
    with pytest.raises(InvalidMediaKey):
        media_key(job_id, 0, "image/png")


@pytest.mark.parametrize("index", [-1, True, 1.0, "0"])
def test_index_must_be_a_non_negative_int(index: object) -> None:
    with pytest.raises(InvalidMediaKey):
        media_key("job1", index, "image/png")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ctype", "ext"),
    [("image/png", "png"), ("image/jpeg", "jpg"), ("Video/MP4", "mp4"),
     ("audio/mpeg; charset=binary", "mp3"), ("audio/wav", "wav"), ("video/quicktime", "mov"),
     ("application/octet-stream", "bin"), ("image/x-made-up", "bin"), ("", "bin")],
)
def test_extension_follows_the_content_type(ctype: str, ext: str) -> None:
    assert media_key("job-1", 3, ctype) == f"media/job-1/3.{ext}"


def test_prefix_is_part_of_the_key_and_may_be_empty() -> None:
    assert media_key("j1", 0, "audio/mpeg", prefix="tenants/acme") == "tenants/acme/j1/0.mp3"
    assert media_key("j1", 0, "audio/mpeg", prefix="") == "j1/0.mp3"


@pytest.mark.parametrize("prefix", ["..", "../up", "a/../b", "a//b", ".meta"])
def test_unsafe_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(InvalidMediaKey):
        media_key("j1", 0, "audio/mpeg", prefix=prefix)


@pytest.mark.parametrize(
    "key",
    ["", "../a", "a/../b", "a/./b", "/abs", "a//b", "a/", "a\\b", ".meta/x", "a/.tmp",
     "a\x00", "a" * 1025, "C:/x", "a/b c"],
)
def test_check_key_refuses_unsafe_keys(key: str) -> None:
    with pytest.raises(InvalidMediaKey):
        check_key(key)
