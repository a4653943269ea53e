"""Where a long-running command stores result media — said, never guessed.

``reconcile`` and ``serve`` finalize calls whose results are files (every kind but the
language models'). Without a configured store they used to write under the user's data
folder (``~/.local/share/callwarden/media``), on whichever machine they ran: files the
host's web app never finds. They now refuse to start (exit 2) unless one is named:
``CALLWARDEN_MEDIA_DIR``, ``CALLWARDEN_MEDIA_S3_BUCKET``, or ``--media-dir``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from callwarden.errors import ConfigError
from callwarden.providers.kinds import KINDS
from callwarden.providers.storage import MediaStore, media_from_env

__all__ = ["MEDIA_SETTINGS", "configured_media"]

#: The settings that name a media store (one of them, or ``--media-dir``, is required).
MEDIA_SETTINGS = ("CALLWARDEN_MEDIA_DIR", "CALLWARDEN_MEDIA_S3_BUCKET")


def configured_media(env: Mapping[str, str], media_dir: Path | None, command: str
                     ) -> MediaStore:
    """The store ``env`` (or ``--media-dir``) names; :class:`ConfigError` naming the
    settings when none does and a registered kind's results may be files."""
    if media_dir is not None:
        env = {**env, "CALLWARDEN_MEDIA_DIR": str(media_dir)}
    named = any(env.get(name, "").strip() for name in MEDIA_SETTINGS)
    media_kinds = sorted(k for k, spec in KINDS.items() if spec.media_results)
    if not named and media_kinds:
        shown = ", ".join(media_kinds[:3]) + (", ..." if len(media_kinds) > 3 else "")
        raise ConfigError(
            f"{command}: no media store configured: set CALLWARDEN_MEDIA_DIR (a folder the "
            f"host's app reads) or CALLWARDEN_MEDIA_S3_BUCKET, or pass --media-dir; calls "
            f"of {shown} complete with files, and this process would store them")
    return media_from_env(env, default_dir=Path(env.get("CALLWARDEN_MEDIA_DIR") or "."))
