"""One mapping of an HTTP error status to the error it means
(:func:`callwarden.providers.errors.error_for_status`): a host adapter's
``raise_for_status()`` (:mod:`callwarden.providers.checked`) and Replicate's answers
(:mod:`callwarden.providers.replicate.wire`) mean the same by every status, and read a
429's ``Retry-After`` the same way."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec
import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from callwarden.providers.checked import CheckedAsyncClient
from callwarden.providers.errors import (
    BadRequest,
    ProviderError,
    RateLimited,
    TransientError,
    error_for_status,
)
from callwarden.providers.outcomes import PollOutcome, Running
from callwarden.providers.raw import RawResponse
from callwarden.providers.replicate.wire import classify_replicate

ERROR_STATUSES = range(400, 600)


class _RaisesForStatus:
    """A host's client whose create calls aiohttp's ``raise_for_status()`` on ``status``."""

    kind = "acme-video"

    def __init__(self, status: int, headers: Mapping[str, str]) -> None:
        self.status, self.headers = status, headers

    async def create(self, request: Mapping[str, Any], *,
                     callback_url: str | None = None) -> str:
        url = URL("http://acme.test/v2/renders")
        info = aiohttp.RequestInfo(url, "POST", CIMultiDictProxy(CIMultiDict()), url)
        raise aiohttp.ClientResponseError(info, (), status=self.status, message="no",
                                          headers=CIMultiDictProxy(CIMultiDict(self.headers)))

    async def poll(self, task_id: str, *, created_at: float | None = None) -> PollOutcome:
        return Running(raw_state="x")


async def _from_host_adapter(status: int, headers: Mapping[str, str]) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await CheckedAsyncClient(_RaisesForStatus(status, headers), "acme").create({})
    return caught.value


def _from_replicate(status: int, headers: Mapping[str, str],
                    received_at: float = 0.0) -> ProviderError:
    raw = RawResponse(status=status, headers={k.lower(): v for k, v in headers.items()},
                      body=msgspec.json.encode({"detail": "no", "status": status}),
                      received_at=received_at)
    err = classify_replicate(raw)
    assert err is not None
    return err


async def test_every_error_status_means_the_same_from_both_paths() -> None:
    """For each status 400-599, the class a host adapter's ``ClientResponseError`` becomes
    is the class Replicate's answer with that status becomes, and the one
    :func:`error_for_status` gives."""
    differ = {}
    for status in ERROR_STATUSES:
        adapter = type(await _from_host_adapter(status, {}))
        replicate = type(_from_replicate(status, {}))
        shared = type(error_for_status(status, "no"))
        if not (adapter is replicate is shared):
            differ[status] = (adapter.__name__, replicate.__name__, shared.__name__)
    assert differ == {}


@pytest.mark.parametrize(("status", "kind"), [
    (408, TransientError), (425, TransientError), (429, RateLimited), (400, BadRequest),
    (499, BadRequest),
    (500, TransientError), (599, TransientError)])
def test_the_statuses_the_twins_once_disagreed_on(status: int, kind: type) -> None:
    """408 Request Timeout: the server did not process the request, so it is retried
    later like a 5xx, not refused like a 4xx (the Replicate mapping said ``BadRequest``);
    425 Too Early too (the media download and ElevenLabs' mapping said so, the shared one
    ``BadRequest``)."""
    assert type(error_for_status(status, "no")) is kind


@pytest.mark.parametrize("status", [100, 204, 301, 399])
def test_a_status_that_is_no_error_is_an_unexpected_answer(status: int) -> None:
    err = error_for_status(status, "no", provider="p")
    assert type(err).__name__ == "MalformedResponse"
    assert (err.status, err.provider) == (status, "p")


@pytest.mark.parametrize("after", ["7", "30 seconds from now as an HTTP date"])
async def test_a_429s_retry_after_is_read_the_same_from_both_paths(after: str) -> None:
    """Delta-seconds and an HTTP date (``parse_retry_after``), from both paths."""
    now = time.time()
    value = "7" if after == "7" else email.utils.formatdate(now + 30, usegmt=True)
    adapter = await _from_host_adapter(429, {"Retry-After": value})
    replicate = _from_replicate(429, {"Retry-After": value}, received_at=now)
    assert isinstance(adapter, RateLimited)
    assert isinstance(replicate, RateLimited)
    expected = 7.0 if after == "7" else 30.0
    assert adapter.retry_after == pytest.approx(expected, abs=2)
    assert replicate.retry_after == pytest.approx(expected, abs=2)
