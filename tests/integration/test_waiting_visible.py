"""A job over a provider account's limit is visible as waiting, with the reason (issue 42,
item 3): a start refused by the account's limits writes nothing to the job (its call has
not started, so the call list never shows it), only its ``callwarden.waiting`` row; from
that row ``callwarden jobs --state waiting``, the dashboard (the overview's card and the
``/waiting`` page) and ``/metrics`` (``callwarden_jobs_waiting``,
``callwarden_waiting_oldest_seconds``) show it, until the start that admits it; a job
ended while it waited is not waiting any more, even with its row left behind. The
overview's Limits card shows each account's caps beside its calls in flight, and a slow
down after the provider's 429s. Rows are written by plain SQL, as a host would
(``callwarden.start_call``)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from callwarden.cli.jobs import GROUPS, WAITING
from callwarden.database.db import Conn, open_pool
from callwarden.service.app import ServiceConfig
from callwarden.service.dashboard.waiting import retry_in, waiting_card, waiting_page
from tests.service import running_service
from tests.support.audit import cli

KIND = "kie-standard"
ACCOUNT = "kie-main"
KEYS = ["id", "user_id", "account", "reason", "status", "created_at", "since", "age_s",
        "retry_at", "retry_in_s", "refusals"]
EVIL = '<script>alert("x")</script>&'


@pytest.fixture
async def base(db_url: str, tmp_path: Path) -> AsyncIterator[str]:
    """The operator listener (dashboard and /metrics) of a service over the test's database."""
    async with open_pool(db_url, max_size=4) as pool, running_service(
            pool, tmp_path, ServiceConfig()) as urls:
        yield urls.operator


async def one(conn: Conn, sql: str, *args: Any) -> dict[str, Any]:
    row = await (await conn.execute(sql, args)).fetchone()
    assert row is not None
    return dict(row)


async def new_job(conn: Conn, user: str = "u1") -> uuid.UUID:
    row = await one(conn, "SELECT callwarden.create_job(%s, 5::numeric) AS id", user)
    return uuid.UUID(str(row["id"]))


async def start(conn: Conn, job: uuid.UUID) -> str:
    row = await one(conn, "SELECT * FROM callwarden.start_call(%s, %s, 'node:1')", job, KIND)
    return str(row["action"])


async def full_account(conn: Conn) -> tuple[uuid.UUID, uuid.UUID]:
    """A limit of one call in flight, one call started, and a second job refused (waiting)."""
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight) "
                       "VALUES ('kie-main', ARRAY['kie-standard'], 1)")
    first, second = await new_job(conn), await new_job(conn, "u2")
    assert await start(conn, first) == "create"
    assert await start(conn, second) == "wait"
    return first, second


async def jobs_cli(db_url: str, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    """``callwarden jobs`` in-process (on a thread: it runs its own event loop)."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli, db_url, monkeypatch, "jobs", *flags)
    out, err = capsys.readouterr()
    return code, out, err


async def gauges(http: aiohttp.ClientSession, base: str) -> dict[tuple[str, str], float]:
    """``/metrics``' waiting samples: (name, account) -> value."""
    async with http.get(f"{base}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return {(s.name, s.labels["account"]): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name in ("callwarden_jobs_waiting", "callwarden_waiting_oldest_seconds")}


def waiting_ids(html: str) -> list[str]:
    return re.findall(r'<td><a href="/jobs/([0-9a-f-]{36})"', html)


async def test_a_refused_job_is_listed_waiting_everywhere_until_its_start(
        conn: Conn, db_url: str, base: str, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The job a full account refused is listed by ``jobs --state waiting --json`` (stable
    keys, the reason, the account, one refusal), not by the call list; the dashboard's
    /waiting page and the overview's card show it with the reason and the retry; the
    gauge says 1 for the account. Once the first call is cancelled and the second job
    started, nothing is listed waiting, the card is gone and the gauges are 0."""
    monkeypatch.setenv("COLUMNS", "80")
    first, second = await full_account(conn)

    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [r["id"] for r in rows] == [str(second)]
    assert list(rows[0]) == KEYS
    row = rows[0]
    assert (row["user_id"], row["account"], row["reason"], row["status"], row["refusals"]) == (
        "u2", ACCOUNT, "kie-main: 1 of 1 calls in flight", "pending", 1)
    assert 0 <= row["age_s"] < 60
    assert 0 <= row["retry_in_s"] <= 2  # the account's wait_s (default 2)
    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--json")
    assert (code, [r["id"] for r in json.loads(out)]) == (0, [str(first)])  # started only
    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80, out
    line = next(ln for ln in out.splitlines() if ln.startswith(str(second)[:8]))
    assert re.search(r"\bu2 +kie-main +\d+ m?s +([0-9.]+ m?s|due) +1  1 of 1 calls in flight",
                     line), line
    assert "1 job(s) waiting" in out

    async with http.get(f"{base}/waiting") as resp:
        assert resp.status == 200
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        page = await resp.text()
    assert waiting_ids(page) == [str(second)]
    assert "kie-main: 1 of 1 calls in flight" in page
    assert re.search(r"<td>(in [0-9.]+ (ms|s)|due)</td>", page)  # the retry
    async with http.get(f"{base}/") as resp:
        home = await resp.text()
    assert "Waiting for a slot: 1 job(s)" in home
    assert "kie-main: 1 of 1 calls in flight" in home
    assert 'href="/waiting"' in home
    metrics = await gauges(http, base)
    assert metrics[("callwarden_jobs_waiting", ACCOUNT)] == 1
    assert 0 <= metrics[("callwarden_waiting_oldest_seconds", ACCOUNT)] < 60

    assert (await one(conn, "SELECT * FROM callwarden.cancel(%s, 'admin')", first))["ok"]
    assert await start(conn, second) == "create"

    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting", "--json")
    assert (code, json.loads(out)) == (0, [])
    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting")
    assert (code, "no job waits for a slot" in out) == (0, True)
    async with http.get(f"{base}/waiting") as resp:
        page = await resp.text()
    assert waiting_ids(page) == []
    assert "no job waits for a slot" in page
    async with http.get(f"{base}/overview/live") as resp:
        assert "Waiting for a slot" not in await resp.text()
    metrics = await gauges(http, base)
    assert metrics[("callwarden_jobs_waiting", ACCOUNT)] == 0
    assert metrics[("callwarden_waiting_oldest_seconds", ACCOUNT)] == 0


async def test_refusals_count_and_an_ended_job_stops_waiting(
        conn: Conn, db_url: str, base: str, http: aiohttp.ClientSession,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A job refused again shows its refusals counted; the list is the longest waiting
    first and takes --user and --kind (the account whose kinds hold it); a waiting job
    the host cancels is listed and counted no more, although its row is left."""
    _, second = await full_account(conn)
    third = await new_job(conn, "u3")
    assert await start(conn, third) == "wait"
    assert await start(conn, second) == "wait"  # refused again

    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [(r["id"], r["refusals"]) for r in rows] == [(str(second), 2), (str(third), 1)]
    for flags, expect in ((["--user", "u3"], [third]), (["--kind", KIND], [second, third]),
                          (["--kind", "kie-veo"], []), (["--limit", "1"], [second])):
        code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting",
                                      "--json", *flags)
        assert (flags, code, [r["id"] for r in json.loads(out)]) == (
            flags, 0, [str(j) for j in expect])
    assert (await gauges(http, base))[("callwarden_jobs_waiting", ACCOUNT)] == 2

    assert (await one(conn, "SELECT * FROM callwarden.cancel(%s, 'host')", third))["ok"]
    left = await one(conn, "SELECT count(*) AS n FROM callwarden.waiting WHERE job_id = %s",
                     third)
    assert left["n"] == 1  # the row stays; the job no longer waits
    code, out, _ = await jobs_cli(db_url, monkeypatch, capsys, "--state", "waiting", "--json")
    assert (code, [r["id"] for r in json.loads(out)]) == (0, [str(second)])
    async with http.get(f"{base}/waiting") as resp:
        assert waiting_ids(await resp.text()) == [str(second)]
    assert (await gauges(http, base))[("callwarden_jobs_waiting", ACCOUNT)] == 1


@pytest.mark.parametrize("flags", [
    ["--state", "waiting,open"], ["--state", "waiting", "--state", "failed"],
    ["--state", "waiting", "--ended-by", "admin"], ["--state", "waiting", "--error", "x"]])
async def test_filters_a_waiting_job_cannot_match_are_refused(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        flags: list[str]) -> None:
    """``--state waiting`` is listed alone: with a call state, ``--ended-by`` or ``--error``
    (a waiting job has no call) the command exits 2 naming the conflict; ``open`` does
    not include ``waiting``."""
    code, _, err = await jobs_cli(db_url, monkeypatch, capsys, *flags)
    assert code == 2
    assert "waiting" in err
    assert WAITING not in GROUPS["open"]
    assert WAITING not in GROUPS["terminal"]


def test_the_card_and_the_page_escape_and_redact_what_they_show() -> None:
    """The overview's card is empty while no job waits; shown, it and the /waiting page
    escape the account and the reason and redact a credential a host wrote in a reason;
    a retry time passed reads "due"."""
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert waiting_card([{"account": "a", "jobs": 0, "oldest": None, "next_retry": None,
                          "reasons": []}], now) == ""
    reason = f"{EVIL} Bearer sk-live-abcdefghijklmnop"
    card = waiting_card([{"account": EVIL, "jobs": 3, "oldest": now - timedelta(minutes=2),
                          "next_retry": now + timedelta(seconds=2),
                          "reasons": [reason, "b", "c", "d"]}], now)
    page = waiting_page([{"id": uuid.uuid4(), "user_id": EVIL, "account": EVIL,
                          "since": now - timedelta(seconds=5), "retry_at": now,
                          "refusals": 2, "reason": reason}], now)
    for html in (card, page):
        assert "<script>" not in html
        assert "&lt;script&gt;" in html
        assert "sk-live-abcdefghijklmnop" not in html
    assert "Waiting for a slot: 3 job(s)" in card
    assert "2 min" in card
    assert "(+1 more)" in card
    assert retry_in(now, now) == "due"
    assert retry_in(now + timedelta(seconds=2), now) == "in 2.0 s"


def limits_card_of(html: str) -> str:
    """The overview's Limits card (its section), or "" when the page has none."""
    at = html.find('aria-labelledby="limits-h"')
    return "" if at < 0 else html[at:html.index("</section>", at)]


async def test_the_overview_shows_each_accounts_cap_and_calls_in_flight(
        conn: Conn, base: str, http: aiohttp.ClientSession) -> None:
    """Proves the overview's Limits card (issue 42, item 1) over HTTP: absent while
    ``callwarden.limits`` is empty; with a row a host wrote by SQL (3 in flight, 2 per
    user, 20 creates per 10 s) and two calls started, the page (served with its CSP) shows
    the account, its kinds, ``2 / 3`` in flight, the per-user cap and the creates, at full
    rate; after the provider's 429 (``callwarden.slow_down``, 30 s) the live fragment
    shows the rate halved, the cap it admits now (``2 / 1 of 3``) and the pause left."""
    async with http.get(f"{base}/") as resp:
        assert limits_card_of(await resp.text()) == ""
    await conn.execute("INSERT INTO callwarden.limits (account, kinds, in_flight, "
                       "tenant_in_flight, creates, per_s) VALUES ('kie-main', "
                       "ARRAY['kie-standard', 'kie-veo'], 3, 2, 20, 10)")
    for user in ("u1", "u2"):
        assert await start(conn, await new_job(conn, user)) == "create"

    async with http.get(f"{base}/") as resp:
        assert resp.status == 200
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        card = limits_card_of(await resp.text())
    assert "Limits: 1 provider account(s)" in card
    for cell in ("<td>kie-main</td>", '<td class="long">kie-standard, kie-veo</td>',
                 "<td>2 / 3</td>", "<td>2</td>", "<td>20 per 10 s</td>", "<td>full</td>",
                 '<td class="muted">-</td>'):  # not paused
        assert cell in card, (cell, card)

    await one(conn, "SELECT * FROM callwarden.slow_down(%s, 30)", KIND)
    async with http.get(f"{base}/overview/live") as resp:
        card = limits_card_of(await resp.text())
    assert "<td>2 / 1 of 3</td>" in card, card
    assert "<td>slowed to \u00d70.50 by the provider&#x27;s 429s</td>" in card, card
    assert re.search(r"<td>(29|30) s left</td>", card), card
