"""Normalised results of provider calls: what a poll or a sync call tells us.

These are plain frozen values (no I/O). Every client maps its provider's own status
vocabulary onto exactly one of them.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

__all__ = ["Blob", "Failed", "NotFound", "PollOutcome", "Running", "Succeeded", "SyncOutcome",
           "Usage", "finite", "reported_cost", "reported_number"]


class Blob(msgspec.Struct, frozen=True, kw_only=True):
    """Media returned inline by a sync call (TTS audio bytes), not behind a URL."""

    content_type: str
    data: bytes


class Running(msgspec.Struct, frozen=True, kw_only=True, tag="running"):
    """Upstream is still working. ``progress`` is 0..100 when the provider reports it."""

    raw_state: str
    progress: float | None = None


Usage = dict[str, float | str]
"""What the provider reported the call used, under normalised keys: ``model``,
``input_tokens``, ``output_tokens`` (Anthropic, KIE's LLM proxy), ``predict_time_s``
(Replicate), ``characters`` (ElevenLabs' ``character-cost``), ``provider_credits``
(KIE's ``credits_consumed``). Only keys the answer carried are present; the pricing hook
(:mod:`callwarden.calls.pricing`) turns them into credits."""


class Succeeded(msgspec.Struct, frozen=True, kw_only=True, tag="succeeded"):
    """Upstream finished. ``media_urls`` to download now (``http(s)`` or ``data:``);
    ``text`` for text answers; ``cost`` as the provider reported it (its own units:
    credits, characters), if any; ``usage`` what it reported using; ``stop_reason`` why a
    language model stopped (kept in the event and the job's output)."""

    media_urls: tuple[str, ...] = ()
    text: str | None = None
    cost: float | None = None
    blobs: tuple[Blob, ...] = ()
    raw: dict[str, Any] = msgspec.field(default_factory=dict)
    usage: Usage = msgspec.field(default_factory=dict)
    stop_reason: str | None = None


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """Upstream reported that the task failed (generation error, moderation...)."""

    error: str
    code: str | None = None
    raw: dict[str, Any] = msgspec.field(default_factory=dict)


class NotFound(msgspec.Struct, frozen=True, kw_only=True, tag="not_found"):
    """The task id is unknown to the provider (never existed, expired or deleted)."""

    message: str = ""


PollOutcome = Running | Succeeded | Failed | NotFound
SyncOutcome = Succeeded | Failed


def finite(value: object) -> float | None:
    """``value`` as a finite float when it is a JSON number (not a bool) that fits one;
    else ``None`` (a 400-digit integer overflows a float: ``None``, never an exception)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def reported_cost(value: object) -> float | None:
    """A cost the provider reported: a finite number ``>= 0`` (a JSON number, or a
    header's numeric text), else ``None``. A cost that is negative, not finite or not a
    number is dropped, never guessed and never charged: the call still succeeded (and was
    billed upstream), so its result is kept and the pricing hook decides the charge."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    number = finite(value)
    return number if number is not None and number >= 0 else None


def reported_number(value: object) -> float | None:
    """A usage figure the provider reported: a finite number ``>= 0``, else ``None`` (a
    usage figure is informational: an odd one is dropped, not an error)."""
    number = finite(value)
    return number if number is not None and number >= 0 else None
