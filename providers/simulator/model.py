"""The simulator's data model: the clock, per-task scripts, tasks and their store.

Everything here is plain logic over an explicit ``now`` (simulated unix seconds), so
provider routes can ask "what does this task look like now?" without any I/O.

A :class:`Script` is a list of :class:`Step` (each lasting a number of observations or of
simulated seconds) and an ``end``. :meth:`Task.observe` counts one poll and walks the
script; :meth:`Task.peek` answers the same question without counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import msgspec

__all__ = [
    "Clock",
    "Fault",
    "Phase",
    "PhaseName",
    "Script",
    "ServedMedia",
    "Step",
    "Task",
    "TaskStore",
    "WebhookPlan",
]

PhaseName = Literal["queued", "running", "succeeded", "failed", "stuck", "vanished", "canceled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "canceled", "vanished"})


class Clock:
    """Simulated unix time: real elapsed time × ``factor``, plus manual advances."""

    def __init__(self, factor: float = 1.0, *, start: float | None = None) -> None:
        self.factor = factor
        self._start = time.time() if start is None else start
        self._mono = time.monotonic()
        self._offset = 0.0
        self._waiters: set[asyncio.Event] = set()

    def now(self) -> float:
        return self._start + (time.monotonic() - self._mono) * self.factor + self._offset

    def advance(self, seconds: float) -> float:
        """Jump forward ``seconds`` of simulated time; return the new ``now()`` (waking
        every :meth:`sleep` whose deadline it passes)."""
        self._offset += seconds
        for waiter in list(self._waiters):
            waiter.set()
        return self.now()

    async def sleep(self, sim_seconds: float, *, scale: float = 1.0) -> None:
        """Wait until ``sim_seconds`` of simulated time have passed (real time at the
        clock's factor, times ``scale``, or sooner when :meth:`advance` jumps past)."""
        deadline = self.now() + sim_seconds
        woken = asyncio.Event()
        self._waiters.add(woken)
        try:
            while (left := deadline - self.now()) > 0:
                woken.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), self.real_seconds(left) * scale)
                if scale != 1.0:
                    return  # a scaled wait ends on its (scaled) real time
        finally:
            self._waiters.discard(woken)

    def real_seconds(self, sim_seconds: float) -> float:
        """How many real seconds ``sim_seconds`` of simulated time take at this factor."""
        return sim_seconds / self.factor if self.factor > 0 else sim_seconds


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """One phase of a script. Lasts ``polls`` observations or ``seconds`` of simulated
    time, whichever is reached first; one observation when neither is given."""

    phase: Literal["queued", "running"]
    polls: int | None = None
    seconds: float | None = None
    progress: float | None = None


class WebhookPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How the simulator mistreats callbacks: never send them, send extra copies, hold one
    back so the next overtakes it, or fail the first attempts (then retry)."""

    drop: bool = False
    duplicates: int = 0
    out_of_order: bool = False
    fail_first: int = 0


def _default_steps() -> list[Step]:
    return [Step(phase="queued", polls=1), Step(phase="running", polls=2)]


MediaBody = Literal["media", "html"]


class ServedMedia(msgspec.Struct, frozen=True, kw_only=True):
    """A result file served as given: ``body`` (text, sent UTF-8 encoded) under the
    ``Content-Type`` header ``content_type`` (an SVG with a script, XHTML as ``text/xml``,
    a script as ``text/javascript``)."""

    content_type: str
    body: str


class Script(msgspec.Struct, frozen=True, kw_only=True):
    """What one simulated task does over its life.

    Hostile results (for the engine's guards): ``result_urls`` replaces the media URLs the
    task reports on success (a foreign host, an internal address, ...); ``media_body``
    ``"html"`` serves an HTML error page (200, ``text/html``) where the media should be;
    ``media_redirect`` makes every media URL answer ``302`` to that location;
    ``media_status`` makes it answer that HTTP status; ``media_served`` serves that body
    under that content type instead of the media (:class:`ServedMedia`);
    ``media_drops_connection`` closes the connection once the media is sent, unannounced
    (no ``Connection: close``: a host whose keep-alive ends at once), so a client's kept
    connection is gone when it comes back; ``cost`` is the cost reported where the
    provider reports one (e.g. a negative one).

    Other result shapes: ``output`` is the task's output as the provider's JSON (a
    Replicate language model's token list, a string, ``data:`` URIs) instead of minted
    media; ``stop_reason`` is how a language model's answer stops (``max_tokens``,
    ``tool_use``, ``pause_turn``, ...)."""

    steps: list[Step] = msgspec.field(default_factory=_default_steps)
    end: Literal["succeeded", "failed", "stuck", "vanished"] = "succeeded"
    media_count: int = 1
    media_ttl_s: float | None = None
    result_urls: list[str] | None = None
    media_body: MediaBody = "media"
    media_redirect: str | None = None
    media_status: int | None = None
    media_served: ServedMedia | None = None
    media_drops_connection: bool = False
    cost: float | None = None
    output: Any = None
    stop_reason: str | None = None
    error: str = "generation failed"
    error_code: str | None = None
    webhook: WebhookPlan = WebhookPlan()
    not_found_first_polls: int = 0
    hang_s: float = 0


FaultKind = Literal["http_status", "rate_limit", "rate_limit_in_body", "reset", "hang",
                    "late", "malformed_json", "redirect", "gzip_bomb"]


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """A fault armed on one provider route, applied to the next ``times`` requests — or,
    with ``for_s``, to every request for ``for_s`` simulated seconds from when it is armed
    (a provider outage; ``times`` is then ignored). ``redirect`` answers ``status`` (307
    unless a 3xx is given) with ``Location: location``, without handling the request.
    ``gzip_bomb`` handles the request and answers its real answer behind
    ``inflated_bytes`` of leading spaces (still valid JSON once inflated), gzip-compressed
    (about 1,000 to 1), with ``Content-Encoding: gzip`` whatever the client accepts."""

    kind: FaultKind
    status: int = 500
    retry_after: float | None = None
    times: int = 1
    hang_s: float = 30.0
    for_s: float | None = None
    location: str | None = None
    inflated_bytes: int = 256 * 2**20


class Phase(msgspec.Struct, frozen=True, kw_only=True):
    name: PhaseName
    progress: float | None
    step_index: int

    @property
    def terminal(self) -> bool:
        return self.name in TERMINAL


@dataclass(frozen=True)
class _Cursor:
    """Where a task is in its script: the current step and when/at which poll it began."""

    index: int = 0
    start_polls: int = 0
    start_at: float = 0.0


def _step_over(step: Step, cur: _Cursor, seen: int, now: float) -> float | None:
    """When ``step`` (begun at ``cur``) is over: the simulated time it ended, else None."""
    if step.seconds is not None and now >= cur.start_at + step.seconds:
        return cur.start_at + step.seconds
    polls = step.polls if step.polls is not None else (None if step.seconds else 1)
    if polls is not None and seen > cur.start_polls + polls:
        return now
    return None


def _walk(steps: list[Step], cur: _Cursor, seen: int, prior: int, now: float) -> _Cursor:
    """Advance ``cur`` past every step that is over at observation ``seen``."""
    while cur.index < len(steps):
        ended = _step_over(steps[cur.index], cur, seen, now)
        if ended is None:
            break
        cur = _Cursor(index=cur.index + 1, start_polls=prior, start_at=ended)
    return cur


@dataclass
class Task:
    """One simulated upstream task. Provider modules keep their own fields in ``extra``."""

    id: str
    provider: str
    family: str
    input: dict[str, Any]
    script: Script
    created_at: float
    callback_url: str | None = None
    polls: int = 0
    media_urls: list[str] = field(default_factory=list)
    canceled: bool = False
    canceled_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    _cursor: _Cursor = field(default_factory=_Cursor)

    def __post_init__(self) -> None:
        self._cursor = replace(self._cursor, start_at=self.created_at)

    def observe(self, now: float) -> Phase:
        """Count one poll and return the phase this poll sees."""
        self.polls += 1
        self._cursor = _walk(self.script.steps, self._cursor, self.polls, self.polls - 1, now)
        return self._phase()

    def peek(self, now: float) -> Phase:
        """The phase right now, without counting a poll."""
        self._cursor = _walk(self.script.steps, self._cursor, self.polls, self.polls, now)
        return self._phase()

    def cancel(self, now: float) -> None:
        self.canceled = True
        self.canceled_at = now

    def _phase(self) -> Phase:
        idx = self._cursor.index
        steps = self.script.steps
        if self.canceled:
            return Phase(name="canceled", progress=None, step_index=idx)
        if idx < len(steps):
            return Phase(name=steps[idx].phase, progress=steps[idx].progress, step_index=idx)
        if self.script.end == "stuck":
            last = steps[-1].progress if steps else None
            return Phase(name="running", progress=last, step_index=idx)
        progress = 100.0 if self.script.end == "succeeded" else None
        return Phase(name=self.script.end, progress=progress, step_index=idx)

    def to_json(self, now: float) -> dict[str, Any]:
        """A JSON-able view for the control API (does not count a poll)."""
        phase = self.peek(now)
        return {
            "id": self.id, "provider": self.provider, "family": self.family,
            "input": self.input, "script": msgspec.to_builtins(self.script),
            "created_at": self.created_at, "polls": self.polls,
            "callback_url": self.callback_url, "media_urls": self.media_urls,
            "canceled": self.canceled, "phase": phase.name, "progress": phase.progress,
            "extra": msgspec.to_builtins(self.extra, enc_hook=repr),
        }


class TaskStore:
    """Every simulated task, by provider and id."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._tasks: dict[tuple[str, str], Task] = {}

    def create(
        self, provider: str, family: str, input: Mapping[str, Any], script: Script, *,
        callback_url: str | None, task_id: str, now: float | None = None,
    ) -> Task:
        created = self._clock.now() if now is None else now
        task = Task(id=task_id, provider=provider, family=family, input=dict(input),
                    script=script, created_at=created, callback_url=callback_url)
        self._tasks[(provider, task_id)] = task
        return task

    def get(self, provider: str, task_id: str) -> Task | None:
        return self._tasks.get((provider, task_id))

    def all(self, provider: str | None = None) -> list[Task]:
        return [t for t in self._tasks.values() if provider is None or t.provider == provider]

    def clear(self) -> None:
        self._tasks.clear()

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._tasks.values()))
