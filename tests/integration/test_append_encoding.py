"""What an append sends is what the log and the asset rows hold, whatever the text: the
run's events go to Postgres as one jsonb array and the asset rows as another (issue 26),
so no character may be lost, doubled or escaped twice on the way.

Real Postgres; the events and assets are Hypothesis' own draws.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callwarden.database.clock import utcnow
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load, load_events, load_stored
from callwarden.events.states import LEGACY_KIND, CallState
from callwarden.events.types import (
    Adopted,
    CallStarted,
    Completed,
    FinalizeClaimed,
    StoredMedia,
    TaskCreated,
    UpstreamResult,
    UpstreamSucceeded,
)
from callwarden.projections.fold import EMPTY, fold

# Any text (NUL aside: the write path makes it U+FFFD, tested on its own), and the
# characters an array literal or a JSON text must escape, drawn often.
_nasty = st.sampled_from(['"', "\\", "{", "}", ",", "'", "\n", "\t", "NULL", "\\u0041",
                          "\u2603", "\U0001f600", "$1", "%(x)s"])
_text = st.lists(st.characters(codec="utf-8", exclude_characters="\x00") | _nasty,
                 max_size=12).map("".join)
_raw = st.dictionaries(_text, _text | st.integers() | st.none(), max_size=4)
_media = st.builds(StoredMedia, key=_text, url=_text, content_type=_text,
                   size=st.integers(0, 2**53))


@given(actor=_text, text=st.none() | _text, raw=_raw, urls=st.lists(_text, max_size=3),
       media=st.lists(_media, max_size=3, unique_by=lambda m: m.key))
async def test_a_completing_run_is_stored_exactly_as_appended(
        conn: Conn, actor: str, text: str | None, raw: dict[str, object], urls: list[str],
        media: list[StoredMedia]) -> None:
    """For any actor, result text, raw answer, media URLs and asset rows (any Unicode but
    NUL, and every character an array literal or JSON escapes), the events read back from
    the log equal the events appended, the row's projection equals their fold, and the
    job's asset rows hold exactly the keys, URLs, types and sizes given."""
    job = await create_job(conn, credits=5)
    now = utcnow()
    p = (await append(conn, job, EMPTY, CallStarted(at=now, actor=actor, kind="kie-standard",
                                                     sync=False))).projection
    p = (await append(conn, job, p, TaskCreated(at=now, actor=actor, task_id=f"{text}-{job}"))
         ).projection
    run = (UpstreamSucceeded(at=now, actor=actor, result=UpstreamResult(
               media_urls=tuple(urls), text=text, raw=raw)),
           FinalizeClaimed(at=now, actor=actor, owner=actor,
                           lease_until=now + timedelta(minutes=5)),
           Completed(at=now, actor=actor, media=tuple(media), text=text))
    done = await append(conn, job, p, run, assets=media)
    assert done.ok
    events = await load_events(conn, job)
    assert events[2:] == list(run)
    assert (await load_stored(conn, job)).version == fold(events).version == 5
    rows = await (await conn.execute(
        "SELECT storage_key, url, content_type, size_bytes FROM assets WHERE job_id = %s",
        (job,))).fetchall()
    assert sorted((r["storage_key"], r["url"], r["content_type"], r["size_bytes"])
                  for r in rows) == sorted((m.key, m.url, m.content_type, m.size)
                                           for m in media)


async def test_a_run_is_one_parameter_whatever_its_length(conn: Conn) -> None:
    """A provider's answer of a few hundred kilobytes, mostly characters a text[] element
    escapes, is stored and read back whole."""
    job = await create_job(conn, credits=5)
    now = utcnow()
    raw = {f'k"{i}\\': ['"\\' * 50, {"n": i}] for i in range(2000)}
    p = (await append(conn, job, EMPTY, CallStarted(at=now, actor="w", kind="kie-standard",
                                                     sync=False))).projection
    p = (await append(conn, job, p, TaskCreated(at=now, actor="w", task_id=f"t-{job}"))).projection
    r = await append(conn, job, p, UpstreamSucceeded(at=now, actor="w",
                                                      result=UpstreamResult(raw=raw)))
    assert r.ok
    got = (await load_events(conn, job))[-1]
    assert isinstance(got, UpstreamSucceeded)
    assert got.result.raw == raw


async def test_assets_come_only_with_a_completed(conn: Conn) -> None:
    """append_completion's shape fences on the host's open status (a host's decision is
    never a completion): asked of a run without a Completed, the append refuses before it
    writes."""
    job = await create_job(conn, credits=5)
    now = utcnow()
    p = (await append(conn, job, EMPTY, CallStarted(at=now, actor="w", kind="kie-standard",
                                                     sync=False))).projection
    media = [StoredMedia(key="k", url="u", content_type="image/png", size=1)]
    with pytest.raises(ValueError, match="only with a Completed"):
        await append(conn, job, p, TaskCreated(at=now, actor="w", task_id=f"t-{job}"),
                     assets=media)
    assert [type(e).__name__ for e in await load_events(conn, job)] == ["CallStarted"]
    assert (await load_stored(conn, job)).version == 1


async def test_a_legacy_call_adopted_with_its_task_completes_keeping_the_hosts_seed(
        conn: Conn) -> None:
    """A row from before the call columns, with the host's task on it, adopted as legacy
    (the fold leaves its seed columns the host's): its completion with media is recorded
    (append_completion_host_seed), and the host's task id and empty kind stay as they were."""
    job = await create_job(conn, credits=5, status="processing")
    task = f"host-task-{job}"
    await conn.execute("UPDATE jobs SET provider_task_id = %s WHERE id = %s", (task, job))
    now = utcnow()
    p = (await append(conn, job, await load(conn, job), Adopted(
        at=now, actor="r", kind=LEGACY_KIND, task_id=task))).projection
    assert p.provider_kind is None
    media = [StoredMedia(key=f"media/{job}/0.png", url="file:///m/0.png",
                         content_type="image/png", size=3)]
    run = (UpstreamSucceeded(at=now, actor="r", result=UpstreamResult(media_urls=("u",))),
           FinalizeClaimed(at=now, actor="r", owner="r", lease_until=now + timedelta(minutes=5)),
           Completed(at=now, actor="r", media=tuple(media)))
    done = await append(conn, job, p, run, assets=media)
    assert done.ok
    assert done.projection.state is CallState.COMPLETED
    stored = await (await conn.execute(
        "SELECT j.provider_kind, j.provider_task_id, j.status, u.status AS credits, "
        "(SELECT count(*) FROM assets a WHERE a.job_id = j.id) AS assets "
        "FROM jobs j JOIN usage_logs u ON u.job_id = j.id WHERE j.id = %s", (job,))).fetchone()
    assert stored is not None
    assert (stored["provider_kind"], stored["provider_task_id"], stored["status"],
            stored["credits"], stored["assets"]) == (None, task, "completed", "committed", 1)
