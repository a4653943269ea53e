"""The Celery demo's watch for messages its broker lost (:mod:`callwarden.demo.lost`), on a real
Redis with messages published by Celery and taken by kombu's own Redis transport.

A worker killed between kombu's ``BRPOP`` and its write to ``unacked`` loses the message:
the test takes one message off the queue with a bare ``RPOP`` (the pop, and nothing
after it), and lets kombu take another properly (``basic_get`` with acks: recorded in
``unacked``, as a live worker holds it). Only the first is published again, and only after
it was missing in two scans; a job that has a call is never published again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from kombu import Connection

from callwarden.demo.lost import MAX_REPUBLISH, LostMessages, lost, task_ids
from callwarden.demo.queues import QueueFleet
from callwarden.queue.claims import JobSpec
from tests.redis import running_redis

JOBS = [(uuid.uuid4(), JobSpec(kind="kie-standard", request={"model": "m", "input": {}}))
        for _ in range(4)]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with running_redis(tmp_path / "redis") as url:
        yield url


def _queued_ids(client: redis.Redis, queue: str) -> list[str]:
    return [json.loads(m)["headers"]["id"]
            for m in cast(list[bytes], client.lrange(queue, 0, -1))]


def test_pure_rule_needs_two_scans_and_skips_present_jobs() -> None:
    first, suspects = lost({"a", "b", "c"}, present={"b"}, suspects=set())
    assert first == set()
    assert suspects == {"a", "c"}
    again, suspects = lost({"a", "c"}, present={"c"}, suspects=suspects)  # c came back
    assert again == {"a"}
    assert suspects == set()


def test_task_ids_read_kombu_shapes_and_skip_others() -> None:
    queued = [json.dumps({"headers": {"id": "t1"}, "body": "..."}).encode(), b"not json",
              json.dumps({"headers": {"id": 7}}).encode(), json.dumps([1, 2]).encode()]
    unacked = [json.dumps([{"headers": {"id": "t2"}}, "", "q"]).encode(), b"[]", b"{}"]
    assert task_ids(queued, unacked) == {"t1", "t2"}


async def test_a_popped_message_is_published_again_once(redis_url: str, tmp_path: Path
                                                        ) -> None:
    fleet = QueueFleet("celery", 1, {}, tmp_path, redis_url, JOBS)
    fleet._send_celery(None)
    client = redis.Redis.from_url(redis_url)
    popped = json.loads(client.rpop(fleet.queue_name))["headers"]["id"]  # type: ignore[arg-type]
    # This one's task ran and acked its message: it has a call, so its missing message
    # is no loss and it is never published again.
    started = str(JOBS[3][0])
    (raw,) = [m for m in cast(list[bytes], client.lrange(fleet.queue_name, 0, -1))
              if json.loads(m)["headers"]["id"] == started]
    assert client.lrem(fleet.queue_name, 1, raw.decode()) == 1
    unstarted = {str(j) for j, _ in JOBS} - {started}

    async def no_call() -> set[str]:
        return set(unstarted)

    with Connection(redis_url) as conn:  # kombu holds one, as a live worker does
        channel: Any = conn.channel()
        held = channel.basic_get(fleet.queue_name, no_ack=False)
        assert held is not None
        assert client.hlen("unacked") == 1
        watch = fleet.lost_messages(no_call)
        assert isinstance(watch, LostMessages)
        suspects = await watch.scan(set())
        assert suspects == {popped}
        assert watch.count == 0
        before = _queued_ids(client, fleet.queue_name)
        suspects = await watch.scan(suspects)
        after = _queued_ids(client, fleet.queue_name)
        assert watch.republished == {popped: 1}
        assert sorted(after) == sorted([*before, popped])  # only the lost one, once
        assert held.headers["id"] not in after  # unacked: a live worker has it
        assert started not in after
        # Published again, it is present: later scans leave it alone.
        assert await watch.scan(suspects) == set()
        assert watch.count == 1
    client.close()


async def test_a_job_lost_again_and_again_is_published_at_most_max_times(
        redis_url: str, tmp_path: Path) -> None:
    fleet = QueueFleet("celery", 1, {}, tmp_path, redis_url, JOBS[:1])
    client = redis.Redis.from_url(redis_url)
    job = str(JOBS[0][0])

    async def no_call() -> set[str]:
        return {job}

    watch = fleet.lost_messages(no_call)
    assert watch is not None
    suspects: set[str] = set()
    for _ in range(2 * MAX_REPUBLISH + 4):
        suspects = await watch.scan(suspects)
        client.delete(fleet.queue_name)  # lost each time, as a task failing before its call
    assert watch.republished == {job: MAX_REPUBLISH}
    client.close()


def test_arq_has_no_watch(redis_url: str, tmp_path: Path) -> None:
    async def none() -> set[str]:
        return set()

    assert QueueFleet("arq", 1, {}, tmp_path, redis_url, JOBS).lost_messages(none) is None


async def test_a_failed_publish_is_logged_and_the_next_scan_publishes(
        redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A scan never raises (a watch dead in the background would miss every later loss):
    the publish fails once, is not counted, and the next scan publishes."""
    job = str(JOBS[0][0])
    calls: list[set[str]] = []

    def publish(jobs: set[str]) -> None:
        calls.append(set(jobs))
        if len(calls) == 1:
            raise ConnectionError("broker went away")

    async def no_call() -> set[str]:
        return {job}

    watch = LostMessages(redis_url, "callwarden-demo-none", no_call, publish)
    suspects = await watch.scan(await watch.scan(set()))
    assert calls == [{job}]
    assert watch.count == 0
    assert "scan failed" in caplog.text
    assert "broker went away" in caplog.text
    await watch.scan(suspects)
    assert calls == [{job}, {job}]
    assert watch.republished == {job: 1}


async def test_an_unreachable_redis_or_database_skips_the_scan(tmp_path: Path) -> None:
    published: list[set[str]] = []

    async def down() -> set[str] | None:
        return None  # the database is unreachable

    async def no_call() -> set[str]:
        return {"j"}

    dead = LostMessages("redis://127.0.0.1:1/0", "q", no_call, published.append)
    assert await dead.scan({"j"}) == {"j"}  # Redis refused: suspects kept, nothing sent
    no_db = LostMessages("redis://127.0.0.1:1/0", "q", down, published.append)
    assert await no_db.scan({"j"}) == {"j"}
    assert published == []
