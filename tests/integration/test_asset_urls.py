"""``assets.url`` is what the media store says the host serves (issue 41 item 6): read by
SQL after a real completion (the runner, the simulator's KIE, a file stored).

- a local folder given a public base URL (``base_url=``, ``CALLWARDEN_MEDIA_BASE_URL``):
  ``<base_url>/<job>/0.png``, the file's path under the folder;
- a local folder without one: the file's ``file://`` URI, absolute and normalised (a
  root given as ``x/../media`` is written as ``.../media/...``; before, the ``..`` stayed);
- an S3 bucket (moto's server) with a base URL: ``<base_url>/<prefix>/media/<job>/0.png``,
  the object's key under it; without one, its ``s3://`` URI."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from moto.server import ThreadedMotoServer

from callwarden.calls.runner import CallRunner
from callwarden.database.db import Conn, Pool
from callwarden.database.jobs import create_job
from callwarden.providers.simulator.core import RunningSimulator
from callwarden.providers.storage import (
    LocalFolderStore,
    MediaStore,
    S3Store,
    make_s3_client,
    media_from_env,
)
from tests.support import no_sleep

KIE_REQ = {"model": "nano-banana-pro", "input": {"prompt": "a cat"}}
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}


async def asset_url(conn: Conn, pool: Pool, http: aiohttp.ClientSession,
                    sim: RunningSimulator, media: MediaStore) -> tuple[uuid.UUID, str]:
    """One job completed through ``media``; its one asset's ``url``, read by SQL."""
    job = await create_job(conn, input_data={"prompt": "a cat"}, credits=10)
    async with CallRunner(pool, http, sim.settings, media, sleep=no_sleep) as runner:
        out = await runner.run(job, "kie-standard", KIE_REQ)
    assert out.result == "completed", out
    rows = await (await conn.execute("SELECT url FROM assets WHERE job_id = %s",
                                     (job,))).fetchall()
    assert len(rows) == 1
    return job, str(rows[0]["url"])


async def test_a_local_folder_with_a_base_url_writes_the_url_the_host_serves(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    media = media_from_env({"CALLWARDEN_MEDIA_DIR": str(tmp_path / "media"),
                            "CALLWARDEN_MEDIA_BASE_URL": "https://media.acme.example/files/"},
                           default_dir=tmp_path)
    job, url = await asset_url(conn, pool, http, sim, media)
    assert url == f"https://media.acme.example/files/{job}/0.png"
    assert (tmp_path / "media" / str(job) / "0.png").is_file()  # what that URL serves


async def test_a_local_folder_without_one_writes_a_normalised_file_uri(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    job, url = await asset_url(conn, pool, http, sim,
                               LocalFolderStore(tmp_path / "elsewhere" / ".." / "media"))
    assert url == (tmp_path / "media" / str(job) / "0.png").as_uri()
    assert ".." not in url


@pytest.fixture
def moto_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.mark.parametrize("base_url", ["https://cdn.acme.example", None])
async def test_an_s3_bucket_writes_its_object_url_as_configured(
        conn: Conn, pool: Pool, http: aiohttp.ClientSession, sim: RunningSimulator,
        moto_endpoint: str, base_url: str | None) -> None:
    bucket = f"cw-test-{uuid.uuid4().hex[:12]}"
    s3 = S3Store(bucket, prefix="renders", base_url=base_url, client=make_s3_client(
        endpoint_url=moto_endpoint, region="us-east-1", env=AWS))
    await s3.ensure_bucket()
    job, url = await asset_url(conn, pool, http, sim, s3)
    key = f"renders/media/{job}/0.png"
    assert url == (f"{base_url}/{key}" if base_url else f"s3://{bucket}/{key}")
    assert await s3.exists(f"media/{job}/0.png")


def test_a_base_url_with_a_query_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CALLWARDEN_MEDIA_BASE_URL"):
        media_from_env({"CALLWARDEN_MEDIA_BASE_URL": "https://cdn.example/?sig=1"},
                       default_dir=tmp_path)
