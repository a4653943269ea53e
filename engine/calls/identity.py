"""Owner ids belong to a process incarnation (a fresh id per start), never a host name:
reused names hid stuck work in three well-known queues (DESIGN §6)."""

from __future__ import annotations

import uuid

__all__ = ["incarnation"]

_INCARNATION = uuid.uuid4().hex[:12]


def incarnation(role: str) -> str:
    """``<role>:<id of this process start>``, e.g. ``worker:3f9c0a1b2c4d``."""
    return f"{role}:{_INCARNATION}"
