"""``callwarden serve``: webhook receivers and health probes on the internet-facing
listener; ``/metrics``, the dashboard and the admin actions on the operator listener.

``app`` (the two aiohttp applications and the listeners' settings), ``webhooks`` (verify,
find the job, record, finalize in the background), ``operator`` (the operator app's
routes, read token and admin actions), ``probes`` (``/healthz``, ``/readyz``,
``/metrics``), ``metrics`` (Prometheus), ``dashboard`` (server-rendered HTML).

Internal, except :mod:`callwarden.service.app` (docs/api.md)."""
