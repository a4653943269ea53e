"""What the job page may show of stored data (pure): no credential, no token.

Stored events and a job's request hold what providers and hosts sent: a provider's raw
answer echoes the request, whose callback URL carries the job's secret token in its path
(``/webhooks/<provider>/<job>/<token>``); a media URL may be signed in its query string; a
host's request may carry an API key. Before any of it reaches the page:

* a string under a key whose name says secret (``token``, ``secret``, ``api_key``,
  ``signature``, ``password``, ``authorization``, ``cookie``...) becomes ``[redacted]``
  (numbers stay: ``input_tokens`` is a count);
* in every string, the token segment of a callback path is blanked
  (:func:`callwarden.rules.redact.without_callback_token`, as in the access log), and
  :data:`callwarden.rules.redact.STEPS` apply (URL query strings and user info, credential
  headers, ``Bearer`` values, key-like words) — the redaction every recorded error passes.
"""

from __future__ import annotations

import re
from typing import Any

from callwarden.rules.redact import REDACTED, STEPS, unescaped, without_callback_token

__all__ = ["SECRET_KEY", "redact_text", "redact_value"]

#: A mapping key whose value is a secret (its value is dropped whole).
SECRET_KEY = re.compile(
    r"(?i)(?<![a-z])(?:api[_-]?key|apikey|token|secret|signature|sig|password|passwd|pwd"
    r"|authorization|cookie|credentials?|private[_-]?key|session|auth)(?![a-z])"
    r"|(?:token|secret|signature|password|apikey)")


def redact_text(text: str) -> str:
    """``text`` without callback tokens, URL query strings or credentials. A text with
    escaped slashes (``\\/``, ``%2F``) is judged, and shown, unescaped."""
    out = unescaped(text) if ("\\/" in text or "%2f" in text.lower()) else text
    out = without_callback_token(out)
    for pattern, replacement in STEPS:
        out = pattern.sub(replacement, out)
    return out


def redact_value(value: Any) -> Any:
    """A decoded JSON value with :func:`redact_text` applied to every string and every
    value under a secret-named key dropped."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and isinstance(v, str) and v
                    and SECRET_KEY.search(k) else redact_value(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
