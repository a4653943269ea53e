"""What an error message may keep (pure): no credentials, no query strings, a bounded length.

Errors reach ``call_events``, ``jobs.error_message``, logs and the dashboard from many
places: a provider's answer, an exception a host's own code raised inside a sync call
(whose text is the host's: an HTTP client error names its full URL, signature and key
included), a media download. :func:`safe_error` is applied to every error an event
carries, once, in the write path (``callwarden.database.appending.recordable``), so no
path can record one unredacted:

* a URL keeps its scheme, host and path; its query string and fragment become
  ``?[redacted]`` and its user info ``[redacted]@``;
* ``Bearer``/``Basic``/``Token`` credentials and ``key=value`` pairs whose key names a secret
  (``api_key``, ``token``, ``secret``, ``signature``, ``password``, ``xi-api-key``, ...)
  keep the key and lose the value;
* the text is cut to :data:`MAX_ERROR` characters, saying how much was cut.
"""

from __future__ import annotations

import re

__all__ = ["MAX_ERROR", "safe_error"]

#: The longest error text recorded (characters).
MAX_ERROR = 1000
REDACTED = "[redacted]"

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"<>]+@")
_URL_QUERY = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s?#'\"<>]*)[?#][^\s'\"<>]*")
_AUTH = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
#: Replicate's ``Token r8_...`` scheme: only a value that looks like a key (digits, 16+).
_TOKEN = re.compile(r"\b(Token)\s+(?=[\w.-]*\d)[\w.-]{16,}")
_SECRET_PAIR = re.compile(
    r"(?i)([\"']?\b[\w-]*(?:api[_-]?key|apikey|token|secret|signature|sig|password|passwd"
    r"|credential|auth)[\w-]*[\"']?\s*[:=]\s*)(?!(?:bearer|basic|token)\s)"
    r"(\"[^\"]*\"|'[^']*'|[^\s,;&'\"}]+)")


def safe_error(text: str, limit: int = MAX_ERROR) -> str:
    """``text`` with its credentials and query strings redacted, at most ``limit``
    characters (see the module)."""
    out = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    out = _URL_QUERY.sub(rf"\1?{REDACTED}", out)
    out = _AUTH.sub(rf"\1 {REDACTED}", out)
    out = _TOKEN.sub(rf"\1 {REDACTED}", out)
    out = _SECRET_PAIR.sub(rf"\1{REDACTED}", out)
    if len(out) > limit:
        cut = len(out) - limit
        out = f"{out[:limit]}... ({cut} characters cut)"
    return out
