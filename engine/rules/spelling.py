""""Did you mean": the known name closest to one that is not known (a setting, a table, an
environment variable), so a typo is answered with its fix. Pure: names in, text out."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

__all__ = ["closest", "did_you_mean"]


def closest(name: str, known: Iterable[str], *, prefix: str = "",
            cutoff: float = 0.6) -> str | None:
    """The name of ``known`` most like ``name`` (``None``: none is as close as ``cutoff``,
    difflib's ratio), compared without case and without the ``prefix`` they share
    (``CALLWARDEN_``, which would make every variable look alike)."""
    def stem(text: str) -> str:
        upper = text.upper()
        return upper[len(prefix):] if prefix and upper.startswith(prefix.upper()) else upper

    by_stem: dict[str, str] = {}
    for candidate in known:
        by_stem.setdefault(stem(candidate), candidate)
    by_stem.pop(stem(name), None)  # never suggest the name itself
    found = difflib.get_close_matches(stem(name), list(by_stem), n=1, cutoff=cutoff)
    return by_stem[found[0]] if found else None


def did_you_mean(name: str, known: Iterable[str], *, prefix: str = "",
                 show: Callable[[str], str] = str) -> str:
    """`` (did you mean X?)`` naming the closest known name (shown by ``show``, e.g. as
    ``[table]``), or ``""`` when none is close."""
    found = closest(name, known, prefix=prefix)
    return "" if found is None else f" (did you mean {show(found)}?)"
