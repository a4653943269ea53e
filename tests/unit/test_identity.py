"""Owner ids are per process incarnation: a forked child is a new one (issue 16: Celery's
prefork children inherited their parent's id, so two children fenced as one owner)."""

from __future__ import annotations

import multiprocessing

from callwarden.calls.identity import incarnation


def _child(queue: multiprocessing.Queue[str]) -> None:
    queue.put(incarnation("worker"))


def test_a_forked_child_is_a_new_incarnation() -> None:
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = ctx.Queue()
    children = [ctx.Process(target=_child, args=(queue,)) for _ in range(2)]
    for c in children:
        c.start()
    ids = {queue.get(timeout=30) for _ in children}
    for c in children:
        c.join(timeout=30)
    assert len(ids) == 2
    assert incarnation("worker") not in ids
    assert incarnation("worker") == incarnation("worker")  # stable within a process
