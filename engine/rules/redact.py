"""What an error message may keep (pure): no credentials, no query strings, a bounded length.

Errors reach ``call_events``, ``jobs.error_message``, logs and the dashboard from many
places: a provider's answer, an exception a host's own code raised inside a sync call
(whose text is the host's: an HTTP client error names its full URL, signature and key
included; a client's repr shows its headers), a media download. :func:`safe_error` is
applied to every error an event carries, once, in the write path
(``callwarden.database.appending.recordable``), so no path can record one unredacted:

* the text is read unescaped first (``\\/``, ``\\"`` and percent-escapes), so an escaped
  URL, header or JSON document inside a string is judged as written;
* a URL (with a scheme or not: ``host.tld/path?...``) keeps its host and path; its query
  string and fragment become ``?[redacted]`` and its user info ``[redacted]@``;
* the value of a credential header (``Authorization``, ``Proxy-Authorization``,
  ``Cookie``, ``Set-Cookie``, ``X-Api-Key``, ``Xi-Api-Key``, signature headers...) is
  dropped whole, quoted or to the end of its line, and so is the value of such a header
  or secret printed as a pair (``('xi-api-key', '...')``);
* ``Bearer``/``Basic``/``Token`` credentials, and ``name=value`` / ``name: value`` pairs
  whose name says secret (``key``, ``token``, ``secret``, ``signature``, ``password``,
  ``pwd``, ``pass``, ``private``, ``credential``, ``session``...) keep the name only;
* values that look like keys by their prefix (``sk-...``, ``sk_...``, ``r8_...``, ``AKIA...``,
  ``AIza...``) and a long key-like word after ``key``/``token``/``secret`` are dropped;
* the text is cut to :data:`MAX_ERROR` characters, saying how much was cut.

It errs on the side of dropping: a word that merely looks like a secret's name loses the
value after it.

:func:`without_callback_token` blanks the token of a callback path
(``/webhooks/<provider>/<job>/<token>``): the job page applies it to what it shows, the
service's access log to each request's path.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["CALLBACK_TOKEN", "MAX_ERROR", "REDACTED", "STEPS", "safe_error", "unescaped",
           "without_callback_token"]

#: The longest error text recorded (characters).
MAX_ERROR = 1000
REDACTED = "[redacted]"

_HEADERS = (r"(?:proxy-)?authorization|set-cookie|cookie|x-api-key|xi-api-key|x-goog-api-key"
            r"|api-key|x-amz-security-token|[\w-]*signature|x-kie-[\w-]+|webhook-id")
_HEADER_VALUE = re.compile(
    rf"(?i)([\"']?\b(?:{_HEADERS})\b[\"']?\s*[:=]\s*)(\"[^\"]*\"|'[^']*'|[^\r\n]+)")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"<>]+@")
_URL_QUERY = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s?#'\"<>]*)[?#][^\s'\"<>]*")
_BARE_QUERY = re.compile(r"(?i)\b([\w-]+(?:\.[\w-]+)+(?::\d+)?/[^\s?#'\"<>]*)\?[^\s'\"<>]*")
_AUTH = re.compile(r"(?i)\b(bearer|basic)\s+(?!\[redacted\])[A-Za-z0-9._~+/=-]+")
_TOKEN = re.compile(r"(?i)\b(token)\s+(?=[\w.-]*\d)[\w.-]{16,}")
_SECRET_PAIR = re.compile(
    r"(?i)([\"']?\b(?![\w-]*(?:error|exception|warning)\b)"  # KeyError: 'x' is no secret
    r"[\w-]*(?:api[ _-]?key|apikey|key|token|secret|signature|sig|password"
    r"|passwd|pwd|pass|private|credential|session|sid|auth)[\w-]*[\"']?\s*[:=]\s*)"
    r"(?!\[redacted\])(?!(?:bearer|basic|token)\s)(\"[^\"]*\"|'[^']*'|[^\s,;&'\"}]+)")
_KEY_LIKE = re.compile(
    r"\b(?:sk-[A-Za-z0-9_-]{16,}|sk_[A-Za-z0-9]{16,}|r8_[A-Za-z0-9]{8,}|AKIA[0-9A-Z]{16}"
    r"|ASIA[0-9A-Z]{16}|AIza[\w-]{30,})")
# ('xi-api-key', '...') and ("api_key", "..."): a header or a secret printed as a tuple
_TUPLE_PAIR = re.compile(
    rf"(?i)(b?[\"'](?:{_HEADERS}|(?![\w-]*(?:error|exception|warning)\b)[\w-]*(?:api[ _-]?key"
    r"|apikey|key|token|secret|signature|sig|password|passwd|pwd|pass|private|credential"
    r"|session|sid|auth)[\w-]*)[\"']\s*,\s*b?)(?!'\[redacted\]')(\"[^\"]*\"|'[^']*')")
_AFTER_WORD = re.compile(r"(?i)\b(key|token|secret)\s+(?=[\w.-]*\d)(?=[\w.-]*[a-z])"
                         r"[\w.-]{12,}")


#: The substitutions, in order: each pattern and what replaces a match (``\1``: its first
#: group). The one list: :func:`safe_error` applies it, and the host API's SQL
#: ``callwarden.safe_error`` is rendered from it (engine/database/declared.py).
STEPS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_URL_USERINFO, rf"\1{REDACTED}@"),
    (_URL_QUERY, rf"\1?{REDACTED}"),
    (_BARE_QUERY, rf"\1?{REDACTED}"),
    (_HEADER_VALUE, rf"\1{REDACTED}"),
    (_TUPLE_PAIR, rf"\1'{REDACTED}'"),
    (_AUTH, rf"\1 {REDACTED}"),
    (_TOKEN, rf"\1 {REDACTED}"),
    (_SECRET_PAIR, rf"\1{REDACTED}"),
    (_KEY_LIKE, REDACTED),
    (_AFTER_WORD, rf"\1 {REDACTED}"),
)

#: Escapes read before the patterns (then percent-escapes): a JSON-escaped slash, space
#: and quote.
UNESCAPE: tuple[tuple[str, str], ...] = (("\\/", "/"), ("\\u0020", " "), ('\\"', '"'))


def unescaped(text: str) -> str:
    """``text`` as written: :data:`UNESCAPE`, then percent-escapes."""
    for escaped, plain in UNESCAPE:
        text = text.replace(escaped, plain)
    return unquote(text)


#: A callback path of a signal scheme, ``/webhooks/<provider>/<job>/<token>`` (KIE's; see
#: ``callwarden.service.webhooks.Receiver.routes``): its last segment is the job's secret
#: token. Any provider's (a host adapter's scheme is registered after this is compiled),
#: anywhere in a text: a stored answer echoes the callback URL, a request's path is one.
CALLBACK_TOKEN = re.compile(r"(/webhooks/[^/\s?#'\"<>]+/[^/\s?#'\"<>]+/)[^/\s?#'\"<>]+")


def without_callback_token(text: str, marker: str = REDACTED) -> str:
    """``text`` with the token of every callback path in it replaced by ``marker`` (the
    provider and job are kept, and anything after the token: a query string, a further
    segment). The one rule for the job page (:mod:`callwarden.service.dashboard.redaction`)
    and the access log (:func:`callwarden.service.app.redact_path`, whose ``marker`` must
    be a path segment)."""
    return CALLBACK_TOKEN.sub(lambda found: found[1] + marker, text)


def safe_error(text: str, limit: int = MAX_ERROR) -> str:
    """``text`` with its credentials and query strings redacted, at most ``limit``
    characters (see the module)."""
    out = unescaped(text)
    for pattern, replacement in STEPS:
        out = pattern.sub(replacement, out)
    if len(out) > limit:
        cut = len(out) - limit
        out = f"{out[:limit]}... ({cut} characters cut)"
    return out
