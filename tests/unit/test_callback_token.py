"""A callback URL's secret token (``/webhooks/<provider>/<job>/<token>``) is hidden by one
rule (:func:`callwarden.rules.redact.without_callback_token`): the job page
(:func:`callwarden.service.dashboard.redaction.redact_text`) and the service's access log
(:func:`callwarden.service.app.redact_path`) hide the same segment of the same paths, the
page writing ``[redacted]`` where the log, which needs a path segment, writes
``redacted``."""

from __future__ import annotations

import uuid

import pytest

from callwarden.rules.redact import REDACTED, without_callback_token
from callwarden.service.app import PATH_REDACTED, redact_path
from callwarden.service.dashboard.redaction import redact_text

JOB = uuid.UUID(int=7)
TOKEN = "Xq3_hF8-kP2vN9wLr0sT5yZ1aB4cD6eG"  # as ensure_callback_token makes one

PATHS = [
    f"/webhooks/kie/{JOB}/{TOKEN}",                         # KIE's callback path
    f"https://cw.example:8443/webhooks/kie/{JOB}/{TOKEN}",  # the whole callback URL
    f"/webhooks/kie/{JOB}/{TOKEN}/more",                    # a segment after the token
    f"/webhooks/acme/{JOB}/{TOKEN}",        # a host adapter's signal scheme
    f"/prefix/webhooks/kie/{JOB}/{TOKEN}",  # the service mounted under a prefix
    "/webhooks/replicate",                  # a signed-body scheme: no token in its path
    f"/webhooks/kie/{JOB}",
    "/healthz",
]


@pytest.mark.parametrize("path", PATHS)
def test_the_page_and_the_access_log_hide_the_same_token(path: str) -> None:
    logged, shown = redact_path(path), redact_text(path)
    assert TOKEN not in logged
    assert TOKEN not in shown
    assert logged == shown.replace(REDACTED, PATH_REDACTED)
    assert logged == without_callback_token(path, PATH_REDACTED)


def test_only_the_token_goes() -> None:
    assert redact_path(f"/webhooks/kie/{JOB}/{TOKEN}?x=1") == f"/webhooks/kie/{JOB}/redacted?x=1"
    assert redact_text(f"POST https://h.example/webhooks/kie/{JOB}/{TOKEN} failed") == (
        f"POST https://h.example/webhooks/kie/{JOB}/[redacted] failed")
    assert redact_path("/webhooks/replicate") == "/webhooks/replicate"
