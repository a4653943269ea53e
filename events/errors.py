"""The root of callwarden's error tree: every error a host can catch is a
:class:`CallwardenError` (the tree is drawn once, in :mod:`callwarden.errors`).

It lives here, in the lowest package, because the errors of ``events``, ``projections``
and ``providers`` hang from it too, and those may not import ``engine``."""

from __future__ import annotations

__all__ = ["CallwardenError"]


class CallwardenError(Exception):
    """Base of every error callwarden raises for a caller to catch."""
