"""What every long-running command sets up the same way: its log lines.

callwarden's own loggers (``callwarden.*``) go to ``stream`` (stderr) or a file. The
connection pool's reconnect warnings (one per failed attempt while the database is down)
are kept to errors: the actors log an outage once, when it starts and when it ends
(:mod:`engine.store.outage`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

__all__ = ["FORMAT", "setup_logging"]

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(*, stream: TextIO | None = None, file: Path | None = None,
                  level: int = logging.INFO,
                  loggers: tuple[str, ...] = ("callwarden",)) -> None:
    """Send ``loggers``' lines (callwarden's own; ``serve`` adds ``aiohttp.access``) to
    ``file`` if given, else to ``stream`` (stderr)."""
    handler: logging.Handler = (logging.FileHandler(file, encoding="utf-8")
                                if file is not None
                                else logging.StreamHandler(stream or sys.stderr))
    handler.setFormatter(logging.Formatter(FORMAT))
    for name in loggers:
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.setLevel(level)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
