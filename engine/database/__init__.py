"""The write path and the database: one transition = one statement = one transaction.

``write`` (append, transition, cancel, the reads that feed them, named-query execution),
``boundary`` (the one error boundary: driver errors become engine errors; connections and
transactions), ``db`` (where the database is; the ``Conn`` and ``Pool`` types),
``databases`` (whole databases created and dropped, names quoted), ``queries`` (named SQL
from the ``.sql`` files beside each package), ``migrate``, ``clock`` (the database's clock
for every actor), ``outage`` (riding through a database outage: one log line, backoff),
``host`` (the host's decision wins: the pure rule every writer applies) and ``jobs``
(creating a host job row with its reservation, as a host's API does).

Internal: a host imports ``open_pool``, ``connect``, ``migrate``, ``create_job`` and
``cancel`` from ``callwarden`` (docs/api.md)."""
