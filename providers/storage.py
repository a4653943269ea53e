"""Media storage: the :class:`MediaStore` port, deterministic keys, and two adapters.

A result is stored under :func:`media_key` ``(job_id, index, content_type)``, e.g.
``media/0b6f…/0.png``. The key depends on nothing else, so an upload that is retried after a
crash overwrites the same object instead of leaking a second one.

Keys are relative, ``/``-separated paths; every segment matches ``[A-Za-z0-9_-][A-Za-z0-9._-]*``
(so no ``..``, no absolute paths, no hidden names, no backslashes). :func:`check_key` enforces
it in every adapter, before any I/O.

Adapters:

- :class:`LocalFolderStore` writes atomically and durably (temp file in the target folder,
  ``fsync``, ``os.replace``, then ``fsync`` of each folder from the file's up to the root:
  a result a ``Completed`` names is still there after a crash). The content type is the
  one the key's extension names (:func:`extension_for` read backwards: ``.png`` is
  ``image/png``, ``.bin`` ``application/octet-stream``; never a type a browser could run
  script in), so most objects are one file; any other type (``audio/x-wav`` under
  ``.wav``, a key without an extension) is kept, with the SHA-256, in a sidecar under
  ``<root>/.meta``, synced the same way.
- Both take a ``base_url``, the public URL the host serves the store's objects under (a
  static route on the folder, a CDN in front of the bucket): an object's ``url``, and so
  its ``assets.url``, is then ``<base_url>/<its path in the folder or bucket>``; without
  one it is the object's ``uri``.
- :class:`S3Store` uses one boto3 client (credentials found as boto3 finds them) and keeps the
  content type as the object's ``Content-Type`` and the SHA-256 as ``x-amz-meta-sha256``. An
  object whose type a browser could run script in — ``application/octet-stream``, what
  such results are stored as (:mod:`callwarden.providers.media_types`), or such a type
  given directly — is served with ``Content-Disposition: attachment``: downloaded, never
  rendered (every other object ``inline``).

Both run their blocking I/O in :func:`asyncio.to_thread`. Errors::

    InvalidMediaKey (ValueError)   a job id, prefix or key outside the allowed shape: a bug
    ObjectNotFound (LookupError)   get/head of a key that holds no object
    StorageError                   any backend failure (OSError, botocore); ``__cause__`` kept

:func:`media_from_env` picks the adapter from ``CALLWARDEN_MEDIA_*`` settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import boto3
import msgspec
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from callwarden.events.errors import CallwardenError
from callwarden.providers.errors import StorageError
from callwarden.providers.media_types import can_run, media_type, stored_type

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "BASE_URL_ENV",
    "InvalidMediaKey",
    "LocalFolderStore",
    "MediaStore",
    "ObjectNotFound",
    "S3Store",
    "StoredObject",
    "check_key",
    "extension_for",
    "make_s3_client",
    "media_from_env",
    "media_key",
]

_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_SEGMENT = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_MAX_KEY_LEN = 1024
_META_DIR = ".meta"
_KEY_PREFIX = "media"  # media_key's default prefix: a local folder leaves it out
_GENERIC_TYPE = "application/octet-stream"

_EXTENSIONS: Mapping[str, str] = {
    "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
    "image/avif": "avif", "image/heic": "heic", "image/svg+xml": "svg", "image/bmp": "bmp",
    "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov",
    "audio/mpeg": "mp3", "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav",
    "audio/ogg": "ogg", "audio/flac": "flac", "audio/aac": "aac", "audio/mp4": "m4a",
    "audio/webm": "weba", "application/json": "json", "text/plain": "txt",
    "application/zip": "zip", "application/x-tar": "tar",
}


#: The type an extension names when no sidecar says otherwise: the first type
#: ``_EXTENSIONS`` gives it (``.wav`` is ``audio/wav``), and ``.bin`` the generic type.
#: Never a type a browser could run script in: an ``.svg`` keeps its sidecar, and reads
#: as the generic type without one.
_TYPE_OF_EXTENSION: Mapping[str, str] = {"bin": _GENERIC_TYPE} | {
    ext: t for t, ext in reversed([*_EXTENSIONS.items()]) if not can_run(t)}


class InvalidMediaKey(CallwardenError, ValueError):
    """A job id, prefix or key that could escape its folder or is not in the safe charset."""


class ObjectNotFound(CallwardenError, LookupError):
    """No object is stored under ``key``."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no media object stored under key {key!r}")
        self.key = key


class StoredObject(msgspec.Struct, frozen=True, kw_only=True):
    """Where a blob landed: ``uri`` is ``file://…`` (normalised: absolute, no ``.`` or
    ``..``) or ``s3://bucket/…``; ``url`` is how the host serves it, what the finalizer
    writes to ``assets.url``: the store's public base URL and the object's path under it
    when the store was given one (``base_url``, ``CALLWARDEN_MEDIA_BASE_URL``), else
    ``uri`` (a store of the host's own that leaves it empty gets ``uri`` too)."""

    key: str
    uri: str
    size: int
    content_type: str
    sha256: str
    url: str = ""


class MediaStore(Protocol):
    """Stores media blobs under deterministic keys; a put to an existing key replaces it."""

    async def put(self, key: str, data: bytes, content_type: str) -> StoredObject: ...

    async def get(self, key: str) -> bytes: ...

    async def head(self, key: str) -> StoredObject: ...

    async def exists(self, key: str) -> bool: ...


# --------------------------------------------------------------------------- keys


def extension_for(content_type: str) -> str:
    """File extension for a content type (parameters and case ignored); ``bin`` if unknown."""
    base = content_type.split(";", 1)[0].strip().lower()
    return _EXTENSIONS.get(base, "bin")


def media_key(job_id: str, index: int, content_type: str, *, prefix: str = "media") -> str:
    """``<prefix>/<job_id>/<index>.<ext>``: the same inputs always give the same key.

    ``job_id`` is 1–128 characters of ``[A-Za-z0-9_-]`` starting with a letter or digit;
    ``index`` is the media's position in the result (``>= 0``). Anything else raises
    :class:`InvalidMediaKey`.
    """
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise InvalidMediaKey(f"job id {job_id!r} is not 1-128 chars of [A-Za-z0-9_-]")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidMediaKey(f"media index must be an int >= 0, got {index!r}")
    name = f"{job_id}/{index}.{extension_for(content_type)}"
    return check_key(f"{prefix}/{name}" if prefix else name)


def check_key(key: str) -> str:
    """Return ``key`` unchanged if it is a safe relative key, else raise InvalidMediaKey."""
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_LEN:
        raise InvalidMediaKey(f"media key {key!r} is empty or too long")
    for segment in key.split("/"):
        if not _SEGMENT.fullmatch(segment):
            raise InvalidMediaKey(f"media key {key!r} has an unsafe segment {segment!r}")
    return key


def _check_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    return check_key(prefix) if prefix else ""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _base(base_url: str | None) -> str | None:
    """A store's public base URL without its trailing ``/`` (``None``: none given)."""
    if base_url is None or not base_url.strip():
        return None
    base = base_url.strip()
    if "?" in base or "#" in base:
        raise ValueError(f"media base URL {base_url!r}: a URL the object paths are appended "
                         "to, without a query or fragment")
    return base.rstrip("/")


# --------------------------------------------------------------------------- local folder


def _named_type(path: Path) -> str | None:
    """The content type ``path``'s extension names, if it names one."""
    return _TYPE_OF_EXTENSION.get(path.suffix[1:]) if path.suffix else None


def _made_folder(path: Path, root: Path) -> list[Path]:
    """Create ``path``'s folder and any missing parent. Returns the folders to fsync once a
    file is renamed into it, so that the file is still there after a crash: the folder and
    every one above it up to ``root`` (a folder an earlier put made may never have been
    synced: it was cut, or runs beside this one), and above ``root`` too if this put made
    it."""
    folder, made = path.parent, []
    while not folder.is_dir():
        made.append(folder)
        folder = folder.parent
    for new in reversed(made):
        new.mkdir(exist_ok=True)
    top = folder if root.is_relative_to(folder) else root
    chain = [path.parent]
    while chain[-1] != top and chain[-1].parent != chain[-1]:
        chain.append(chain[-1].parent)
    return chain


def _fsync_folder(folder: Path) -> None:
    """fsync a folder; a file system that cannot (EINVAL, EBADF: as Postgres does for its
    own folders) is taken at its word."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file next to ``path``, fsync it, then rename over ``path``
    (the caller fsyncs the folders: :func:`_made_folder`)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _os_errors(action: str, key: str) -> Iterator[None]:
    try:
        yield
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        if action == "put":
            raise StorageError(f"cannot {action} media {key!r}: {exc}") from exc
        raise ObjectNotFound(key) from exc
    except OSError as exc:
        raise StorageError(f"cannot {action} media {key!r}: {exc}") from exc


class LocalFolderStore:
    """A :class:`MediaStore` in a folder; nothing is ever written outside ``root``.

    The folder is the media store itself, so a key under :func:`media_key`'s ``media/``
    prefix is stored without it: ``media/<job>/0.png`` at ``<root>/<job>/0.png`` (and
    ``LocalFolderStore(Path("media"))`` writes ``media/<job>/0.png``, not
    ``media/media/…``). An object an earlier release wrote at ``<root>/media/<job>/…`` is
    still read, headed and found there, so calls finalized before an upgrade keep their
    files and a re-finalization after one does not fetch them again.

    ``base_url``: where the host serves ``root`` (``https://media.example.com``, or a path
    of its own site such as ``/media``): an object's ``url`` is ``<base_url>/<job>/0.png``.
    Without it, ``url`` is the file's ``file://`` URI, made from the root's absolute,
    normalised path (``..`` and ``.`` removed; symlinks are kept as given)."""

    def __init__(self, root: Path, *, base_url: str | None = None) -> None:
        self.root = Path(os.path.abspath(root))
        self.base_url = _base(base_url)

    def _object(self, key: str, path: Path, size: int, content_type: str,
                digest: str) -> StoredObject:
        uri = path.as_uri()
        url = (f"{self.base_url}/{path.relative_to(self.root).as_posix()}"
               if self.base_url is not None else uri)
        return StoredObject(key=key, uri=uri, size=size, content_type=content_type,
                            sha256=digest, url=url)

    def _parts(self, key: str) -> list[str]:
        parts = check_key(key).split("/")
        return parts[1:] if len(parts) > 1 and parts[0] == _KEY_PREFIX else parts

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*self._parts(key))

    def _meta_path(self, key: str) -> Path:
        parts = self._parts(key)
        return self.root.joinpath(_META_DIR, *parts[:-1], f"{parts[-1]}.json")

    def _stored(self, key: str) -> tuple[Path, Path]:
        """The object's file and sidecar: where this release writes them, or where an
        earlier release did (``<root>/media/…``) when only that file exists."""
        path = self._path(key)
        legacy = self.root.joinpath(*check_key(key).split("/"))
        if legacy != path and not path.is_file() and legacy.is_file():
            return legacy, self.root.joinpath(_META_DIR, *f"{check_key(key)}.json".split("/"))
        return path, self._meta_path(key)

    def _confined(self, path: Path) -> Path:
        """``path``, refused if a symlink leads its folder outside ``root``."""
        if not path.parent.resolve().is_relative_to(self.root.resolve()):
            raise InvalidMediaKey(f"{path} resolves outside {self.root}")
        return path

    def _put_sync(self, key: str, data: bytes, content_type: str) -> StoredObject:
        path, meta = self._path(key), self._meta_path(key)
        obj = self._object(key, path, len(data), content_type, _sha256(data))
        with _os_errors("put", key):
            folders = _made_folder(self._confined(path), self.root)
            if content_type == _named_type(path):  # the key says it: no sidecar to write
                self._drop_sidecar(meta)
                _write_atomic(path, data)
            else:
                _write_atomic(path, data)
                folders += _made_folder(self._confined(meta), self.root)
                _write_atomic(meta, msgspec.json.encode(obj))
            for folder in dict.fromkeys(folders):  # the renames and new folders survive
                _fsync_folder(folder)
        return obj

    def _drop_sidecar(self, meta: Path) -> None:
        """Remove a sidecar an earlier put under another type left (it would outrank the
        extension), before the data changes: cut in between, the object reads as the type
        its key names. Looked up first, so a put that has none creates no folder."""
        if os.path.lexists(meta):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._confined(meta))
                _fsync_folder(meta.parent)  # or it could come back after a crash

    def _get_sync(self, key: str) -> bytes:
        with _os_errors("get", key):
            return self._stored(key)[0].read_bytes()

    def _head_sync(self, key: str) -> StoredObject:
        with _os_errors("get", key):
            path, meta_path = self._stored(key)
            data = path.read_bytes()
        digest = _sha256(data)
        content_type = _GENERIC_TYPE
        with contextlib.suppress(OSError, ValueError):
            try:
                meta = json.loads(meta_path.read_bytes())
            except (FileNotFoundError, NotADirectoryError):  # none: the type the key names
                content_type = _named_type(path) or _GENERIC_TYPE
            else:
                if meta.get("sha256") == digest:  # else a put was cut before the sidecar
                    content_type = str(meta["content_type"])
        return self._object(key, path, len(data), content_type, digest)

    def _exists_sync(self, key: str) -> bool:
        with _os_errors("stat", key):
            return self._stored(key)[0].is_file()

    async def put(self, key: str, data: bytes, content_type: str) -> StoredObject:
        return await asyncio.to_thread(self._put_sync, key, data, content_type)

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self._get_sync, key)

    async def head(self, key: str) -> StoredObject:
        """Size, SHA-256 and content type of a stored object (reads it: for tests/audit)."""
        return await asyncio.to_thread(self._head_sync, key)

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(self._exists_sync, key)


# --------------------------------------------------------------------------- S3

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


@contextlib.contextmanager
def _boto_errors(action: str, bucket: str, key: str) -> Iterator[None]:
    """Translate botocore errors: a missing key -> ObjectNotFound, the rest -> StorageError."""
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if action != "put" and code in _NOT_FOUND_CODES:
            raise ObjectNotFound(key) from exc
        raise StorageError(f"S3 {action} s3://{bucket}/{key} failed: {code} {exc}") from exc
    except BotoCoreError as exc:
        raise StorageError(f"S3 {action} s3://{bucket}/{key} failed: {exc}") from exc


def make_s3_client(
    *, endpoint_url: str | None = None, region: str | None = None,
    env: Mapping[str, str] | None = None,
) -> S3Client:
    """One S3 client; credentials from ``env``'s ``AWS_*`` if given there, else as boto3
    finds them (environment, config files, instance role). Path-style for custom endpoints."""
    env = env or {}
    session = boto3.session.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
        region_name=region,
    )
    config = Config(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=10, read_timeout=60,
        s3={"addressing_style": "path"} if endpoint_url else None,
    )
    return session.client("s3", endpoint_url=endpoint_url, config=config)


def _download_only(content_type: str) -> bool:
    """Whether an object of ``content_type`` must be served as an attachment."""
    return stored_type(media_type(content_type) or _GENERIC_TYPE) == _GENERIC_TYPE


class S3Store:
    """A :class:`MediaStore` in an S3 (or S3-compatible) bucket, under an optional prefix.
    ``base_url``: where the host serves the bucket (a CDN, the bucket's public website):
    an object's ``url`` is ``<base_url>/<prefix>/<key>``; without it, its
    ``s3://bucket/<prefix>/<key>`` URI."""

    def __init__(
        self, bucket: str, *, endpoint_url: str | None = None, region: str | None = None,
        prefix: str = "", client: S3Client | None = None, base_url: str | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = _check_prefix(prefix)
        self.base_url = _base(base_url)
        self._client = client or make_s3_client(endpoint_url=endpoint_url, region=region)

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _object(self, key: str, size: int, content_type: str, digest: str) -> StoredObject:
        uri = f"s3://{self.bucket}/{self._full(key)}"
        url = f"{self.base_url}/{self._full(key)}" if self.base_url is not None else uri
        return StoredObject(key=key, uri=uri, size=size, content_type=content_type,
                            sha256=digest, url=url)

    def _put_sync(self, key: str, data: bytes, content_type: str) -> StoredObject:
        obj = self._object(key, len(data), content_type, _sha256(data))
        served = "attachment" if _download_only(content_type) else "inline"
        with _boto_errors("put", self.bucket, key):
            self._client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data,
                                    ContentType=content_type, ContentDisposition=served,
                                    Metadata={"sha256": obj.sha256})
        return obj

    def _get_sync(self, key: str) -> bytes:
        with _boto_errors("get", self.bucket, key):
            answer = self._client.get_object(Bucket=self.bucket, Key=self._full(key))
            return answer["Body"].read()

    def _head_sync(self, key: str) -> StoredObject:
        with _boto_errors("head", self.bucket, key):
            answer = self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        digest = answer.get("Metadata", {}).get("sha256") or _sha256(self._get_sync(key))
        return self._object(key, answer["ContentLength"],
                            answer.get("ContentType", _GENERIC_TYPE), digest)

    def _exists_sync(self, key: str) -> bool:
        try:
            self._head_sync(key)
        except ObjectNotFound:
            return False
        return True

    def _ensure_bucket_sync(self) -> None:
        region = self._client.meta.region_name
        with _boto_errors("create-bucket", self.bucket, ""):
            try:
                if region and region != "us-east-1":
                    self._client.create_bucket(
                        Bucket=self.bucket,
                        CreateBucketConfiguration={"LocationConstraint": region},  # type: ignore[typeddict-item]
                    )
                else:
                    self._client.create_bucket(Bucket=self.bucket)
            except self._client.exceptions.BucketAlreadyOwnedByYou:
                pass

    async def put(self, key: str, data: bytes, content_type: str) -> StoredObject:
        return await asyncio.to_thread(self._put_sync, key, data, content_type)

    async def get(self, key: str) -> bytes:
        return await asyncio.to_thread(self._get_sync, key)

    async def head(self, key: str) -> StoredObject:
        return await asyncio.to_thread(self._head_sync, key)

    async def exists(self, key: str) -> bool:
        """True if an object is stored under ``key``. A missing *bucket* also answers False
        (S3's HEAD gives a bare 404 for both); ``put`` then raises StorageError."""
        return await asyncio.to_thread(self._exists_sync, key)

    async def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet (tests and demos)."""
        await asyncio.to_thread(self._ensure_bucket_sync)


# --------------------------------------------------------------------------- configuration


#: Where the host serves the media store's objects: their ``url`` (``assets.url``).
BASE_URL_ENV = "CALLWARDEN_MEDIA_BASE_URL"


def media_from_env(env: Mapping[str, str], *, default_dir: Path) -> MediaStore:
    """``CALLWARDEN_MEDIA_S3_BUCKET`` set -> :class:`S3Store` (with
    ``CALLWARDEN_MEDIA_S3_ENDPOINT_URL``, ``CALLWARDEN_MEDIA_S3_PREFIX``, ``AWS_REGION`` /
    ``AWS_DEFAULT_REGION`` and ``AWS_*`` credentials); else a :class:`LocalFolderStore` in
    ``CALLWARDEN_MEDIA_DIR`` or ``default_dir``. Either is given
    ``CALLWARDEN_MEDIA_BASE_URL`` as its ``base_url`` (a bad one is a ``ValueError``
    naming the variable)."""
    try:
        base_url = _base(env.get(BASE_URL_ENV))
    except ValueError as exc:
        raise ValueError(f"{BASE_URL_ENV}: {exc}") from exc
    bucket = env.get("CALLWARDEN_MEDIA_S3_BUCKET", "").strip()
    if not bucket:
        return LocalFolderStore(Path(env.get("CALLWARDEN_MEDIA_DIR") or default_dir),
                                base_url=base_url)
    endpoint_url = env.get("CALLWARDEN_MEDIA_S3_ENDPOINT_URL") or None
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
    client = make_s3_client(endpoint_url=endpoint_url, region=region, env=env)
    return S3Store(bucket, prefix=env.get("CALLWARDEN_MEDIA_S3_PREFIX", ""), client=client,
                   base_url=base_url)
