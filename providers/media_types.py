"""What a result's content type is, and what it is stored as (pure).

A provider names a result's type: a ``Content-Type`` header, or the media type of a
``data:`` URI. Both are read by :func:`media_type`: ``type/subtype`` as two tokens (RFC
9110), lower-cased, parameters dropped; anything else — a list (``image/png, text/html``,
whose last entry a browser would take), CR/LF, spaces, non-ASCII — is not a media type.

A result is the user's asset: the host serves it, often from its own origin. So a type a
browser can run script in is never stored as itself (:func:`stored_type`): SVG, XML and
XHTML in any guise (``text/xml``, ``application/xml``, ``*+xml``), JavaScript, and every
type not known to be inert are stored as ``application/octet-stream`` (under a ``.bin``
key; S3 serves such objects with ``Content-Disposition: attachment``) — the bytes as they
came, which a browser downloads and never renders. Inert: ``image/*``, ``audio/*`` and
``video/*`` except SVG and XML subtypes, and :data:`INERT_TYPES`. (``text/html`` and
``application/xhtml+xml`` are refused before this: at a media URL they are an error page,
not a result.)
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["GENERIC", "INERT_TYPES", "TOKEN", "can_run", "media_type", "stored_type"]

#: RFC 9110 ``token`` characters (a type, a subtype, a parameter's name).
TOKEN: Final = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE: Final = re.compile(rf"{TOKEN}/{TOKEN}")
GENERIC: Final = "application/octet-stream"
_INERT_MAJORS: Final = frozenset({"image", "audio", "video"})
#: Types stored as themselves outside ``image/*``, ``audio/*``, ``video/*``: no browser runs
#: anything in them. (Not PDF: a PDF may carry JavaScript.)
INERT_TYPES: Final = frozenset({
    GENERIC, "text/plain", "text/csv", "text/markdown", "text/tab-separated-values",
    "application/json", "application/x-ndjson", "application/zip", "application/gzip",
    "application/x-gzip", "application/x-tar", "application/x-7z-compressed",
    "application/x-npy", "model/gltf-binary", "model/obj", "model/stl",
})


def media_type(value: str) -> str | None:
    """``value``'s ``type/subtype``, lower-cased and without parameters; ``None`` when it
    is not one (a list, CR/LF, a missing subtype, non-ASCII)."""
    base = value.split(";", 1)[0].strip(" \t")
    return base.lower() if _MEDIA_TYPE.fullmatch(base) else None


def can_run(content_type: str) -> bool:
    """Whether a browser could run script in a file of ``content_type`` (a media type),
    or might: every type not known to be inert."""
    major, _, subtype = content_type.partition("/")
    if major in _INERT_MAJORS:
        return "svg" in subtype or "xml" in subtype
    return content_type not in INERT_TYPES


def stored_type(content_type: str) -> str:
    """The type a result of ``content_type`` is stored and served as: itself when nothing
    in it can run, else ``application/octet-stream``."""
    return GENERIC if can_run(content_type) else content_type
