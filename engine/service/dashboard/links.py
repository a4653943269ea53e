"""Where an operator can see an upstream task on its provider's own site (pure).

Only kinds whose provider has a public, per-task page are listed: a Replicate prediction
(``https://replicate.com/p/<id>``, the ``urls.web`` the API returns). KIE, ElevenLabs and
Anthropic show tasks in their consoles without a per-task address.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["PROVIDER_TASK_URLS", "provider_task_url"]

PROVIDER_TASK_URLS: dict[str, str] = {
    "replicate-prediction": "https://replicate.com/p/{task_id}",
}


def provider_task_url(kind: str | None, task_id: str | None) -> str | None:
    """The provider's page for ``task_id`` of ``kind``, or ``None`` when it has none."""
    if kind is None or not task_id or kind not in PROVIDER_TASK_URLS:
        return None
    return PROVIDER_TASK_URLS[kind].format(task_id=quote(task_id, safe=""))
