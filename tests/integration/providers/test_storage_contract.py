"""One contract for every MediaStore adapter: a local folder and S3 (moto's server over HTTP)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from callwarden.providers.errors import StorageError
from callwarden.providers.storage import (
    InvalidMediaKey,
    LocalFolderStore,
    MediaStore,
    ObjectNotFound,
    S3Store,
    media_from_env,
    media_key,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"first" * 50
MP3 = b"ID3" + b"second" * 70

DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Dummy credentials for this test only; no shared config files are read."""
    for name, value in DUMMY_AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    return DUMMY_AWS


def _bucket() -> str:
    return f"cw-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["local", "s3"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, moto_endpoint: str, aws_env: dict[str, str]
) -> AsyncIterator[MediaStore]:
    if request.param == "local":
        yield LocalFolderStore(tmp_path / "media-root")
        return
    s3 = S3Store(_bucket(), endpoint_url=moto_endpoint, region="us-east-1", prefix="cw")
    await s3.ensure_bucket()
    yield s3


# --------------------------------------------------------------------------- the contract


async def test_put_then_get_returns_the_same_bytes(store: MediaStore) -> None:
    key = media_key("job-1", 0, "image/png")
    stored = await store.put(key, PNG, "image/png")
    assert await store.get(key) == PNG
    assert (stored.key, stored.size, stored.sha256) == (key, len(PNG),
                                                        hashlib.sha256(PNG).hexdigest())


async def test_head_reports_what_is_stored(store: MediaStore) -> None:
    key = media_key("job-2", 1, "audio/mpeg")
    stored = await store.put(key, MP3, "audio/mpeg")
    assert await store.head(key) == stored


async def test_content_type_is_kept_even_when_the_key_says_otherwise(store: MediaStore) -> None:
    key = media_key("job-3", 0, "application/octet-stream")  # ".bin"
    await store.put(key, MP3, "audio/mpeg")
    assert (await store.head(key)).content_type == "audio/mpeg"


@pytest.mark.parametrize("key", ["media/job-15/0.wav", "media/job-15/blob"])
async def test_each_put_keeps_its_own_type_whether_or_not_the_key_names_it(
    store: MediaStore, key: str
) -> None:
    """``.wav`` names ``audio/wav``; ``audio/x-wav`` under the same key, before and after
    it, and any type under a key with no extension, read back as put."""
    for content_type in ("audio/x-wav", "audio/wav", "audio/x-wav", "audio/wav"):
        await store.put(key, MP3, content_type)
        assert (await store.head(key)).content_type == content_type


async def test_repeated_put_to_the_same_key_overwrites(store: MediaStore) -> None:
    first = await store.put(media_key("job-4", 0, "image/png"), PNG, "image/png")
    second = await store.put(media_key("job-4", 0, "image/png"), PNG[:9] + b"retry", "image/png")
    assert (second.key, second.uri) == (first.key, first.uri)
    assert await store.get(first.key) == PNG[:9] + b"retry"
    assert (await store.head(first.key)).sha256 == second.sha256 != first.sha256


async def test_distinct_indexes_are_distinct_objects(store: MediaStore) -> None:
    a = await store.put(media_key("job-5", 0, "image/png"), PNG, "image/png")
    b = await store.put(media_key("job-5", 1, "image/png"), PNG + b"x", "image/png")
    assert a.uri != b.uri
    assert await store.get(a.key) == PNG


async def test_concurrent_puts_leave_one_whole_payload(store: MediaStore) -> None:
    key = media_key("job-6", 0, "application/octet-stream")
    payloads = [bytes([i]) * (64 * 1024 + i) for i in range(8)]
    await asyncio.gather(*(store.put(key, p, "application/octet-stream") for p in payloads))
    assert await store.get(key) in payloads


async def test_missing_key_is_a_clear_error(store: MediaStore) -> None:
    key = media_key("never-stored", 0, "image/png")
    assert not await store.exists(key)
    with pytest.raises(ObjectNotFound, match="never-stored"):
        await store.get(key)
    with pytest.raises(ObjectNotFound):
        await store.head(key)


async def test_exists_after_put(store: MediaStore) -> None:
    key = media_key("job-7", 0, "video/mp4")
    await store.put(key, b"\x00\x00\x00\x18ftypmp42", "video/mp4")
    assert await store.exists(key)


@pytest.mark.parametrize("key", ["../escape.png", "media/../../escape.png", "/abs.png",
                                 "media/job/..", "media\\..\\x.png", ".meta/x.json"])
async def test_traversal_keys_are_refused_before_any_io(
    store: MediaStore, key: str, tmp_path: Path
) -> None:
    with pytest.raises(InvalidMediaKey):
        await store.put(key, PNG, "image/png")
    with pytest.raises(InvalidMediaKey):
        await store.get(key)
    with pytest.raises(InvalidMediaKey):
        await store.exists(key)
    assert not (tmp_path / "escape.png").exists()


# --------------------------------------------------------------------------- failures


@pytest.fixture(params=["local", "s3"])
def broken_store(
    request: pytest.FixtureRequest, tmp_path: Path, moto_endpoint: str, aws_env: dict[str, str]
) -> MediaStore:
    """A store whose backend cannot work: the root is a file / the bucket does not exist."""
    if request.param == "local":
        root = tmp_path / "not-a-folder"
        root.write_bytes(b"")
        return LocalFolderStore(root)
    return S3Store(_bucket(), endpoint_url=moto_endpoint, region="us-east-1")


async def test_backend_failure_becomes_storage_error_with_cause(broken_store: MediaStore) -> None:
    with pytest.raises(StorageError) as info:
        await broken_store.put(media_key("job-8", 0, "image/png"), PNG, "image/png")
    assert isinstance(info.value.__cause__, OSError | ClientError)


async def test_missing_bucket_on_get_is_storage_error_not_missing_key(
    moto_endpoint: str, aws_env: dict[str, str]
) -> None:
    store = S3Store(_bucket(), endpoint_url=moto_endpoint, region="us-east-1")
    with pytest.raises(StorageError) as info:
        await store.get(media_key("job-9", 0, "image/png"))
    assert isinstance(info.value.__cause__, ClientError)
    assert "NoSuchBucket" in str(info.value)


# --------------------------------------------------------------------------- adapter specifics


async def test_local_store_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalFolderStore(tmp_path)
    stored = await store.put(media_key("job-10", 0, "image/png"), PNG, "image/png")
    await store.put(stored.key, PNG + b"again", "image/png")
    names = sorted(p.name for p in (tmp_path / "job-10").iterdir())
    assert names == ["0.png"]
    assert stored.uri == (tmp_path / "job-10" / "0.png").as_uri()


async def test_local_store_in_a_folder_named_media_writes_no_media_media(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LocalFolderStore(Path("media"))`` stores ``media/<job>/0.png`` (issue 25 item 6):
    the folder is the store, so media_key's ``media/`` prefix is not a second folder."""
    monkeypatch.chdir(tmp_path)
    store = LocalFolderStore(Path("media"))
    stored = await store.put(media_key("job-12", 0, "image/png"), PNG, "image/png")
    assert stored.uri == (tmp_path / "media" / "job-12" / "0.png").as_uri()
    assert sorted(p.name for p in (tmp_path / "media").iterdir()) == ["job-12"]
    assert (await store.head(stored.key)).content_type == "image/png"


async def test_local_store_reads_what_an_earlier_release_wrote_under_media(
    tmp_path: Path,
) -> None:
    """An object an earlier release wrote at ``<root>/media/<job>/…`` (with its sidecar at
    ``<root>/.meta/media/<job>/…``) is still found, read and headed after an upgrade, so
    a re-finalization does not download it again; a new put goes to ``<root>/<job>/``."""
    key = media_key("job-13", 0, "image/png")
    old = tmp_path / "media" / "job-13" / "0.png"
    old.parent.mkdir(parents=True)
    old.write_bytes(PNG)
    side = tmp_path / ".meta" / "media" / "job-13" / "0.png.json"
    side.parent.mkdir(parents=True)
    side.write_text(json.dumps({"key": key, "uri": old.as_uri(), "size": len(PNG),
                                "content_type": "image/png",
                                "sha256": hashlib.sha256(PNG).hexdigest()}))
    store = LocalFolderStore(tmp_path)
    assert await store.exists(key)
    assert await store.get(key) == PNG
    head = await store.head(key)
    assert (head.uri, head.content_type) == (old.as_uri(), "image/png")
    assert not await store.exists(media_key("job-14", 0, "image/png"))
    await store.put(media_key("job-14", 0, "image/png"), PNG, "image/png")
    assert (tmp_path / "job-14" / "0.png").read_bytes() == PNG


def _real(path: Path) -> Path:
    return path.resolve()  # what /proc/self/fd names


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_local_store_writes_one_file_when_the_key_names_the_type(
    tmp_path: Path,
) -> None:
    """A result whose type its key names (``0.png``, ``image/png``) is one file: no sidecar
    and no ``.meta`` folder (one create, ``fsync`` and rename per result instead of two);
    a type the key does not name gets its sidecar."""
    store = LocalFolderStore(tmp_path)
    png = await store.put(media_key("job-16", 0, "image/png"), PNG, "image/png")
    assert _tree(tmp_path) == ["job-16", "job-16/0.png"]
    assert await store.head(png.key) == png
    wav = await store.put("media/job-16/1.wav", MP3, "audio/x-wav")
    assert (tmp_path / ".meta" / "job-16" / "1.wav.json").is_file()
    assert await store.head(wav.key) == wav


async def test_local_store_syncs_the_file_before_its_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durability: a result a ``Completed`` names survives a crash. The file is fsynced
    before it is renamed into place, then every folder from its own up to the root, on
    every put: a job folder an earlier put made (and was cut before syncing) is synced by
    the next. A sidecar's folders are synced too."""
    log: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        log.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        log.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    root = _real(tmp_path)
    store, job = LocalFolderStore(root), root / "job-17"
    await store.put(media_key("job-17", 0, "image/png"), PNG, "image/png")
    assert log[0][0] == "fsync"
    assert log[0][1].startswith(f"{job}/.0.png.")
    assert log[1:] == [("replace", f"{job}/0.png"), ("fsync", str(job)), ("fsync", str(root))]
    log.clear()
    await store.put(media_key("job-17", 1, "image/png"), PNG, "image/png")
    assert log[1:] == [("replace", f"{job}/1.png"), ("fsync", str(job)), ("fsync", str(root))]
    log.clear()
    await store.put("media/job-17/2.wav", MP3, "audio/x-wav")
    meta = root / ".meta"
    assert [entry for entry in log if entry[0] == "replace"] == [
        ("replace", f"{job}/2.wav"), ("replace", f"{meta}/job-17/2.wav.json")]
    assert log[-4:] == [("fsync", str(job)), ("fsync", str(root)),
                        ("fsync", f"{meta}/job-17"), ("fsync", str(meta))]


async def test_local_store_reads_a_type_that_could_run_as_generic_without_its_sidecar(
    tmp_path: Path,
) -> None:
    """``.svg`` names no type: an SVG (as a host may store one) keeps its sidecar, and if
    the sidecar is lost (a crash between the two renames) it reads as
    ``application/octet-stream``, never as a type a browser would run."""
    store = LocalFolderStore(tmp_path)
    for content_type in ("image/svg+xml", "application/octet-stream"):
        await store.put("media/job-18/0.svg", b"<svg/>", content_type)
        assert (await store.head("media/job-18/0.svg")).content_type == content_type
        (tmp_path / ".meta" / "job-18" / "0.svg.json").unlink()
        assert (await store.head("media/job-18/0.svg")).content_type == (
            "application/octet-stream")


async def test_local_store_needs_no_meta_folder_for_a_type_its_key_names(
    tmp_path: Path,
) -> None:
    """A file where ``.meta`` would be does not stop a result that needs no sidecar, and
    it reads back as put; one that needs a sidecar fails as a StorageError."""
    (tmp_path / ".meta").write_text("not a folder")
    store = LocalFolderStore(tmp_path)
    png = await store.put(media_key("job-19", 0, "image/png"), PNG, "image/png")
    assert await store.head(png.key) == png
    with pytest.raises(StorageError):
        await store.put("media/job-19/1.wav", MP3, "audio/x-wav")


async def test_local_store_removes_no_sidecar_through_a_symlink_out_of_root(
    tmp_path: Path,
) -> None:
    """A put that drops a stale sidecar confines its folder first: a ``.meta`` folder that
    leads out of the root is refused, and nothing outside is removed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "0.png.json").write_text("{}")
    (tmp_path / "root" / ".meta").mkdir(parents=True)
    (tmp_path / "root" / ".meta" / "job").symlink_to(outside)
    with pytest.raises(InvalidMediaKey):
        await LocalFolderStore(tmp_path / "root").put("media/job/0.png", PNG, "image/png")
    assert [p.name for p in outside.iterdir()] == ["0.png.json"]


async def test_local_store_refuses_a_symlink_leading_out_of_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "job").symlink_to(outside)
    with pytest.raises(InvalidMediaKey):
        await LocalFolderStore(tmp_path / "root").put("media/job/0.png", PNG, "image/png")
    assert list(outside.iterdir()) == []


async def test_s3_store_writes_under_its_prefix(
    moto_endpoint: str, aws_env: dict[str, str]
) -> None:
    bucket = _bucket()
    store = S3Store(bucket, endpoint_url=moto_endpoint, region="us-east-1", prefix="tenant-a/")
    await store.ensure_bucket()
    stored = await store.put("media/j/0.png", PNG, "image/png")
    assert stored.uri == f"s3://{bucket}/tenant-a/media/j/0.png"
    listing = store._client.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listing["Contents"]] == ["tenant-a/media/j/0.png"]


@pytest.mark.parametrize(("content_type", "disposition"), [
    ("application/octet-stream", "attachment"),  # what active content is stored as
    ("image/svg+xml", "attachment"),  # given directly: still never rendered where served
    ("image/png", "inline"),
])
async def test_s3_serves_what_could_run_as_an_attachment_only(
    moto_endpoint: str, aws_env: dict[str, str], content_type: str, disposition: str
) -> None:
    """An object a browser could execute is served as a download, never inline."""
    bucket = _bucket()
    store = S3Store(bucket, endpoint_url=moto_endpoint, region="us-east-1")
    await store.ensure_bucket()
    await store.put("media/j/0.bin", b"<svg><script>alert(1)</script></svg>", content_type)
    head = store._client.head_object(Bucket=bucket, Key="media/j/0.bin")
    assert head.get("ContentDisposition") == disposition


async def test_ensure_bucket_twice_is_harmless(
    moto_endpoint: str, aws_env: dict[str, str]
) -> None:
    store = S3Store(_bucket(), endpoint_url=moto_endpoint, region="us-east-1")
    await store.ensure_bucket()
    await store.ensure_bucket()
    assert not await store.exists("media/j/0.png")


def test_store_from_env_prefers_s3_then_media_dir_then_default(
    tmp_path: Path, moto_endpoint: str, aws_env: dict[str, str]
) -> None:
    s3 = media_from_env({"CALLWARDEN_MEDIA_S3_BUCKET": "b1",
                         "CALLWARDEN_MEDIA_S3_ENDPOINT_URL": moto_endpoint, **aws_env},
                        default_dir=tmp_path)
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3._client.meta.endpoint_url) == ("b1", moto_endpoint)
    local = media_from_env({"CALLWARDEN_MEDIA_DIR": str(tmp_path / "m")}, default_dir=tmp_path)
    assert isinstance(local, LocalFolderStore)
    assert local.root == tmp_path / "m"
    fallback = media_from_env({}, default_dir=tmp_path / "d")
    assert isinstance(fallback, LocalFolderStore)
    assert fallback.root == tmp_path / "d"


async def test_store_from_env_s3_store_works_end_to_end(
    tmp_path: Path, moto_endpoint: str, aws_env: dict[str, str]
) -> None:
    env = {"CALLWARDEN_MEDIA_S3_BUCKET": _bucket(),
           "CALLWARDEN_MEDIA_S3_ENDPOINT_URL": moto_endpoint, **aws_env}
    store = media_from_env(env, default_dir=tmp_path)
    assert isinstance(store, S3Store)
    await store.ensure_bucket()
    await store.put("media/j/0.mp3", MP3, "audio/mpeg")
    assert await store.get("media/j/0.mp3") == MP3
