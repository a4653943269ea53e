"""``callwarden serve``: webhook receivers, ``/metrics``, health probes, admin, dashboard.

``app`` (the aiohttp application), ``webhooks`` (verify, find the job, record, finalize in
the background), ``metrics`` (Prometheus), ``dashboard`` (server-rendered HTML).
"""
