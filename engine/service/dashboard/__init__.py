"""The operator dashboard: server-rendered HTML with SVG charts, one stylesheet and one
small script (``engine/service/static/``, shipped in the wheel: no CDN, works offline).

- ``/``: calls in flight and stale per kind (with the thresholds), calls ended over the
  last hour or day (``?window=``) by terminal state and by who ended them, time to
  terminal per kind, credits settled, and the stale / exhausted / recent lists; the
  script refreshes it from ``/overview/live`` every few seconds.
- ``/jobs``: the call list with filters and keyset pages; ``/jobs?q=`` finds a job by id
  or upstream task id (one match: redirected to it). With an admin token, its rows can be
  selected (or every call the filter matches) for a bulk action (:mod:`.bulk`: a preview
  of how many calls and credits, confirmed, then one transition per job).
- ``/jobs/{id}``: the job's story (:mod:`.story`) and its admin buttons.
- ``/waiting``: the jobs waiting for a provider account's slot (a start its limits
  refused: no call yet), with the reason and the retry time (:mod:`.waiting`); the
  overview shows a card of them per account while any job waits.

Pure renderers (:mod:`.format`, :mod:`.html`, :mod:`.overview`, :mod:`.calls`,
:mod:`.story`, :mod:`.waiting`, :mod:`callwarden.service.charts`) are separate from the
routes (:mod:`.handlers`) and the admin actions' writes (:mod:`.bulk`). Every value shown
passes through :func:`html.escape`.
"""

from callwarden.service.dashboard.handlers import Dashboard
from callwarden.service.dashboard.html import page

__all__ = ["Dashboard", "page"]
