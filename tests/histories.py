"""Legal call histories by construction (issue 14 item 3): a hypothesis strategy that walks
the real transition table.

:func:`histories` walks :data:`callwarden.events.states.LEGAL` (the table ``events/states.py``
declares
once, which the fold and the ``transitions`` machine are both built from) from the empty
call, drawing at each step one of the events the current state accepts, with realistic
payloads and non-decreasing timestamps. It follows the fold's refinements of the table
(``Adopted`` with a task id enters ``polling``; ``HostEnded`` ends the call as the host's
status says) and its lease rule (a ``FinalizeClaimed`` on a ``finalizing`` call is legal only
once the lease has expired, so a walk's takeover comes at or after ``lease_until``).

Every walk first draws how it ends (:data:`ENDINGS`: open, or one of the ten terminal
ways) and how long it is, then steers towards a state that ending may follow, so short and
long walks reach every terminal; ``ReconcileAttempted``, lease takeovers and the
``FinalizeFailed`` -> ``FinalizeClaimed`` loop keep a call open for as long as the walk
wants.

With probability ``illegal_rate`` (drawn explicitly, so the history says where) one
illegal event is inserted: half the time after the walk's last event, a tenth of the time
before its first, else at any position; an event the state there does not accept
(any event after a terminal one), or a takeover of a live finalization lease. The legal
walk's remaining events follow it unchanged; none of them may be applied.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import msgspec
from hypothesis import event, target
from hypothesis import strategies as st

from callwarden.events.states import (
    LEGACY_KIND,
    LEGAL,
    TERMINAL,
    CallState,
    InvalidTransition,
    TerminalStateError,
)
from callwarden.events.types import (
    EVENT_TYPES,
    Adopted,
    CallStarted,
    Cancelled,
    Completed,
    Event,
    Exhausted,
    FinalizeClaimed,
    FinalizeFailed,
    HostEnded,
    LeftoverSettled,
    ReconcileAttempted,
    StoredMedia,
    Swept,
    TaskCreated,
    UpstreamFailed,
    UpstreamResult,
    UpstreamSucceeded,
)

__all__ = ["ENDINGS", "T0", "History", "histories", "label"]

T0 = datetime(2026, 5, 19, 9, 30, tzinfo=UTC)
S = CallState
_Draw = Callable[[st.SearchStrategy[object]], object]

# How a walk ends: "open" (no terminal event), or the event (and host status) ending it.
ENDINGS: tuple[str, ...] = (
    "open", "Completed", "UpstreamFailed", "Swept", "Exhausted", "Cancelled",
    "HostEnded:completed", "HostEnded:cancelled", "HostEnded:failed", "HostEnded:timed_out",
)
# The state each ending's event enters (HostEnded refined from the host's status).
ENDING_STATE: dict[str, CallState] = {
    "Completed": S.COMPLETED, "UpstreamFailed": S.FAILED, "Swept": S.SWEPT,
    "Exhausted": S.EXHAUSTED, "Cancelled": S.CANCELLED,
    "HostEnded:completed": S.COMPLETED, "HostEnded:cancelled": S.CANCELLED,
    "HostEnded:failed": S.FAILED, "HostEnded:timed_out": S.FAILED,
}

# The non-terminal moves: (move name, event type), with the state each enters from each
# source. "Adopted+task" is Adopted carrying a task id (the fold's refinement: polling).
_MOVES: tuple[tuple[str, str], ...] = (
    ("CallStarted", "CallStarted"), ("Adopted", "Adopted"), ("Adopted+task", "Adopted"),
    ("TaskCreated", "TaskCreated"), ("UpstreamSucceeded", "UpstreamSucceeded"),
    ("FinalizeClaimed", "FinalizeClaimed"), ("FinalizeFailed", "FinalizeFailed"),
    ("ReconcileAttempted", "ReconcileAttempted"),
)


def _move_dest(move: str, src: CallState | None) -> CallState | None:
    """Where ``move`` takes ``src`` (``None``: the table does not allow it)."""
    dest = LEGAL.get((src, dict(_MOVES)[move]))
    if dest is None or dest in TERMINAL:
        return None
    return S.POLLING if move == "Adopted+task" else dest


def _ending_sources(ending: str) -> frozenset[CallState | None]:
    name = ending.split(":")[0]
    return frozenset(src for (src, ev) in LEGAL if ev == name)


def _distances(targets: frozenset[CallState | None]) -> dict[CallState | None, int]:
    """Fewest non-terminal moves from each state to one of ``targets``."""
    sources: list[CallState | None] = [None, *S]
    dist = {t: 0 for t in targets}
    queue = deque(targets)
    while queue:
        here = queue.popleft()
        for src in sources:
            if src in dist:
                continue
            if here is not None and any(_move_dest(m, src) == here for m, _ in _MOVES):
                dist[src] = dist[here] + 1
                queue.append(src)
    return dist


_DIST = {e: _distances(_ending_sources(e)) for e in ENDINGS if e != "open"}

_ACTORS = ("worker:host-a:4242:9f3c", "worker:host-b:77:0c1d", "reconciler:r1:311:aa02",
           "reconciler:r2:312:ab03", "webhook", "admin")
_KINDS = ("kie-standard", "kie-veo", "replicate-prediction", "elevenlabs-async",
          "anthropic-sync", "kie-llm")
_texts = st.text(st.characters(codec="utf-8"), max_size=12)
_costs = st.none() | st.floats(0, 500, allow_nan=False, allow_infinity=False)
# Error texts: the engine's kinds of message (a NUL and a non-ASCII one among them).
_errors = st.sampled_from(("HTTP 502 from upstream", "connect timeout", "s3: 503 SlowDown",
                           "rate limited (429)", "result expired", "", "\x00 nul \u2603"))


@dataclass(frozen=True)
class History:
    """A drawn history. ``events``: what to fold. ``states[i]``: the state the walk
    predicts after ``events[i]`` (up to the illegal event, if any). ``illegal_at``: the
    index of the injected illegal event (``None``: every event is legal), ``illegal_kind``
    why it is illegal, ``error`` the exception the fold must raise there. ``ending``: one
    of :data:`ENDINGS`, as walked."""

    events: tuple[Event, ...]
    states: tuple[CallState, ...]
    ending: str
    illegal_at: int | None = None
    illegal_kind: str | None = None
    error: type[InvalidTransition] | None = None

    @property
    def legal(self) -> tuple[Event, ...]:
        """The events before the illegal one (all of them if there is none)."""
        return self.events if self.illegal_at is None else self.events[:self.illegal_at]

    @property
    def final_state(self) -> CallState | None:
        """The state the legal prefix ends in."""
        return self.states[len(self.legal) - 1] if self.legal else None


@dataclass
class _Walk:
    draw: _Draw
    now: datetime = T0
    state: CallState | None = None
    lease_until: datetime | None = None

    def tick(self, max_s: int = 900) -> datetime:
        gap = self.draw(st.integers(0, max_s * 1000))  # milliseconds
        assert isinstance(gap, int)
        self.now += timedelta(milliseconds=gap)
        return self.now

    def actor(self) -> str:
        return str(self.draw(st.sampled_from(_ACTORS)))

    def text(self, s: st.SearchStrategy[str]) -> str:
        return str(self.draw(s))

    def event(self, move: str) -> Event:
        """The event for ``move`` (a move name, or an ending), stamped after the last."""
        d = self.draw
        at = self.tick()
        actor = self.actor()
        match move:
            case "CallStarted":
                kind = str(d(st.sampled_from(_KINDS)))
                return CallStarted(at=at, actor=actor, kind=kind,
                                   sync=kind in ("anthropic-sync", "kie-llm"))
            case "Adopted" | "Adopted+task":
                kind = str(d(st.sampled_from((*_KINDS, LEGACY_KIND))))
                started = d(st.none() | st.just(at - timedelta(hours=2)))
                assert started is None or isinstance(started, datetime)
                return Adopted(
                    at=at, actor=actor, kind=kind, call_started_at=started,
                    task_id=self.text(st.from_regex(r"[a-z0-9]{6,16}", fullmatch=True))
                    if move == "Adopted+task" else None,
                    observed_status=str(d(st.sampled_from(("pending", "processing")))),
                    reconcile_attempts=int(str(d(st.integers(0, 20)))),
                    reconcile_last_error=str(d(_errors)) or None)
            case "TaskCreated":
                return TaskCreated(at=at, actor=actor, task_id=self.text(
                    st.from_regex(r"task_[a-f0-9]{8,24}", fullmatch=True)))
            case "UpstreamSucceeded":
                urls = d(st.lists(st.sampled_from((
                    "https://tempfile.aiquickdraw.com/a.png",
                    "https://replicate.delivery/pbxt/out-0.webp",
                    "https://cdn.example.test/v.mp4")), max_size=3))
                assert isinstance(urls, list)
                cost = d(_costs)
                assert cost is None or isinstance(cost, float)
                return UpstreamSucceeded(at=at, actor=actor, result=UpstreamResult(
                    media_urls=tuple(urls), text=str(d(_texts)) or None, cost=cost,
                    raw={"status": "succeeded", "n": len(urls)},
                    usage={"output_tokens": 12.0} if not urls else {}))
            case "FinalizeClaimed":
                if self.state is S.FINALIZING and self.lease_until is not None:
                    at = self.now = max(at, self.lease_until)  # a takeover: lease expired
                lease = at + timedelta(seconds=int(str(d(st.integers(1, 900)))))
                self.lease_until = lease
                return FinalizeClaimed(at=at, actor=actor, owner=f"{actor}/{at.second:02x}",
                                       lease_until=lease)
            case "FinalizeFailed":
                self.lease_until = None
                return FinalizeFailed(at=at, actor=actor, error=str(d(_errors)))
            case "ReconcileAttempted":
                nxt = d(st.none() | st.just(at + timedelta(seconds=30)))
                assert nxt is None or isinstance(nxt, datetime)
                return ReconcileAttempted(
                    at=at, actor=actor, next_attempt_at=nxt,
                    outcome=str(d(st.sampled_from(("still_running", "poll_error",
                                                   "finalize_retry")))),
                    error=str(d(_errors)) or None)
            case "Completed":
                n = int(str(d(st.integers(0, 2))))
                media = tuple(StoredMedia(key=f"jobs/x/{i}.png", url=f"s3://b/jobs/x/{i}.png",
                                          content_type="image/png", size=1000 + i)
                              for i in range(n))
                cost = d(_costs)
                assert cost is None or isinstance(cost, float)
                self.lease_until = None
                return Completed(at=at, actor=actor, media=media, cost=cost,
                                 text=str(d(_texts)) or None)
            case "UpstreamFailed":
                return UpstreamFailed(at=at, actor=actor, error=str(d(_errors)) or "failed",
                                      code=str(d(st.sampled_from(("rate_limited",
                                                                  "result_gone", "")))) or None)
            case "Swept":
                return Swept(at=at, actor=actor, reason=str(d(st.sampled_from((
                    "reconcile_no_recovery", "upstream_task_not_found")))))
            case "Exhausted":
                return Exhausted(at=at, actor=actor, attempts=int(str(d(st.integers(1, 40)))),
                                 last_error=str(d(_errors)) or None)
            case "Cancelled":
                return Cancelled(at=at, actor=actor, by=str(d(st.sampled_from(
                    ("user:42", "admin", "workflow")))))
        if move == "LeftoverSettled":  # only ever drawn as an illegal event
            return LeftoverSettled(at=at, actor=actor, status="completed")
        assert move.startswith("HostEnded:"), move
        return HostEnded(at=at, actor=actor, status=move.split(":", 1)[1])


def _illegal(w: _Walk, draw: _Draw) -> tuple[Event, str, type[InvalidTransition]]:
    """An event the walk's current state may not take (or a live-lease takeover)."""
    s = w.state
    names = sorted(n for n in EVENT_TYPES if (s, n) not in LEGAL)
    takeover = s is S.FINALIZING and w.lease_until is not None and w.now < w.lease_until
    options = [*names, *(["lease takeover"] if takeover else [])]
    pick = str(draw(st.sampled_from(options)))
    error = TerminalStateError if s in TERMINAL else InvalidTransition
    at, actor = w.now, w.actor()
    if pick == "lease takeover":
        assert w.lease_until is not None
        return (FinalizeClaimed(at=at, actor=actor, owner="thief", lease_until=w.lease_until
                                + timedelta(seconds=60)), "live lease takeover", error)
    saved = w.now
    e = w.event({"HostEnded": "HostEnded:failed"}.get(pick, pick))
    w.now = saved
    kind = "after terminal" if s in TERMINAL else "from empty" if s is None else "out of order"
    return msgspec.structs.replace(e, at=at), kind, error


@st.composite
def histories(draw: _Draw, *, max_len: int = 40, illegal_rate: float = 0.1,
              endings: tuple[str, ...] = ENDINGS) -> History:
    """A history walked from the empty call (see the module docstring); up to ``max_len``
    legal events (more if the drawn ending needs them), one illegal event inserted with
    probability ``illegal_rate``."""
    # The ending and the injection come from a seeded Random Hypothesis draws, so their
    # rates are exact (every ending equally likely, illegal_rate as given); the walk's
    # moves, length and payloads are Hypothesis' own draws, so a failure shrinks to a short
    # walk. (In a short run Hypothesis' mutator still makes each example the parent of a
    # few near-copies, same ending included: see docs/testing.md.)
    rng = draw(st.randoms(use_true_random=True))
    assert isinstance(rng, random.Random)
    ending = rng.choice(endings)
    length = int(str(draw(st.integers(1, max_len))))
    w = _Walk(draw)
    dist = _DIST.get(ending, {})
    steps = length if ending == "open" else length - 1
    if ending != "open":
        steps = max(steps, dist[None])
    events: list[Event] = []
    states: list[CallState] = []
    # snapshots[i]: the walk's clock, state and lease just before events[i] (and, last,
    # after the final event): where an illegal event inserted at index i stands.
    snapshots: list[tuple[datetime, CallState | None, datetime | None]] = []

    def record(move: str, dest: CallState) -> None:
        snapshots.append((w.now, w.state, w.lease_until))
        events.append(w.event(move))  # advances the clock, sets or clears the lease
        states.append(dest)
        w.state = dest

    for i in range(steps):
        left = steps - i - 1  # moves still to make after this one
        moves = [m for m, _ in _MOVES
                 if (dest := _move_dest(m, w.state)) is not None
                 and (ending == "open" or dist.get(dest, 1 << 30) <= left)]
        assert moves, (w.state, ending, left)
        move = str(draw(st.sampled_from(moves)))
        dest = _move_dest(move, w.state)
        assert dest is not None
        record(move, dest)
    if ending != "open":
        assert w.state in _ending_sources(ending), (w.state, ending)
        record(ending, ENDING_STATE[ending])
    snapshots.append((w.now, w.state, w.lease_until))

    if rng.random() >= illegal_rate:
        return History(tuple(events), tuple(states), ending)
    where = rng.random()
    at = len(events) if where < 0.5 else 0 if where < 0.6 else rng.randint(0, len(events))
    w.now, w.state, w.lease_until = snapshots[at]
    bad, kind, error = _illegal(w, draw)
    return History((*events[:at], bad, *events[at:]), tuple(states[:at]), ending,
                   illegal_at=at, illegal_kind=kind, error=error)


def _bucket(n: int) -> str:
    for top in (1, 4, 8, 16, 24):
        if n <= top:
            return f"<= {top}"
    return "> 24"


def label(h: History, *, steer: bool = False) -> None:
    """Label what the history covers (``hypothesis.event``); ``steer``: also steer the
    search towards long histories (``hypothesis.target``). Off in every property: the
    walks' drawn length already reaches 40 events, and measured under ``deep`` the
    target's hill-climbing spent most of a property's 10,000 examples on near-copies of
    one 40-event walk (69% and 71% of them one ending, in two properties; 4x slower).
    Use it to hunt for a long-history bug on purpose."""
    final = h.final_state
    event(f"final state: {final.value if final is not None else 'none'}")
    event(f"length: {_bucket(len(h.events))}")
    event(f"ending: {h.ending}")
    event(f"illegal: {h.illegal_kind or 'none'}")
    if steer:
        target(float(len(h.legal)), label="legal events")
