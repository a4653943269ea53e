"""Results that arrive inside the answer are stored before the answer is recorded.

A sync call's bytes (TTS audio) and ``data:`` URIs (what Replicate's sync mode answers, and
any model may) are not behind a URL that can be fetched again later: if the worker died
after recording the answer, the media would be gone, and an event carrying a few hundred
kilobytes of base64 would be written, re-read and re-folded on every load. So every actor
that records an upstream answer (the worker, the reconciler, the webhook receiver) first
calls :func:`store_inline`: each inline result is decoded under the kind's size and type
limits and stored under the job's deterministic key (``media/<job>/<index>.<ext>``, so a
retry overwrites the same object), and the outcome it returns carries only URLs; the keys go
into the event (``UpstreamResult.stored_keys``), which the finalizer then only checks. Like a
download, an inline result a browser could run script in is stored as
``application/octet-stream`` (:func:`~callwarden.providers.media_types.stored_type`).

A result that can never be stored (too large, a refused type, a malformed ``data:`` URI) is
a :class:`~callwarden.providers.outcomes.Failed` with ``code="media_unusable"`` (refunded); a
storage
failure is raised as it is (nothing recorded: the answer is polled or delivered again).
"""

from __future__ import annotations

import asyncio
import uuid

import msgspec

from callwarden.calls.config import CallConfig
from callwarden.providers.base import ProviderSettings
from callwarden.providers.errors import MediaError
from callwarden.providers.media import decode_data_uri
from callwarden.providers.media_types import GENERIC, media_type, stored_type
from callwarden.providers.outcomes import Blob, Failed, PollOutcome, Succeeded
from callwarden.providers.registry import media_fetch_for
from callwarden.providers.storage import MediaStore, media_key

__all__ = ["store_inline"]


def _inline_blobs(kind: str, outcome: Succeeded, settings: ProviderSettings,
                  config: CallConfig) -> tuple[list[Blob], tuple[str, ...]]:
    """The inline results (checked) and the URLs left to download."""
    fetch = media_fetch_for(kind, settings, config.media_allow_hosts)
    blobs = list(outcome.blobs)
    for blob in blobs:
        if len(blob.data) > config.media_max_bytes:
            raise MediaError(f"inline result of {len(blob.data)} bytes, over "
                             f"{config.media_max_bytes}")
        if not blob.data:
            raise MediaError("an inline result is empty (0 bytes)")
    urls = []
    for url in outcome.media_urls:
        if url[:5].lower() != "data:":
            urls.append(url)
            continue
        got = decode_data_uri(url, max_bytes=config.media_max_bytes,
                              allowed_types=fetch.allowed_types)
        blobs.append(Blob(content_type=got.content_type, data=got.data))
    return blobs, tuple(urls)


#: data: URIs longer than this (characters, all of a result's together) are decoded in a
#: thread: a 80 MB one held the event loop for 10 s.
_ON_THE_LOOP = 256 * 1024


async def store_inline(media: MediaStore, job_id: uuid.UUID, kind: str,
                       outcome: PollOutcome, *, settings: ProviderSettings,
                       config: CallConfig) -> tuple[PollOutcome, tuple[str, ...]]:
    """``outcome`` with its inline results stored: (the outcome to record, the stored
    keys). Anything but a :class:`Succeeded` with inline results is returned as it is."""
    if not isinstance(outcome, Succeeded) or not (
            outcome.blobs or any(u[:5].lower() == "data:" for u in outcome.media_urls)):
        return outcome, ()
    try:  # a large data: URI is decoded off the event loop (heartbeats keep going)
        large = sum(len(u) for u in outcome.media_urls if u[:5].lower() == "data:")
        blobs, urls = (await asyncio.to_thread(_inline_blobs, kind, outcome, settings, config)
                       if large > _ON_THE_LOOP else _inline_blobs(kind, outcome, settings,
                                                                  config))
    except MediaError as exc:
        return Failed(error=f"result unusable: {exc}", code="media_unusable",
                      raw=outcome.raw), ()
    keys = []
    for index, blob in enumerate(blobs):
        content_type = stored_type(media_type(blob.content_type) or GENERIC)
        obj = await media.put(media_key(str(job_id), index, content_type), blob.data,
                              content_type)
        keys.append(obj.key)
    return msgspec.structs.replace(outcome, blobs=(), media_urls=urls), tuple(keys)
