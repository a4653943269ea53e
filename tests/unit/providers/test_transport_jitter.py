"""The retries' default jitter differs between forked workers (a prefork pool forks its
children after importing callwarden): each child draws its own delays."""

from __future__ import annotations

import multiprocessing

from callwarden.providers import transport


def _draw(queue: multiprocessing.Queue[float]) -> None:
    queue.put(transport._JITTER.random())


def test_forked_children_draw_different_jitter() -> None:
    """Two children forked from one parent never back off in step: their first draws
    differ from each other and from the parent's."""
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[float] = ctx.Queue()
    children = [ctx.Process(target=_draw, args=(queue,)) for _ in range(2)]
    for child in children:
        child.start()
    draws = [queue.get(timeout=30) for _ in children]
    for child in children:
        child.join(timeout=30)
    assert len({*draws, transport._JITTER.random()}) == 3
