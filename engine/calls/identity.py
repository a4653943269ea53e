"""Owner ids belong to a process incarnation (a fresh id per start), never a host name:
reused names hid stuck work in three well-known queues (DESIGN §6). A forked child (a
Celery prefork pool child, a multiprocessing worker) is a new incarnation too: it gets
its own id at the fork, so two children never claim, beat or fence as one owner."""

from __future__ import annotations

import os
import uuid

__all__ = ["incarnation"]

_INCARNATION = uuid.uuid4().hex[:12]


def _new_incarnation() -> None:
    global _INCARNATION
    _INCARNATION = uuid.uuid4().hex[:12]


os.register_at_fork(after_in_child=_new_incarnation)


def incarnation(role: str) -> str:
    """``<role>:<id of this process start>``, e.g. ``worker:3f9c0a1b2c4d``."""
    return f"{role}:{_INCARNATION}"
