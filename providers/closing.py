"""One way to close what keeps connections: :class:`AsyncClosing`."""

from __future__ import annotations

from typing import Self

__all__ = ["AsyncClosing"]


class AsyncClosing:
    """An object that holds connections until :meth:`aclose`; ``async with`` closes it
    too (``__aenter__`` answers the object itself). Subclasses write ``aclose``."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
