"""What every long-running command sets up the same way: its log lines.

callwarden's own loggers (``callwarden.*``) go to ``stream`` (stderr) or a file. The
connection pool's reconnect warnings (one per failed attempt while the database is down)
are kept to errors: the actors log an outage once, when it starts and when it ends
(:mod:`callwarden.database.outage`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

__all__ = ["FORMAT", "setup_logging"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Stderr(logging.StreamHandler[TextIO]):
    """A handler writing to ``sys.stderr`` as it is when a line is logged, not as it was
    when the handler was made: a command run again in one process (tests, an embedding
    host) whose stderr was replaced and closed meanwhile still logs where stderr is."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass  # (StreamHandler's __init__ sets it)


def setup_logging(*, stream: TextIO | None = None, file: Path | None = None,
                  level: int = logging.INFO,
                  loggers: tuple[str, ...] = ("callwarden",)) -> None:
    """Send ``loggers``' lines (callwarden's own; ``serve`` adds ``aiohttp.access``) to
    ``file`` if given, else to ``stream`` (stderr)."""
    handler: logging.Handler = (logging.FileHandler(file, encoding="utf-8")
                                if file is not None
                                else logging.StreamHandler(stream) if stream is not None
                                else _Stderr())
    handler.setFormatter(logging.Formatter(FORMAT))
    for name in loggers:
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.setLevel(level)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


# -- the environment each command reads (shown by its --help) -----------------------------

ENV: dict[str, str] = {
    "DATABASE_URL": "an existing Postgres (unset: the embedded one in --data-dir)",
    "CALLWARDEN_DB_POOLER": "transaction: DATABASE_URL is a transaction pooler (no "
                            "prepared statements)",
    "CALLWARDEN_DB_OUTAGE_LIMIT_S": "seconds a database outage may last before it is "
                                    "reported (default 300; --once exits 1)",
    "CALLWARDEN_<PROVIDER>_URL": "a provider's base URL (KIE, REPLICATE, ELEVENLABS, "
                                 "ANTHROPIC, or a host's provider; e.g. the simulator)",
    "CALLWARDEN_CONFIG": "the settings file (TOML or JSON) when --config is not given",
    "CALLWARDEN_PROVIDERS": "the host's provider adapters, module:attr comma-separated "
                            "(besides the callwarden.providers entry points)",
    "KIE_API_KEY, REPLICATE_API_TOKEN, ELEVENLABS_API_KEY, ANTHROPIC_API_KEY":
        "provider credentials",
    "CALLWARDEN_MEDIA_DIR, CALLWARDEN_MEDIA_S3_BUCKET, CALLWARDEN_MEDIA_S3_ENDPOINT_URL":
        "where result media is stored (reconcile and serve: one is required)",
    "CALLWARDEN_MEDIA_ALLOW_HOSTS": "extra hosts media may be fetched from (comma-separated)",
    "CALLWARDEN_PRICING_FILE": "a price list charging completed calls from reported usage",
    "CALLWARDEN_CALL_<FIELD>": "the [calls] settings (e.g. CALLWARDEN_CALL_FINALIZE_LEASE_S)",
    "CALLWARDEN_CALLBACK_BASE_URL": "callwarden serve's URL, for per-job callback URLs",
    "CALLWARDEN_RECONCILE_<FIELD>": "the [reconcile] settings (per kind: "
                                    "CALLWARDEN_RECONCILE_THRESHOLD_<KIND>)",
    "CALLWARDEN_WEBHOOK_<FIELD>": "the [webhooks] settings (e.g. ..._MAX_BODY_BYTES)",
    "CALLWARDEN_<PROVIDER>_WEBHOOK_SECRET, CALLWARDEN_KIE_WEBHOOK_HMAC_KEY":
        "webhook signing secrets",
    "CALLWARDEN_ADMIN_TOKEN": "the admin token (unset: the admin actions are off)",
    "CALLWARDEN_READ_TOKEN": "the operator listener's read token (unset: none asked)",
    "CALLWARDEN_SERVE_<FIELD>": "the [serve] listeners: HOST, PORT (webhooks), "
                                "OPERATOR_HOST, OPERATOR_PORT (dashboard, /metrics)",
    "CALLWARDEN_FAILPOINTS": "crash at a named point (tests and drills)",
    "CALLWARDEN_REDIS_URL": "demo --queue: the Redis of Celery or arq (unset: a private "
                            "redis-server)",
}
_DB = ["DATABASE_URL", "CALLWARDEN_DB_POOLER"]
_LONG = [*_DB, "CALLWARDEN_DB_OUTAGE_LIMIT_S"]  # the commands that ride through outages
_PROVIDERS = ["CALLWARDEN_CONFIG", "CALLWARDEN_PROVIDERS", "CALLWARDEN_<PROVIDER>_URL",
              "KIE_API_KEY, REPLICATE_API_TOKEN, ELEVENLABS_API_KEY, ANTHROPIC_API_KEY",
              "CALLWARDEN_MEDIA_DIR, CALLWARDEN_MEDIA_S3_BUCKET, "
              "CALLWARDEN_MEDIA_S3_ENDPOINT_URL", "CALLWARDEN_MEDIA_ALLOW_HOSTS",
              "CALLWARDEN_PRICING_FILE", "CALLWARDEN_CALL_<FIELD>"]
COMMAND_ENV: dict[str, list[str]] = {
    "migrate": ["DATABASE_URL"], "status": _DB,
    "audit": _DB, "jobs": _DB, "verify": _DB, "rebuild": _DB,
    "stats": [*_DB, "CALLWARDEN_RECONCILE_<FIELD>"],
    "worker": [*_LONG, *_PROVIDERS, "CALLWARDEN_CALLBACK_BASE_URL", "CALLWARDEN_FAILPOINTS"],
    "enqueue": _DB,
    "reconcile": [*_LONG, *_PROVIDERS, "CALLWARDEN_RECONCILE_<FIELD>"],
    "serve": [*_LONG, *_PROVIDERS, "CALLWARDEN_RECONCILE_<FIELD>", "CALLWARDEN_WEBHOOK_<FIELD>",
              "CALLWARDEN_<PROVIDER>_WEBHOOK_SECRET, CALLWARDEN_KIE_WEBHOOK_HMAC_KEY",
              "CALLWARDEN_ADMIN_TOKEN", "CALLWARDEN_READ_TOKEN", "CALLWARDEN_SERVE_<FIELD>"],
    "check": [*_DB, *_PROVIDERS, "CALLWARDEN_RECONCILE_<FIELD>", "CALLWARDEN_WEBHOOK_<FIELD>",
              "CALLWARDEN_SERVE_<FIELD>"],
    "demo": ["DATABASE_URL", "CALLWARDEN_DB_OUTAGE_LIMIT_S", "CALLWARDEN_REDIS_URL"],
}


def env_help(command: str) -> str | None:
    """The ``environment:`` block of ``command``'s --help (None: it reads none)."""
    names = COMMAND_ENV.get(command)
    if not names:
        return None
    width = max(len(n) for n in names if len(n) <= 40)
    lines = [f"  {n:<{width}}  {ENV[n]}" if len(n) <= 40 else f"  {n}\n  {'':<{width}}  {ENV[n]}"
             for n in names]
    return "environment:\n" + "\n".join(lines)
