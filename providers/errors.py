"""The error tree of ``providers``: nothing from aiohttp, json or botocore escapes it.

::

    ProviderError                     base; carries ``provider`` and the upstream ``message``
    ├── TransientError                retry later: HTTP 5xx, KIE 455/500, reset, timeout
    │   ├── NotSent                   the connection never opened: nothing reached upstream
    │   ├── RateLimited               HTTP 429 or in-body ``code: 429``; ``retry_after`` (s)
    │   └── ProviderTimeout           no answer within the request timeout
    ├── AuthenticationError           401 / invalid key
    ├── InsufficientCredits           402 / KIE 433 / quota exceeded
    ├── BadRequest                    terminal: validation or policy error on *our* request
    ├── TaskNotFound                  the upstream task id is unknown or gone
    ├── MalformedResponse             body is not what the provider documents
    ├── UnknownProviderKind           a ``provider_kind`` no client knows
    └── MediaError                    downloading a result failed
        ├── MediaExpired              404/403/410 on a result URL, or ``data_removed``
        ├── MediaTooLarge             body over the size limit
        ├── MediaTypeRejected         content type not allowed
        └── MediaRefused              the URL (or a redirect hop) is not on a host the
                                      kind's media may come from, or resolves to a
                                      loopback / private / link-local / metadata address

    AdapterError                      a provider adapter or kind that cannot be
                                      registered or loaded (names its source)
    StorageError                      storing media failed (transient by nature)
    SignatureError                    a webhook signature is missing or wrong
    └── StaleSignature                its timestamp is outside the scheme's tolerance

``is_transient(err)`` tells a caller whether retrying the same request may succeed;
``error_for_status(status, message)`` is the error an HTTP error status means, the one
mapping of a status for every caller that has nothing more specific to go on (a host
adapter's ``raise_for_status``, Replicate's problem+json answers).
"""

from __future__ import annotations

from typing import Any

from callwarden.events.errors import CallwardenError

__all__ = [
    "AdapterError",
    "AuthenticationError",
    "BadRequest",
    "InsufficientCredits",
    "MalformedResponse",
    "MediaError",
    "MediaExpired",
    "MediaRefused",
    "MediaTooLarge",
    "MediaTypeRejected",
    "NotSent",
    "ProviderError",
    "ProviderTimeout",
    "RateLimited",
    "SignatureError",
    "StaleSignature",
    "StorageError",
    "TaskNotFound",
    "TransientError",
    "UnknownProviderKind",
    "error_for_status",
    "is_transient",
]


class ProviderError(CallwardenError):
    """Base of every error raised by ``providers``.

    ``provider`` names the upstream (``kie``, ``replicate``, ``elevenlabs``, ``anthropic``),
    ``message`` keeps the provider's own words, ``status`` the HTTP status (or in-body code)
    when there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status = status
        self.code = code

    def __str__(self) -> str:
        parts = [p for p in (self.provider, str(self.status) if self.status else "") if p]
        prefix = f"[{' '.join(parts)}] " if parts else ""
        return f"{prefix}{self.message}"


class TransientError(ProviderError):
    """The request may succeed if sent again later."""


class NotSent(TransientError):
    """The connection could not be opened (refused, no route, DNS): the request certainly
    never reached the provider, so a create made nothing upstream."""


class RateLimited(TransientError):
    """The provider throttled us; ``retry_after`` is in seconds when it said so."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.retry_after = retry_after


class ProviderTimeout(TransientError):
    """No (complete) answer within the request timeout."""


class AuthenticationError(ProviderError):
    """The credentials were refused."""


class InsufficientCredits(ProviderError):
    """The account has no credit or quota left for this request."""


class BadRequest(ProviderError):
    """The provider refused our request as invalid; sending it again will not help."""


class TaskNotFound(ProviderError):
    """The upstream task id is unknown, expired or deleted."""


class MalformedResponse(ProviderError):
    """The response body does not have the documented shape (bad JSON, missing fields,
    an unknown status value)."""


class UnknownProviderKind(ProviderError):
    """A ``provider_kind`` that no client in the registry knows."""


class MediaError(ProviderError):
    """Fetching a result media URL failed."""


class MediaExpired(MediaError):
    """The result is gone: 403/404/410 on its URL, or the provider removed it."""


class MediaTooLarge(MediaError):
    """The media body exceeded the configured size limit."""


class MediaTypeRejected(MediaError):
    """The media's content type is not one we accept."""


class MediaRefused(MediaError):
    """The media URL was refused before anything was fetched (server-side request
    forgery guard): permanent, the call fails and refunds."""


class AdapterError(CallwardenError):
    """A provider adapter or kind that cannot be registered: a kind another provider
    serves, a spec out of range, an entry point or ``module:attr`` that does not load or
    is not a :class:`~callwarden.providers.registry.Provider`. The message names where it
    came from; nothing was registered from that source."""


class StorageError(CallwardenError):
    """Storing media failed; the caller may retry (keys are deterministic)."""


class SignatureError(CallwardenError):
    """A webhook signature is missing, malformed, wrong, or its timestamp is stale."""


class StaleSignature(SignatureError):
    """A signature whose timestamp is outside the scheme's tolerance (a replay, or a
    delivery held too long)."""


def is_transient(err: BaseException) -> bool:
    """True when retrying the same request later may succeed."""
    return isinstance(err, TransientError | StorageError)


#: The statuses that ask for the same request later: 408 Request Timeout (the server did
#: not process it) and 425 Too Early (it will not yet: ElevenLabs' dub that is not
#: dubbed). Retried like a 5xx, never refused like a 4xx.
RETRY_LATER: frozenset[int] = frozenset({408, 425})


def error_for_status(status: int, message: str, *, retry_after: float | None = None,
                     provider: str = "", code: str | None = None) -> ProviderError:
    """The error an HTTP error status means, carrying ``message``, ``provider``, ``status``
    and ``code``:

    - 429: :class:`RateLimited` (throttled, nothing created), with ``retry_after`` (s;
      the caller reads its ``Retry-After``, or its body's equivalent);
    - :data:`RETRY_LATER` (408, 425) and 5xx: :class:`TransientError`. A 408 Request
      Timeout says the server did not process the request (it timed out waiting for it),
      a 425 Too Early that it will not yet, so sending it again may succeed, as after a
      5xx (where a create may have been made);
    - 401 and 403: :class:`AuthenticationError`; 402: :class:`InsufficientCredits`;
    - any other 4xx: :class:`BadRequest` (the request refused: nothing created);
    - a status that is no error (1xx to 3xx): :class:`MalformedResponse`, an answer the
      caller did not expect.
    """
    kw: dict[str, Any] = {"provider": provider, "status": status, "code": code}
    if status == 429:
        return RateLimited(message, retry_after=retry_after, **kw)
    if status in RETRY_LATER or status >= 500:
        return TransientError(message, **kw)
    if status in (401, 403):
        return AuthenticationError(message, **kw)
    if status == 402:
        return InsufficientCredits(message, **kw)
    if status >= 400:
        return BadRequest(message, **kw)
    return MalformedResponse(f"unexpected HTTP {status}: {message}", **kw)
