"""The write path and the database: one transition = one statement = one transaction.

``write`` (append, transition, cancel, the reads that feed them, the one error boundary),
``db`` (where the database is; the ``Conn`` and ``Pool`` types), ``queries`` (named SQL
from the ``.sql`` files beside each package), ``migrate``, ``clock`` (the database's clock
for every actor), ``host`` (the host's decision wins: the pure rule every writer applies)
and ``jobs`` (creating a host job row with its reservation, as a host's API does).
"""
