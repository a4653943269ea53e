"""The host contract: the tables and columns callwarden reads and writes on the host's side
of the schema, the statuses it reads and writes, and what it needs of their defaults.

Pure data. ``callwarden check`` (:mod:`callwarden.cli.check`) compares a database with it,
docs/embedding.md ("The host contract") shows it, and
``tests/unit/test_host_contract.py`` keeps the two equal. callwarden's own columns (the
call projection on ``jobs``, ``call_events``, the leases) are the migrations' business:
``check`` asks only that every migration is applied.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["CONTRACT", "JOB_STATUSES_READ", "JOB_STATUSES_WRITTEN", "Column", "Table"]

Family = Literal["uuid", "text", "text or uuid", "jsonb", "numeric", "integer", "boolean",
                 "timestamptz", "text[]"]


class Column(msgspec.Struct, frozen=True, kw_only=True):
    """``min_chars``: the longest text callwarden writes there (a ``varchar(n)`` below it
    would fail the write that ends a call)."""

    name: str
    family: Family
    why: str
    min_chars: int | None = None


class Table(msgspec.Struct, frozen=True, kw_only=True):
    """``inserts``: what of callwarden inserts rows (so every other NOT NULL column of the
    host's needs a default); ``always``: on every completed call (else only when the host
    creates its jobs through :func:`~callwarden.database.jobs.create_job`)."""

    name: str
    columns: tuple[Column, ...]
    inserts: str | None = None
    always: bool = False


def _c(name: str, family: Family, why: str, min_chars: int | None = None) -> Column:
    return Column(name=name, family=family, why=why, min_chars=min_chars)


CONTRACT: tuple[Table, ...] = (
    Table(name="jobs", inserts="create_job", columns=(
        _c("id", "uuid", "the job; every event and reservation names it"),
        _c("user_id", "text or uuid", "whose credits and assets"),
        _c("status", "text", "the host's word: pending/processing open, anything else ends "
                             "the call as the host decided"),
        _c("input_data", "jsonb", "the reference worker's request (provider_kind, request)"),
        _c("output_data", "jsonb", "the result written at completion"),
        _c("error_message", "text", "why a call failed (up to 1,000 characters and a note "
                                    "of what was cut)", min_chars=1100),
        _c("job_type", "text", "shown by the dashboard and stats"),
        _c("workflow_execution_id", "uuid", "a workflow node's run, reopened at completion"),
        _c("node_id", "text", "the node of that run"),
        _c("is_public", "boolean", "copied to the job's assets (NULL: public)"),
        _c("progress", "integer", "the provider's progress, 100 at completion"),
        _c("provider_cost", "numeric", "what the provider reported the call cost"),
        _c("created_at", "timestamptz", "the age of a call-less row"),
        _c("started_at", "timestamptz", "when a worker took the job (its staleness)"),
        _c("completed_at", "timestamptz", "stamped when a call ends"),
        _c("updated_at", "timestamptz", "stamped on every transition"),
    )),
    Table(name="usage_logs", inserts="create_job", columns=(
        _c("job_id", "uuid", "the job the reservation is for"),
        _c("user_id", "text or uuid", "whose credits"),
        _c("status", "text", "reserved, then committed or refunded exactly once"),
        _c("credits_reserved", "numeric", "what was held"),
        _c("credits_charged", "numeric", "what was committed"),
        _c("settled_at", "timestamptz", "when it was settled"),
    )),
    Table(name="assets", inserts="the finalizer (one row per stored file)", always=True,
          columns=(
        _c("job_id", "uuid", "the job the file belongs to"),
        _c("user_id", "text or uuid", "the owner"),
        _c("storage_key", "text", "where the file is stored (unique per job)"),
        _c("url", "text", "how the host serves it: `<base URL>/<path>` when the media "
           "store has one (`CALLWARDEN_MEDIA_BASE_URL`), else the file's `file://` URI "
           "(absolute, normalised) or the object's `s3://` URI"),
        _c("content_type", "text", "the file's type"),
        _c("size_bytes", "integer", "its size"),
        _c("is_public", "boolean", "the job's is_public"),
    )),
    Table(name="workflow_executions", columns=(
        _c("id", "uuid", "the run"),
        _c("status", "text", "reopened (running) or failed as its nodes end"),
        _c("failed_nodes", "text[]", "the nodes that failed"),
        _c("error_message", "text", "why the run failed", min_chars=1100),
        _c("updated_at", "timestamptz", "stamped when it changes"),
    )),
)

#: ``jobs.status`` values that mean the job is open (``NULL`` counts as pending).
JOB_STATUSES_READ = ("pending", "processing")
#: ``jobs.status`` values callwarden writes (a host CHECK constraint must allow them).
JOB_STATUSES_WRITTEN = ("processing", "completed", "failed", "cancelled")
