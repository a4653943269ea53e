"""The mutation check: each deliberate bug, applied alone to a copy of the checkout, must
make the default test run fail (issue 14 item 5; issue 24 item 14: the whole default run,
not a file chosen to catch it).

    .venv/bin/python -m tests.mutations            # every mutant; exit 1 if one survives
    .venv/bin/python -m tests.mutations --list     # the table, nothing run
    .venv/bin/python -m tests.mutations --only host-fence-dropped
    .venv/bin/python -m tests.mutations --only NAME --against tests/unit/test_fold.py

How it works: the checkout's files (``git ls-files --cached --others --exclude-standard``:
tracked and new files, as they are in the working tree) are copied once to a temporary
folder, never touching the checkout. For each mutant, its edits (exact old text -> new
text; an old text that is not found exactly once is an error, so the table stays in step
with the code) are applied to the copy, the tests are run there with the venv's Python
(``cwd`` = the copy, ``PYTHONPATH`` = a link tree of the copy laid out as the wheel lays
``callwarden`` (:func:`tests.layout.link_tree`), then the copy itself, so the copy's code
shadows the editable install that points at the checkout; processes the tests start
inherit ``PYTHONPATH``), and the edits are undone.

What runs is the README's default run, ``pytest -n 2 --dist loadgroup`` over ``tests``,
with ``-x -q -p no:cacheprovider --basetemp=...`` and the mutant's named test files
(``tests=``, the files that catch it soonest) first, so a caught mutant stops within
seconds and one that survives costs a whole run. Naming the files before ``tests`` does
not put them first (pytest drops a file argument that a directory argument holds), so
the plugin :mod:`tests.mutations.first` orders them (``--run-first``), and
``--no-loadscope-reorder`` makes xdist hand the tests out in that order. ``--against
FILE`` (repeatable) runs the chosen mutants against those files only, and
``--named-only`` against their named files only: to find which files catch a mutant.

A mutant is *caught* when tests failed (the plugin's report names them; under xdist
``-x`` ends such a run with exit status 2, not 1) and nothing failed to collect; any other
end (a collection error, a usage error, the per-mutant timeout) is an error, not caught.
Two sanity rows run first: the unmutated copy must pass every test file the table names
(``--full-sanity``: the whole default run), and a trivially broken fold must be caught,
which shows the copy's code is what the tests import. Everything runs in the ``ci``
Hypothesis profile (derandomized, so a result reproduces).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tests.layout import link_tree

ROOT = Path(__file__).resolve().parents[2]
#: A whole default run takes 6-7 minutes on this 2-core machine when it is quiet.
PER_MUTANT_TIMEOUT_S = 2400


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once in ``path``) with ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    expect_caught: bool = True


FOLD = "tests/unit/test_fold.py"
DECIDE = "tests/unit/test_reconcile_decide.py"
WRITE = "tests/integration/test_write_path.py"
STALE = "tests/integration/test_stale_rule.py"
CALLS = "tests/integration/test_calls.py"
GUARDS = "tests/integration/test_mutation_guards.py"
SIGNATURES = "tests/unit/providers/test_webhook_parsers.py"
COALESCE = "tests/unit/test_coalesce.py"
REPLAYS = "tests/integration/test_webhook_replays.py"
WEBHOOKS = "tests/integration/test_webhooks.py"
HOSTILE = "tests/integration/test_hostile_results.py"
DOWNLOAD = "tests/integration/providers/test_media_download.py"
CREDENTIALS = "tests/integration/test_credentials.py"
QUEUE_OUTAGE = "tests/acceptance/test_queue_outage.py"
QUEUE_PROCESS = "tests/integration/test_queue_process.py"
REPLICATE_PARSE = "tests/unit/providers/test_replicate_parse.py"
CONTENT = "tests/integration/test_result_content.py"
LISTENERS = "tests/acceptance/test_serve_listeners.py"
SERVICE = "tests/integration/test_service.py"
REDACT = "tests/unit/test_redact.py"
PRICING = "tests/unit/test_pricing.py"
PRICING_HOOK = "tests/integration/test_pricing_hook.py"
RECONCILE_CONFIG = "tests/unit/test_reconcile_config.py"
FIRST_BEAT = "tests/acceptance/test_first_heartbeat.py"
QUEUES = "tests/acceptance/test_queue_integrations.py"

MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "settle-without-cas",
        "a settling append moves the job's reservations whatever their status (no "
        "compare-and-set on status = 'reserved')",
        (Edit("engine/database/queries.sql",
              "    WHERE u.job_id = %(job_id)s::uuid AND u.status = 'reserved'\n), settle AS (",
              "    WHERE u.job_id = %(job_id)s::uuid\n), settle AS ("),
         Edit("engine/database/queries.sql",
              "    WHERE u.job_id = %(job_id)s::uuid AND u.id = o.id\n"
              "      AND u.status = 'reserved'\n",
              "    WHERE u.job_id = %(job_id)s::uuid AND u.id = o.id\n")),
        (WRITE,)),
    Mutant(
        "settle-cas-dropped",
        "only the settle's own compare-and-set (status = 'reserved' re-checked on the row "
        "it locks) is gone: a reservation the host settles while the append waits is moved "
        "again",
        (Edit("engine/database/queries.sql",
              "    WHERE u.job_id = %(job_id)s::uuid AND u.id = o.id\n"
              "      AND u.status = 'reserved'\n",
              "    WHERE u.job_id = %(job_id)s::uuid AND u.id = o.id\n"),),
        (GUARDS,)),
    Mutant(
        "terminal-not-absorbing",
        "the fold treats a terminal call like an empty one: a cancel or a host ending "
        "after a commit is accepted (and would refund)",
        (Edit("projections/fold.py",
              "        dest = table.get(previous)\n",
              "        dest = table.get(None if previous in TERMINAL else previous)\n"),),
        (FOLD,)),
    Mutant(
        "cancel-commits",
        "a cancelled call's reservation is committed instead of refunded",
        (Edit("events/states.py", "    S.CANCELLED: \"refunded\",\n",
              "    S.CANCELLED: \"committed\",\n"),),
        (FOLD,)),
    Mutant(
        "commit-ignores-cost",
        "a commit charges the whole reservation, not the Completed event's cost",
        (Edit("engine/database/appending.py",
              "        cost=None if isinstance(first, LeftoverSettled) else _cost(new),\n",
              "        cost=None,\n"),),
        (WRITE,)),
    Mutant(
        "fold-takes-live-lease",
        "the fold lets a FinalizeClaimed take over a finalization lease that has not expired",
        (Edit("projections/fold.py",
              "            if a.state is state and lease is not None and e.at < lease:",
              "            if False:"),),
        (FOLD,)),
    Mutant(
        "finalizer-takes-live-lease",
        "the finalizer claims a finalizing call whose lease is still live",
        (Edit("engine/calls/finalize.py",
              "            expired = p.finalize_lease_until is not None and now >= "
              "p.finalize_lease_until\n",
              "            expired = True\n"),),
        (GUARDS,)),
    Mutant(
        "live-lease-taken-over",
        "a live finalization lease is taken over end to end: the finalizer claims it and "
        "the fold's lease rule lets the claim through",
        (Edit("engine/calls/finalize.py",
              "            expired = p.finalize_lease_until is not None and now >= "
              "p.finalize_lease_until\n",
              "            expired = True\n"),
         Edit("projections/fold.py",
              "            if a.state is state and lease is not None and e.at < lease:",
              "            if False:")),
        (GUARDS,)),
    Mutant(
        "fresh-heartbeat-ignored",
        "the reconciler's stale rule ignores a fresh heartbeat (ages the call from its "
        "start only)",
        (Edit("engine/rules/stale.py",
              "        if heartbeat_at is not None:\n",
              "        if False:\n"),),
        (DECIDE,)),
    Mutant(
        "fresh-heartbeat-ignored-sql",
        "the claim's SQL stale rule (the stale_rule fragment) ignores a fresh heartbeat",
        (Edit("engine/database/reconcile.sql",
              "    WHEN j.heartbeat_at IS NOT NULL THEN\n",
              "    WHEN false THEN\n"),),
        (STALE,)),
    Mutant(
        "fresh-heartbeat-ignored-sql-function",
        "the SQL function callwarden.callwarden_is_stale (migration 0011) ignores a fresh "
        "heartbeat",
        (Edit("migrations/0011_own_schema.sql",
              "    WHEN heartbeat_at IS NOT NULL THEN\n",
              "    WHEN false THEN\n"),),
        (STALE,)),
    Mutant(
        "ambiguous-create-recreates",
        "a redelivered job left created without a task id creates upstream again "
        "(the default ambiguous_create='sweep' policy ignored)",
        (Edit("engine/calls/runner.py",
              "            if not started_here and self.config.policy_for(kind) == \"sweep\":\n",
              "            if False:\n"),),
        (CALLS,)),
    Mutant(
        "host-fence-dropped",
        "the append no longer checks the host's status it read (a host's cancel or "
        "completion racing the write is overwritten)",
        (Edit("engine/database/queries.sql",
              "COALESCE(status, 'pending') IN ('pending', 'processing')\n\n",
              "true\n\n"),
         Edit("engine/database/queries.sql",
              "     ELSE status IS NOT DISTINCT FROM %(host_status)s::text END\n",
              "     ELSE true END\n")),
        (WRITE,)),
    # -- issue 24 item 14: signature checks, the attempt cap, webhook deduplication, the
    # media-host guard, credential routing, and one per fix of items 1-12.
    Mutant(
        "replicate-signature-unchecked",
        "a Replicate webhook with any v1 signature is accepted (the HMAC is not compared)",
        (Edit("providers/replicate/webhook.py",
              "        if entry.startswith(\"v1,\") and hmac.compare_digest(entry.encode(), "
              "expected):\n",
              "        if entry.startswith(\"v1,\"):\n"),),
        (SIGNATURES,)),
    Mutant(
        "elevenlabs-signature-unchecked",
        "an ElevenLabs webhook with any v0 signature is accepted",
        (Edit("providers/elevenlabs/webhook.py",
              "    if not hmac.compare_digest(given.encode(), expected.encode()):\n",
              "    if not given:\n"),),
        (SIGNATURES,)),
    Mutant(
        "kie-signature-unchecked",
        "a KIE callback with any X-Webhook-Signature is accepted",
        (Edit("providers/kie/webhook.py",
              "    if not hmac.compare_digest(sig.encode(), kie_sign(key, task_id, ts)"
              ".encode()):\n",
              "    if not sig:\n"),),
        (SIGNATURES,)),
    Mutant(
        "reconciler-never-exhausts",
        "the reconciler never ends a stale call at the attempt cap (it polls or finalizes "
        "it again, forever)",
        (Edit("engine/reconciler/decide.py",
              "    if row.call.reconcile_attempts >= config.attempt_cap:\n",
              "    if False:\n"),),
        (DECIDE,)),
    Mutant(
        "webhook-cap-ignored",
        "a signal about a call stuck in upstream_succeeded finalizes it again past the "
        "attempt cap (never exhausted)",
        (Edit("engine/service/coalesce.py",
              "    if p.reconcile_attempts >= attempt_cap:\n",
              "    if False:\n"),),
        (COALESCE,)),
    Mutant(
        "webhook-attempt-uncounted",
        "a webhook-triggered finalization that will be retried records no attempt (it "
        "never counts towards the cap)",
        (Edit("engine/service/webhooks.py",
              "            if done.outcome == \"retry_later\":",
              "            if False:"),),
        (REPLAYS,)),
    Mutant(
        "delivery-processed-again",
        "a webhook delivery already recorded is processed again (the dedupe insert "
        "returns the row on conflict)",
        (Edit("engine/database/webhooks.sql",
              "ON CONFLICT (provider, delivery_id) DO NOTHING\n",
              "ON CONFLICT (provider, delivery_id) DO UPDATE SET received_at = now()\n"),),
        (WEBHOOKS,)),
    Mutant(
        "media-any-host",
        "check_url allows a media URL on any host (not only the kind's media hosts and "
        "its endpoint)",
        (Edit("providers/media_guard.py",
              "    if not policy.allows_host(host, port):\n",
              "    if False:\n"),),
        (HOSTILE,)),
    Mutant(
        "media-private-literal",
        "check_url allows a private or loopback IP literal on an allowed host list",
        (Edit("providers/media_guard.py",
              "    if _ip_literal(host) and not policy.is_endpoint(host, port) and not "
              "is_public_address(host):\n",
              "    if False:\n"),),
        (HOSTILE,)),
    Mutant(
        "media-credentials-any-origin",
        "a media download sends the provider's key to whatever host the URL names",
        (Edit("providers/media.py",
              "        return dict(self.headers) if origin_of(url) == self.origin else None\n",
              "        return dict(self.headers)\n"),),
        (DOWNLOAD,)),
    Mutant(
        "provider-redirects-followed",
        "provider requests follow redirects (the key goes along to the Location's host)",
        (Edit("providers/transport.py",
              "    kwargs[\"allow_redirects\"] = False",
              "    kwargs[\"allow_redirects\"] = True"),),
        (CREDENTIALS,)),
    Mutant(
        "arq-outage-tries-are-deliveries",
        "arq counts tries that met a database outage as deliveries: a job is given up "
        "after an outage instead of run",
        (Edit("engine/queue/arq.py",
              "    deliveries = tries - await outages.count()\n",
              "    deliveries = tries\n"),),
        (QUEUE_OUTAGE,)),
    Mutant(
        "celery-outage-retries-bounded",
        "a Celery worker retries an outage only max_retries times, then fails and acks "
        "the task (the job is dropped)",
        (Edit("engine/queue/celery.py",
              "        bound = process.options.outage.within_limit if self.request.is_eager "
              "else sys.maxsize\n",
              "        bound = process.options.outage.within_limit\n"),),
        (QUEUE_OUTAGE,)),
    Mutant(
        "celery-unpublished-retry-acked",
        "a Celery outage retry that could not be published is rejected without requeue "
        "(acked: the job is dropped)",
        (Edit("engine/queue/celery.py",
              "            return Reject(reason, requeue=True)\n",
              "            return Reject(reason, requeue=False)\n"),),
        (QUEUE_OUTAGE,)),
    Mutant(
        "queue-drops-unstarted-job",
        "a queue fails and acks a job whose database error came before its CallStarted "
        "(ProcessRunner.keeps says no)",
        (Edit("engine/queue/process.py",
              "        return p.state is None\n",
              "        return False\n"),),
        (QUEUE_PROCESS,)),
    Mutant(
        "link-in-text-is-a-file",
        "any http(s) URL in a Replicate output is taken for a file to download (a caption "
        "citing a page fails media_unusable)",
        (Edit("providers/replicate/wire.py",
              "    return value[:8].lower().startswith(_URL_PREFIXES) and is_media(value)\n",
              "    return value[:8].lower().startswith(_URL_PREFIXES)\n"),),
        (REPLICATE_PARSE,)),
    Mutant(
        "svg-stored-as-itself",
        "an SVG (or XML) image is stored as its own type, so its script can run where it "
        "is served",
        (Edit("providers/media_types.py",
              "        return \"svg\" in subtype or \"xml\" in subtype\n",
              "        return False\n"),),
        (CONTENT,)),
    Mutant(
        "script-types-stored-as-themselves",
        "an any-file result of a type not known to be inert (text/xml, text/javascript) "
        "is stored as itself",
        (Edit("providers/media_types.py",
              "    return content_type not in INERT_TYPES\n",
              "    return False\n"),),
        (CONTENT,)),
    Mutant(
        "webhook-listener-serves-operator",
        "the internet-facing webhook listener also serves the dashboard, the job pages "
        "and /metrics",
        (Edit("engine/service/app.py",
              "    app.add_routes(_probes(pool, config, now, outage).routes(detail=False))\n",
              "    app.add_routes(_probes(pool, config, now, outage).routes(detail=False))\n"
              "    app.add_routes([web.get(\"/metrics\", _probes(pool, config, now, outage)"
              ".metrics),\n                    *Dashboard(pool, config.stale, now=now)"
              ".routes()])\n"),),
        (LISTENERS,)),
    Mutant(
        "read-token-unchecked",
        "the operator listener's read guard lets in any bearer or Basic credential",
        (Edit("engine/service/operator.py",
              "        if given is not None and (_same(given, read_token) or _same(given, "
              "admin_token)):\n",
              "        if given is not None:\n"),),
        (SERVICE,)),
    Mutant(
        "host-check-skipped",
        "without a read token, the operator listener answers any Host (DNS rebinding "
        "reads it)",
        (Edit("engine/service/operator.py",
              "        if name is not None and (is_loopback(name) or name in names):\n",
              "        if name is not None:\n"),),
        (SERVICE,)),
    Mutant(
        "slow-create-unbeaten",
        "a create or sync call in the provider's code (a host adapter's) runs without the "
        "call's heartbeat: a slow one is swept while it runs",
        (Edit("engine/calls/runner.py",
              "        async with Beat(lambda: self._heartbeat(job_id, None), "
              "self.config.heartbeat_every_s):\n            return await self._timed(work)\n",
              "        if True:\n            return await self._timed(work)\n"),),
        ("tests/integration/test_host_adapter_paths.py",)),
    Mutant(
        "adapter-poll-not-retried",
        "a transient poll answer of a host's adapter is not retried (the call waits for the "
        "next re-poll)",
        (Edit("providers/checked.py",
              "                if attempt >= self.policy.max_attempts or \\\n",
              "                if True or \\\n"),),
        ("tests/integration/test_host_adapter_paths.py",)),
    Mutant(
        "heartbeat-contradiction-passes",
        "a worker heartbeat as slow as the reconciler's heartbeat timeout loads, and check "
        "and reconcile say nothing (every live call swept between two beats)",
        (Edit("engine/settings.py",
              "    if gap >= reconcile.heartbeat_timeout_s:\n",
              "    if False:\n"),),
        (RECONCILE_CONFIG, "tests/acceptance/test_check.py")),
    Mutant(
        "attempt-budget-all-kinds",
        "the attempt budget is bounded by every known kind's threshold, whatever kinds "
        "the deployment runs",
        (Edit("engine/reconciler/config.py",
              "        return self.kinds or tuple(KINDS)\n",
              "        return tuple(KINDS)\n"),),
        (RECONCILE_CONFIG,)),
    Mutant(
        "operator-door-open",
        "serve starts the operator listener on a non-loopback address with no read token "
        "and open_operator unset (a warning only)",
        (Edit("engine/service/app.py",
              "    if not listen.open_operator:\n",
              "    if False:\n"),),
        ("tests/unit/test_operator_door.py", LISTENERS)),
    Mutant(
        "webhook-encoding-accepted",
        "the webhook routes accept a compressed body (no 415 for a Content-Encoding)",
        (Edit("engine/service/webhooks.py",
              "                _refuse_encoded(request)\n",
              "                pass\n"),),
        (LISTENERS,)),
    Mutant(
        "webhook-encoding-first-header",
        "only the first Content-Encoding header is checked (identity, then gzip passes)",
        (Edit("engine/service/webhooks.py",
              "    encodings = request.headers.getall(\"Content-Encoding\", [])\n",
              "    encodings = [request.headers.get(\"Content-Encoding\", \"\")]\n"),),
        (LISTENERS,)),
    Mutant(
        "kie-replays-not-coalesced",
        "the receiver's per-job interval is ignored: each replayed KIE callback costs an "
        "upstream poll",
        (Edit("engine/service/coalesce.py",
              "        if not anyway and self.wait_s(job, now) > 0:\n",
              "        if False:\n"),),
        (COALESCE,)),
    Mutant(
        "give-up-cancels-a-started-call",
        "cancel_unstarted decides on 'not terminal': a give-up cancels (refunds) a call "
        "whose create is in flight",
        (Edit("engine/database/write.py",
              "        return Cancelled(at=now, actor=by, by=by) if p.state is None else None\n",
              "        return Cancelled(at=now, actor=by, by=by) if not p.terminal else None\n"),),
        (QUEUE_PROCESS,)),
    Mutant(
        "data-uri-uncapped",
        "a data: URI's raw length is not capped before it is decoded (the URI's and the "
        "payload's length checks gone)",
        (Edit("providers/data_uri.py", "    if len(uri) > longest:\n", "    if False:\n"),
         Edit("providers/data_uri.py",
              "    if payload > longest_payload(max_bytes, is_base64):\n",
              "    if False:\n")),
        (CONTENT,)),
    Mutant(
        "safe-error-identity",
        "safe_error returns its input: errors keep query strings, keys and their length",
        (Edit("engine/rules/redact.py",
              "    out = unescaped(text)\n",
              "    return text\n"),),
        (REDACT,)),
    Mutant(
        "pricing-globs-summed",
        "every matching pricing rate is charged (overlapping model globs add up) instead "
        "of the most specific per unit",
        (Edit("engine/calls/pricing.py",
              "            if rate.unit not in best or rank > best[rate.unit][0]:\n"
              "                best[rate.unit] = (rank, rate)\n",
              "            best[f\"{rate.unit}#{len(best)}\"] = (rank, rate)\n"),),
        (PRICING,)),
    Mutant(
        "pricing-hook-on-the-loop",
        "a host's pricing hook runs on the event loop with no timeout (as the built-in "
        "pricing does)",
        (Edit("engine/calls/finalize.py",
              "        if isinstance(self.pricing, BUILTIN):\n",
              "        if True:\n"),),
        (PRICING_HOOK,)),
    Mutant(
        "flat-config-unsplit",
        "a flat config file is not split between the actors: each reads all of it (the "
        "finalizer fails on repoll_interval_s)",
        (Edit("engine/config.py",
              "        return _flat_share(data, section, path), str(path)\n",
              "        return dict(data), str(path)\n"),),
        (RECONCILE_CONFIG,)),
    Mutant(
        "task-created-no-heartbeat",
        "TaskCreated no longer stamps the call's first heartbeat (a worker killed before "
        "its first poll waits out the kind's threshold)",
        (Edit("engine/database/appending.py",
              "        beat_at=beat.at if beat is not None else None,\n",
              "        beat_at=None,\n"),),
        (FIRST_BEAT,)),
    Mutant(
        "run-append-unfenced",
        "a run of events may hold a CallStarted or HostEnded after its first event, whose "
        "own fence is then not applied",
        (Edit("engine/database/appending.py",
              "    if len(events) > 1 and any(isinstance(e, CallStarted | HostEnded | "
              "LeftoverSettled)\n",
              "    if False and any(isinstance(e, CallStarted | HostEnded | LeftoverSettled)\n"),),
        (WRITE,)),
    Mutant(
        "own-task-no-resume",
        "an own-call task redelivered after its process died does not run the host's code "
        "on a call to resume: nobody polls it until the reconciler's threshold",
        (Edit("engine/queue/own.py",
              '    if call.action not in ("create", "resume"):\n',
              '    if call.action != "create":\n'),
         Edit("engine/queue/own.py",
              '    "ambiguous": "ambiguous create',
              '    "resume": "",\n    "ambiguous": "ambiguous create'),),
        (QUEUES,)),
    Mutant(
        "admission-unlocked",
        "a start counts the account's calls without the account's lock (issue 42): two "
        "starts at once both see a free slot and both start",
        (Edit("migrations/0018_admission.sql",
              "    PERFORM pg_catalog.pg_advisory_xact_lock(\n"
              "        pg_catalog.hashtextextended('callwarden.admit:' || v_limit.account, 0));",
              "    PERFORM 1;"),),
        ("tests/integration/test_admission.py",)),
    Mutant(
        "admission-one-over",
        "a full account admits one start more than its cap (issue 42)",
        (Edit("migrations/0018_admission.sql",
              "        IF v_n >= v_cap THEN", "        IF v_n > v_cap THEN"),),
        ("tests/integration/test_admission.py",)),
    Mutant(
        "follow-balance-trigger-anywhere",
        "the balance trigger's function runs on any table under any name (issue 41): a role "
        "that may execute it credits any balance from a table of its own",
        (Edit("migrations/0020_follow_balance.sql",
              "    IF TG_RELID <> '@host@.usage_logs'::regclass OR TG_NAME <> "
              "'callwarden_balance' THEN",
              "    IF false THEN"),),
        ("tests/integration/test_follow_balance.py",)),
    Mutant(
        "polled-url-string-read-as-letters",
        "Polled takes one URL string for its list of files (issue 41): a call succeeds with "
        "a file per character and without its result",
        (Edit("providers/polled.py",
              "        if isinstance(said, str | bytes):\n",
              "        if isinstance(said, bytes):\n"),),
        ("tests/integration/providers/test_polled.py",)),
    Mutant(
        "provider-429-fails-limited-call",
        "a provider's 429 on a create of a limited account's kind fails and refunds the "
        "call at once instead of slowing the account and creating again (issue 42)",
        (Edit("engine/calls/runner.py",
              "                if pause is None:\n                    return await self._failed(",
              "                if True:\n                    return await self._failed("),),
        ("tests/integration/test_admission_backoff.py",)),
    Mutant(
        "host-api-claims-twice",
        "the host API's start_call tells a second delivery of a started call to create "
        "(a Node worker's redelivery creates a second upstream task)",
        (Edit("migrations/0018_admission.sql",
              "CASE WHEN start_call.recreate THEN 'create' ELSE 'ambiguous' END",
              "'create'"),),
        ("tests/integration/test_host_api.py",)),
    Mutant(
        "host-api-error-unredacted",
        "the host API's failed() records the host's error text as given (credentials, "
        "query strings and all)",
        (Edit("migrations/0014_host_api.sql",
              "    v_error text := callwarden.safe_error(COALESCE(NULLIF(failed.error, ''), "
              "'failed'));",
              "    v_error text := COALESCE(NULLIF(failed.error, ''), 'failed');"),),
        ("tests/integration/test_host_api.py",)),
    Mutant(
        "apply-event-off-the-fold",
        "the host API's apply_event, edited by hand after it was rendered, stops counting "
        "reconcile attempts (a hand-kept twin drifting from the fold)",
        (Edit("migrations/0017_one_definition.sql",
              "v.reconcile_attempts := v.reconcile_attempts + 1;",
              "v.reconcile_attempts := v.reconcile_attempts;"),),
        ("tests/integration/test_apply_event.py",)),
    Mutant(
        "host-api-repeat-not-own",
        "the host API answers a repeat of an actor's own outcome after a lost reply as "
        "another actor's (ok false: a host following the docs undoes its own completed job)",
        (Edit("migrations/0016_host_api_hardened.sql",
              "AND e.payload @> repeated.same) THEN",
              "AND false) THEN"),),
        ("tests/integration/test_host_api.py",)),
    Mutant(
        "host-api-beat-after-host-ended",
        "the host API's heartbeat keeps answering true after the host ended the job in its "
        "own SQL (the Node worker polls on for a cancelled job)",
        (Edit("migrations/0016_host_api_hardened.sql",
              "      AND COALESCE(t.status, 'pending') IN ('pending', 'processing');",
              ";"),),
        ("tests/integration/test_host_api.py",)),
    Mutant(
        "leftover-settled-at-once",
        "a reservation the host left on a job it completed is committed as soon as the "
        "completion is recorded, not host_left_after_s later (the host's own commit, its "
        "next statement, finds nothing: the user pays the reservation, not the amount)",
        (Edit("engine/reconciler/outside.py",
              "    if now - p.call_finished_at < timedelta(seconds=config.host_left_after_s):\n",
              "    if False:\n"),
         Edit("engine/reconciler/outside.py",
              "        before = now - timedelta(seconds=self.config.host_left_after_s)\n",
              "        before = now + timedelta(seconds=1)\n"),),
        ("tests/integration/test_ended_outside.py",)),
    Mutant(
        "ended-outside-not-recorded",
        "jobs a host ended with no call are never recorded (verify and audit never see "
        "them, what the host left reserved on them stays reserved)",
        (Edit("engine/reconciler/outside.py",
              "        if not self.config.outside_window_s:\n            return 0\n",
              "        return 0\n"),),
        ("tests/integration/test_ended_outside.py",)),
)

SANITY: tuple[Mutant, ...] = (
    Mutant("(unmutated copy)", "the copy passes every test file the table names", (),
           (), expect_caught=False),
    Mutant("(copy is what runs)", "a completed call refunds: proves the tests import the "
           "copy's code, not the checkout's",
           (Edit("events/states.py", "    S.COMPLETED: \"committed\",\n",
                 "    S.COMPLETED: \"refunded\",\n"),), (FOLD,)),
)


#: The README's default test run, stopping at the first failure.
DEFAULT_RUN = ("-n", "2", "--dist", "loadgroup")


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    exit_code: int
    seconds: float
    failed: tuple[tuple[str, str], ...]  # (nodeid, message), in the order they failed
    collection_errors: tuple[str, ...]
    tail: str

    @property
    def caught(self) -> bool:
        return self.exit_code in (1, 2) and bool(self.failed) and not self.collection_errors

    @property
    def ok(self) -> bool:
        return self.caught if self.mutant.expect_caught else self.exit_code == 0

    @property
    def first_failure(self) -> str:
        return self.failed[0][0] if self.failed else ""


_SKIP = {".git", ".venv", "__pycache__", ".hypothesis", ".mypy_cache", ".ruff_cache",
         ".pytest_cache", "dist", "build"}


def _files(src: Path) -> list[str]:
    """The checkout's tracked and new (not ignored) files; without git, every file outside
    the caches, the venv and build output."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(src)) for p in src.rglob("*")
                if p.is_file() and not _SKIP & set(p.relative_to(src).parts)]
    return list(filter(None, listed.decode().split("\0")))


def copy_checkout(src: Path, dest: Path) -> None:
    """The checkout's files, as in the working tree, copied to ``dest``."""
    for name in _files(src):
        source = src / name
        if not source.is_file():
            continue  # deleted in the working tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def apply_edits(copy: Path, edits: Sequence[Edit]) -> dict[Path, str]:
    """Apply ``edits``; the original texts (to undo them). Raises if an old text is not
    found exactly once."""
    originals: dict[Path, str] = {}
    for edit in edits:
        path = copy / edit.path
        text = path.read_text(encoding="utf-8")
        originals.setdefault(path, text)
        count = text.count(edit.old)
        if count != 1:
            raise SystemExit(f"mutant out of step with the code: {edit.path} holds the old "
                             f"text {count} times (expected once):\n{edit.old}")
        path.write_text(text.replace(edit.old, edit.new), encoding="utf-8")
    return originals


@dataclass(frozen=True)
class Plan:
    """What one row runs: the whole default run with ``first`` first, or (``only``) just
    those files."""

    first: tuple[str, ...] = ()
    only: tuple[str, ...] = ()

    def arguments(self) -> list[str]:
        if self.only:
            return list(self.only)
        return [*(f"--run-first={t}" for t in self.first), "tests"]


def run_tests(copy: Path, plan: Plan, tmp: Path) -> tuple[int, dict[str, Any], str]:
    """Run ``plan`` in ``copy``: the exit status, the plugin's report (empty if none was
    written) and the output's last lines."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE",
                                                            "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "build" / "package"), str(copy)])
    env["HYPOTHESIS_PROFILE"] = "ci"
    basetemp, report = tmp / "bt", tmp / "report.json"
    shutil.rmtree(basetemp, ignore_errors=True)
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", *DEFAULT_RUN, "--no-loadscope-reorder", "-x", "-q",
           "-p", "no:cacheprovider", "-p", "tests.mutations.first",
           f"--mutation-report={report}", f"--basetemp={basetemp}", *plan.arguments()]
    log = tmp / "pytest.log"
    with log.open("w", encoding="utf-8") as out:
        # A session of its own: on a timeout the whole tree (xdist workers, the servers
        # and worker processes the tests start) is killed, not only pytest.
        proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=PER_MUTANT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -1
    lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    found: dict[str, Any] = (json.loads(report.read_text(encoding="utf-8"))
                             if report.is_file() else {})
    tail = "\n".join(lines[-15:])
    if code == -1:
        tail = f"timed out after {PER_MUTANT_TIMEOUT_S} s\n{tail}"
    return code, found, tail


def run_one(copy: Path, mutant: Mutant, plan: Plan, tmp: Path) -> Outcome:
    originals = apply_edits(copy, mutant.edits)
    start = time.monotonic()
    try:
        code, found, tail = run_tests(copy, plan, tmp)
    finally:
        for path, text in originals.items():
            path.write_text(text, encoding="utf-8")
    failed = tuple((str(n), str(m)) for n, m in found.get("failed", ()))
    errors = tuple(str(e) for e in found.get("collection_errors", ()))
    return Outcome(mutant, code, time.monotonic() - start, failed, errors, tail)


def _short(nodeid: str) -> str:
    """``tests/unit/test_fold.py::test_x[a]`` -> ``test_fold.py::test_x[a]``."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).name}::{rest}" if rest else Path(path).name


def _verdict(row: Outcome) -> str:
    if not row.mutant.expect_caught:
        return "passed" if row.exit_code == 0 else f"FAILED (exit {row.exit_code})"
    if row.caught:
        named = row.first_failure.split("::")[0] in row.mutant.tests
        return "yes" if named or not row.mutant.tests else "yes (outside tests=)"
    if row.exit_code == 0:
        return "NO (survived)"
    return f"error (exit {row.exit_code})"


def _table(rows: Sequence[Outcome | Mutant]) -> Table:
    table = Table(title="mutation check")
    for col in ("mutant", "bug", "where", "tests (first)", "caught",
                "caught by (first failure)", "s"):
        table.add_column(col, overflow="fold")
    for row in rows:
        m = row.mutant if isinstance(row, Outcome) else row
        tests = ", ".join(Path(t).name for t in m.tests) or "all of the table's"
        where = ", ".join(dict.fromkeys(e.path for e in m.edits))
        if isinstance(row, Outcome):
            first = _short(row.first_failure) if row.caught else ""
            table.add_row(m.name, m.bug, where, tests, _verdict(row), first,
                          f"{row.seconds:.0f}")
        else:
            table.add_row(m.name, m.bug, where, tests, "", "", "")
    return table


def _plan(mutant: Mutant, args: argparse.Namespace, every_test: tuple[str, ...]) -> Plan:
    if not mutant.expect_caught:  # the unmutated copy
        return Plan(first=every_test) if args.full_sanity else Plan(only=every_test)
    if args.against:
        return Plan(only=tuple(args.against))
    if args.named_only:
        return Plan(only=mutant.tests)
    return Plan(first=mutant.tests)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the table, run nothing")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this mutant (repeatable; skips the sanity rows)")
    parser.add_argument("--no-sanity", action="store_true", help="skip the sanity rows")
    parser.add_argument("--full-sanity", action="store_true",
                        help="the unmutated copy runs the whole default run, not only the "
                             "files the table names")
    parser.add_argument("--sanity-only", action="store_true", help="run the sanity rows only")
    parser.add_argument("--against", action="append", default=[], metavar="FILE",
                        help="run the mutants against FILE only, not the whole run "
                             "(repeatable; to find the files that catch one)")
    parser.add_argument("--named-only", action="store_true",
                        help="run each mutant against its named files only")
    args = parser.parse_args(argv)
    console = Console(width=200)
    known = {m.name for m in MUTANTS}
    unknown = set(args.only) - known
    if unknown:
        parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
    missing = [t for m in MUTANTS for t in m.tests if not (ROOT / t).is_file()]
    for name in args.against:
        if not (ROOT / name).is_file():
            missing.append(name)
    if missing:
        parser.error(f"no such test file: {', '.join(sorted(set(missing)))}")
    if args.list:
        console.print(_table([*SANITY, *MUTANTS]))
        return 0
    chosen = [] if args.sanity_only else [m for m in MUTANTS
                                           if not args.only or m.name in args.only]
    every_test = tuple(dict.fromkeys(t for m in MUTANTS for t in m.tests))
    sanity = () if args.only or args.no_sanity else SANITY
    outcomes: list[Outcome] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cw-mut-") as folder:
        tmp = Path(folder)
        copy = tmp / "src"
        copy_checkout(ROOT, copy)
        link_tree(copy / "build" / "package", copy)
        for mutant in chosen:  # every edit must still match before anything runs
            for path, text in apply_edits(copy, mutant.edits).items():
                path.write_text(text, encoding="utf-8")
        for mutant in (*sanity, *chosen):
            outcome = run_one(copy, mutant, _plan(mutant, args, every_test), tmp)
            outcomes.append(outcome)
            if outcome.caught:
                node, message = outcome.failed[0]
                said = f"caught by {node} ({message[:160]})"
            else:
                said = _verdict(outcome)
            mark = "ok" if outcome.ok else "NOT OK"
            console.print(f"{mutant.name}: {said} in {outcome.seconds:.0f} s "
                          f"(exit {outcome.exit_code}, {mark})", markup=False, highlight=False)
            if not outcome.ok:
                console.print(outcome.tail, markup=False, highlight=False)
    console.print(_table(outcomes))
    scored = [o for o in outcomes if o.mutant in chosen]
    caught = sum(o.caught for o in scored)
    console.print(f"mutation score: {caught}/{len(scored)} caught "
                  f"({time.monotonic() - began:.0f} s in all)")
    return 0 if all(o.ok for o in outcomes) else 1
