"""The host's own domain events (a module named like callwarden's ``events/`` folder:
callwarden is one package, ``callwarden``, so the host's ``events`` is never shadowed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderOrdered:
    """A user ordered a render (the host's event, not callwarden's)."""

    user_id: str
    prompt: str
