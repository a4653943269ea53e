"""``callwarden serve`` as a process, from outside: who may read what, on which listener,
and what an unauthenticated webhook POST can cost it.

The webhook listener is the one providers reach from the internet: it answers webhooks
and health probes only. The dashboard, the job pages (model output, raw provider answers),
``/metrics`` and the admin actions are on the operator listener, which binds 127.0.0.1 on
another port unless told otherwise; without a read token it answers only requests whose
``Host`` names it (a loopback name, its configured host, ``allowed_hosts``), so a
DNS-rebinding page in an operator's browser reads nothing. A bad ``Authorization`` header
is a 401 or 403, an admin action on a job that does not exist a 404, never a 500. A
compressed body is refused on the webhook routes before a byte of it is inflated, however
many ``Content-Encoding`` headers it carries: the server's memory does not move.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict

from callwarden.calls.callbacks import ensure_callback_token
from callwarden.database.db import Conn
from callwarden.database.jobs import create_job
from callwarden.database.write import append, load
from callwarden.events.types import CallStarted, TaskCreated
from tests.acceptance.conftest import ROOT

TOKEN = "listeners-admin"
MiB = 2**20


@dataclass(frozen=True)
class Served:
    pid: int
    webhooks: str
    operator: str | None


def environment(db_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLWARDEN_", "AWS_"))}
    env.update({"DATABASE_URL": db_url, "CALLWARDEN_ADMIN_TOKEN": TOKEN,
                "CALLWARDEN_MEDIA_DIR": str(tmp_path / "media"), **extra})
    return env


@asynccontextmanager
async def serve(env: dict[str, str], *args: str) -> AsyncIterator[Served]:
    """``callwarden serve --port 0`` as a process; its listeners (from its start line)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "serve", "--port", "0", *args, env=env,
        cwd=ROOT, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        assert line.startswith("callwarden serve on "), line
        operator = re.search(r"operator on (http://\S+)", line)
        yield Served(pid=proc.pid, webhooks=line.split()[3],
                     operator=operator.group(1) if operator else None)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), timeout=30)


async def kie_call(conn: Conn) -> tuple[uuid.UUID, str]:
    """An open KIE call with a callback token: (job, token)."""
    job = await create_job(conn, credits=5)
    now = datetime.now(UTC)
    p = (await append(conn, job, await load(conn, job), CallStarted(
        at=now, actor="worker:t", kind="kie-standard"))).projection
    await append(conn, job, p, TaskCreated(at=now, actor="worker:t", task_id=f"t-{job}"))
    token = await ensure_callback_token(conn, job)
    assert token is not None
    return job, token


async def status(http: aiohttp.ClientSession, method: str, url: str, **kw: object) -> int:
    async with http.request(method, url, **kw) as resp:  # type: ignore[arg-type]
        await resp.read()
        return resp.status


async def test_the_webhook_listener_serves_only_webhooks_and_health(
        db_url: str, conn: Conn, tmp_path: Path) -> None:
    """What the internet reaches answers 404 for every operator page; the operator
    listener (127.0.0.1 by default, its port from the environment) serves them all."""
    job, _ = await kie_call(conn)
    admin = {"Authorization": f"Bearer {TOKEN}"}
    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_PORT="0")
    async with serve(env) as served, aiohttp.ClientSession() as http:
        public = served.webhooks
        for path in ("/", "/jobs", f"/jobs/{job}", f"/jobs?q={job}", "/metrics",
                     "/static/callwarden.css"):
            assert (path, await status(http, "GET", public + path)) == (path, 404)
        assert await status(http, "POST", f"{public}/admin/jobs/{job}/force-fail",
                            headers=admin) == 404
        assert await status(http, "GET", f"{public}/healthz") == 200
        assert await status(http, "GET", f"{public}/readyz") == 200
        assert await status(http, "POST", f"{public}/webhooks/replicate", data=b"{}") == 401

        operator = served.operator
        assert operator is not None
        assert operator.startswith("http://127.0.0.1:")
        assert operator != public
        assert await status(http, "GET", f"{operator}/") == 200
        async with http.get(f"{operator}/jobs") as resp:
            assert resp.status == 200
            assert str(job) in await resp.text()
        async with http.get(f"{operator}/jobs/{job}") as resp:
            assert resp.status == 200
            assert "TaskCreated" in await resp.text()
        async with http.get(f"{operator}/metrics") as resp:
            assert resp.status == 200
            assert "callwarden_calls{" in await resp.text()
        assert await status(http, "GET", f"{operator}/static/callwarden.css") == 200
        assert await status(http, "POST", f"{operator}/webhooks/replicate",
                            data=b"{}") == 404
        assert await status(http, "POST", f"{operator}/admin/jobs/{job}/force-fail",
                            headers=admin) == 200
    assert (await load(conn, job)).state == "cancelled"


def rss_bytes(pid: int) -> int:
    """The process's resident set size, from /proc."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def counts(conn: Conn) -> tuple[int, int]:
    row = await (await conn.execute(
        "SELECT (SELECT count(*) FROM callwarden.call_events) AS events, "
        "(SELECT count(*) FROM callwarden.webhook_deliveries) AS deliveries")).fetchone()
    assert row is not None
    return row["events"], row["deliveries"]


async def test_a_gzip_bomb_to_a_webhook_route_is_refused_without_being_inflated(
        db_url: str, conn: Conn, tmp_path: Path) -> None:
    """50 MiB of zeros, gzipped to about 50 KiB, to every webhook route (a real KIE
    callback URL with its token included): refused 415, the server's memory does not
    grow by the inflated size, nothing is recorded."""
    job, token = await kie_call(conn)
    bomb = gzip.compress(bytes(50 * MiB), compresslevel=9)
    assert len(bomb) < MiB  # under the body limit as sent: only inflating it is the danger
    env = environment(db_url, tmp_path, CALLWARDEN_REPLICATE_WEBHOOK_SECRET="whsec_" + "A" * 32,
                      CALLWARDEN_ELEVENLABS_WEBHOOK_SECRET="sek")
    before_rows = await counts(conn)
    async with serve(env, "--operator-port", "0") as served, \
            aiohttp.ClientSession(auto_decompress=False) as http:
        routes = ("/webhooks/replicate", "/webhooks/elevenlabs",
                  f"/webhooks/kie/{job}/{token}")
        assert await status(http, "GET", f"{served.webhooks}/healthz") == 200
        baseline = rss_bytes(served.pid)
        encodings: list[tuple[str, ...]] = [
            ("gzip",), ("deflate",), ("br",), ("GZIP",), ("gzip, identity",),
            ("identity", "gzip"), ("gzip", "identity"), ("identity", "identity, br")]
        for encoding in encodings:  # one header, or several (each one counts)
            for route in routes:
                headers = CIMultiDict([("Content-Type", "application/json"),
                                       *(("Content-Encoding", e) for e in encoding)])
                async with http.post(served.webhooks + route, data=bomb,
                                     headers=headers) as resp:
                    assert (route, encoding, resp.status) == (route, encoding, 415)
                    assert (await resp.json())["result"] == "unsupported_encoding"
        grown = rss_bytes(served.pid) - baseline
    assert grown < 8 * MiB, f"serve grew by {grown / MiB:.1f} MiB"
    assert await counts(conn) == before_rows
    assert (await load(conn, job)).state == "polling"


async def raw_status(base: str, head: bytes) -> int:
    """The status of one request written byte for byte to ``base`` (a header may carry any
    byte, as a hostile client's can), ``Connection: close``."""
    url = urlsplit(base)
    assert url.hostname is not None
    assert url.port is not None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(url.hostname, url.port), timeout=10)
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()
        await writer.wait_closed()
    return int(answer.split(b" ", 2)[1])


async def test_without_a_read_token_the_operator_answers_only_to_its_own_names(
        db_url: str, conn: Conn, tmp_path: Path) -> None:
    """DNS rebinding: a page at attacker.example whose name then resolves to 127.0.0.1
    reaches the operator listener from the operator's browser with ``Host:
    attacker.example``. Without a read token, every operator route but the probes answers
    421 to a Host that is not loopback, the listener's host or in ``allowed_hosts``
    (``CALLWARDEN_SERVE_ALLOWED_HOSTS``); with a read token the token decides."""
    job, _ = await kie_call(conn)
    task = f"t-{job}"  # on the job page, and in the call list
    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_PORT="0",
                      CALLWARDEN_SERVE_ALLOWED_HOSTS="ops.internal, Dash.Example.")
    admin = {"Authorization": f"Bearer {TOKEN}"}
    async with serve(env) as served, aiohttp.ClientSession() as http:
        operator = served.operator
        assert operator is not None
        port = urlsplit(operator).port
        refused = ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io",
                   "localhost.attacker.example", f"evil@127.0.0.1:{port}", "ops.internal.evil",
                   "[::2]", "0x7f000001")
        for host in refused:
            for path in ("/", "/jobs", f"/jobs/{job}", f"/jobs?q={task}", "/metrics",
                         "/static/callwarden.css", "/overview/live"):
                async with http.get(operator + path, headers={"Host": host},
                                    allow_redirects=False) as resp:
                    body = await resp.text()
                    assert (host, path, resp.status) == (host, path, 421)
                    assert task not in body
            for action in ("force-fail", "requeue-reconcile"):
                async with http.post(f"{operator}/admin/jobs/{job}/{action}",
                                     headers={**admin, "Host": host}) as resp:
                    assert (host, action, resp.status) == (host, action, 421)
            for probe in ("/healthz", "/readyz"):  # the orchestrator's probes stay open
                async with http.get(operator + probe, headers={"Host": host}) as resp:
                    assert (host, probe, resp.status) == (host, probe, 200)
        no_host = f"GET /jobs/{job} HTTP/1.0\r\n\r\n".encode()
        assert await raw_status(operator, no_host) == 421
        accepted = (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST",
                    f"[::1]:{port}", "127.8.9.10", "ops.internal", f"OPS.internal:{port}",
                    "dash.example", "localhost.")
        for host in accepted:
            async with http.get(f"{operator}/jobs/{job}", headers={"Host": host}) as resp:
                assert (host, resp.status) == (host, 200)
                assert task in await resp.text()
        async with http.post(f"{operator}/admin/jobs/{job}/requeue-reconcile",
                             headers={**admin, "Host": "ops.internal"}) as resp:
            assert resp.status == 200
    assert (await load(conn, job)).state == "polling"  # nothing a refused host sent acted

    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_PORT="0",
                      CALLWARDEN_READ_TOKEN="reader")
    async with serve(env) as served, aiohttp.ClientSession() as http:
        assert served.operator is not None
        async with http.get(f"{served.operator}/jobs/{job}", headers={
                "Host": "attacker.example"}) as resp:
            assert resp.status == 401  # a rebinding page has no token
        async with http.get(f"{served.operator}/jobs/{job}", headers={
                "Host": "ops.example", "Authorization": "Bearer reader"}) as resp:
            assert resp.status == 200  # any name, with the token


async def test_a_bad_authorization_header_is_refused_never_a_500(
        db_url: str, conn: Conn, tmp_path: Path) -> None:
    """``Authorization`` bytes that are not UTF-8 (a hostile client's; aiohttp keeps them
    as surrogates) against the read token and the admin token: 401 and 403, the job
    untouched. Valid non-ASCII text is refused the same way."""
    job, _ = await kie_call(conn)
    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_PORT="0",
                      CALLWARDEN_READ_TOKEN="reader")
    async with serve(env) as served:
        operator = served.operator
        assert operator is not None
        for value in (b"Bearer \xff\xfe", b"Bearer reader\xff", b"Basic \xff",
                      "Bearer r\u00e9ader".encode(), b"\xff\xfe"):
            head = (b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + value
                    + b"\r\nConnection: close\r\n\r\n")
            assert (value, await raw_status(operator, head)) == (value, 401)
            for action in ("force-fail", "requeue-reconcile"):
                # the admin's header is the read guard's too: refused there, 401
                head = (f"POST /admin/jobs/{job}/{action} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        f"Content-Length: 0\r\nConnection: close\r\n".encode()
                        + b"Authorization: " + value + b"\r\n\r\n")
                assert (value, await raw_status(operator, head)) == (value, 401)
    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_PORT="0")  # no read token
    async with serve(env) as served:
        assert served.operator is not None
        admin = f"Authorization: Bearer {TOKEN}\r\n".encode()
        for extra in (b"Authorization: Bearer \xff\xfe\r\n",
                      f"Authorization: Bearer {TOKEN}\xff\r\n".encode("latin-1"),
                      admin + b"Origin: http://[\r\n",  # no URL: not this origin either
                      admin + b"Origin: http://\xff\r\n"):
            head = (f"POST /admin/jobs/{job}/force-fail HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Length: 0\r\nConnection: close\r\n".encode()
                    + extra + b"\r\n")
            assert (extra, await raw_status(served.operator, head)) == (extra, 403)
    assert (await load(conn, job)).state == "polling"


async def test_allowed_hosts_takes_names_only(db_url: str, tmp_path: Path) -> None:
    """An entry with a port, a scheme or a wildcard stops serve before it listens, naming
    the setting (a name that never matches would pass silently)."""
    for bad in ("ops.internal:8001", "http://ops.internal", "*.example.com"):
        env = environment(db_url, tmp_path, CALLWARDEN_SERVE_ALLOWED_HOSTS=f"localhost,{bad}")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "callwarden.cli", "serve", "--port", "0",
            "--operator-port", "0", env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 2, err
        assert "CALLWARDEN_SERVE_ALLOWED_HOSTS" in err.decode(), err
        assert repr(bad) in err.decode(), err


async def test_an_open_operator_door_is_refused_unless_said(db_url: str,
                                                             tmp_path: Path) -> None:
    """The operator listener (every call's output, raw answers, /metrics) on a
    non-loopback address with no read token: serve exits 2 before it listens, naming the
    settings that fix it (issue 40, item 6); ``check`` calls it a problem. Before, serve
    logged a warning and served it to anyone sending ``Host: localhost``."""
    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_HOST="10.0.0.5")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "serve", "--port", "0",
        "--operator-port", "0", env=env, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    said = " ".join(err.decode().split())
    assert proc.returncode == 2, said
    for named in ("binds 10.0.0.5 with no read token", "set CALLWARDEN_READ_TOKEN",
                  "--open-operator"):
        assert named in said, said
    check = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "check", env=env, cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(check.communicate(), timeout=60)
    assert check.returncode == 2
    assert "[serve] operator listener: the operator listener" in " ".join(
        err.decode().split())
    # a read token in the variable serve is told to read: no problem
    check = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "callwarden.cli", "check", "--read-token-env", "OPS_TOKEN",
        env={**env, "OPS_TOKEN": "t0ken"}, cwd=ROOT, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(check.communicate(), timeout=60)
    assert check.returncode == 0, err.decode()


async def test_an_admin_action_on_a_job_that_does_not_exist_is_a_404(
        db_url: str, conn: Conn, tmp_path: Path) -> None:
    """With the admin token, both actions on a job id this database does not have: 404,
    nothing written."""
    before = await (await conn.execute(
        "SELECT (SELECT count(*) FROM jobs) AS jobs, "
        "(SELECT count(*) FROM callwarden.call_events) AS events")).fetchone()
    env = environment(db_url, tmp_path, CALLWARDEN_SERVE_OPERATOR_PORT="0")
    async with serve(env) as served, aiohttp.ClientSession() as http:
        for action in ("force-fail", "requeue-reconcile"):
            async with http.post(f"{served.operator}/admin/jobs/{uuid.uuid4()}/{action}",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
                assert (action, resp.status) == (action, 404)
                assert "no job" in await resp.text()
    after = await (await conn.execute(
        "SELECT (SELECT count(*) FROM jobs) AS jobs, "
        "(SELECT count(*) FROM callwarden.call_events) AS events")).fetchone()
    assert after == before
