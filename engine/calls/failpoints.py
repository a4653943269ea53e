"""Named crash points between every two steps of a call, for crash tests.

``CALLWARDEN_FAILPOINTS="after_create,mid_poll"`` arms points for this process; when the
code passes an armed point, the process kills itself with SIGKILL (no cleanup, no
``finally``: exactly what an OOM kill or a container recycle does). ``name@N`` fires on the
N-th pass only. Unarmed, a failpoint costs one set look-up.

In-process property tests pass ``action=``: a function called with the point's name in
place of the SIGKILL (it raises, so the actor stops right there). Gentler than a kill:
``finally`` blocks and context exits still run (a transaction rolls back, a reconciler
releases its claim at once); the acceptance crash tests use the real SIGKILL.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

__all__ = ["POINTS", "RECONCILER_POINTS", "arm", "failpoint"]

POINTS = (
    "before_call_started",   # nothing recorded yet
    "before_create",         # CallStarted recorded, create request not sent
    "after_create",          # upstream task exists, TaskCreated not recorded (ambiguous)
    "mid_poll",              # TaskCreated recorded, polling
    "success_seen",          # a poll answered success, nothing recorded, media not stored
    "after_upstream_result",  # UpstreamSucceeded recorded, finalization not claimed
    "after_claim",           # FinalizeClaimed recorded, media not stored
    "after_upload",          # media stored, Completed not recorded (finalized at once: the
                             # success not recorded either)
    "after_sync_call",       # sync call answered, outcome not recorded
)

# The reconciler's: its claim is written (owner + lease), nothing handled yet.
RECONCILER_POINTS = ("reconciler_after_claim",)

_armed: dict[str, int] = {}
_passes: dict[str, int] = {}


def _kill(_name: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_action: Callable[[str], None] = _kill


def arm(spec: str | None, *, action: Callable[[str], None] | None = None) -> None:
    """Arm points from a spec like ``"after_create,mid_poll@3"`` (replaces the set);
    ``action``: what a fired point does (default: SIGKILL this process)."""
    global _action
    armed: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (spec or "").split(","))):
        name, _, nth = part.partition("@")
        if name not in POINTS + RECONCILER_POINTS:
            known = ", ".join(POINTS + RECONCILER_POINTS)
            raise ValueError(f"unknown failpoint {name!r}; known: {known}")
        armed[name] = int(nth) if nth else 1
    _action = action if action is not None else _kill  # only once the spec parsed
    _armed.clear()
    _passes.clear()
    _armed.update(armed)


def failpoint(name: str) -> None:
    """Die here (SIGKILL, or the armed ``action``) if ``name`` is armed (on its N-th
    pass)."""
    if name not in _armed:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == _armed[name]:
        _action(name)


arm(os.environ.get("CALLWARDEN_FAILPOINTS"))
