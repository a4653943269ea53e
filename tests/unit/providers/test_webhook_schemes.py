"""The providers that call back are described in ``providers/`` alone: each scheme in
``callwarden.providers.registry.WEBHOOKS`` names its provider's kinds (from the kind registry), its
secret's variable, whether its body is trusted, and builds its own callback URLs; the
engine's receiver derives its routes and callback URLs from them (no provider named in
``engine/``)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from callwarden.calls.callbacks import callback_url_for
from callwarden.providers.kinds import KINDS
from callwarden.providers.registry import WEBHOOKS
from callwarden.service.webhooks import WebhookConfig

ROOT = Path(__file__).resolve().parents[3]


def test_every_scheme_covers_kinds_of_its_own_provider() -> None:
    for name, scheme in WEBHOOKS.items():
        assert scheme.provider == name
        assert scheme.kinds
        assert all(KINDS[k].provider == name for k in scheme.kinds)
        assert re.fullmatch(r"CALLWARDEN_[A-Z]+_WEBHOOK_[A-Z_]+", scheme.secret_env)
        assert scheme.tolerance_s > 0


def test_secrets_come_from_each_schemes_variable() -> None:
    env = {s.secret_env: f"secret-of-{n}" for n, s in WEBHOOKS.items()}
    assert WebhookConfig.from_env(env).secrets == {n: f"secret-of-{n}" for n in WEBHOOKS}
    assert WebhookConfig.from_env({}).secrets == {}


def test_callback_urls_are_the_schemes_own() -> None:
    job = uuid.uuid4()
    for kind, spec in KINDS.items():
        url = callback_url_for("http://svc/", job, kind, "tok")
        scheme = WEBHOOKS.get(spec.provider)
        if spec.mode != "async" or scheme is None:
            assert url is None, kind
        else:
            assert url == scheme.callback_url("http://svc/", job, "tok"), kind
    assert callback_url_for("http://svc", job, "kie-standard", None) is None


def test_the_receiver_names_no_provider() -> None:
    source = (ROOT / "engine" / "service" / "webhooks.py").read_text(encoding="utf-8")
    code = re.sub(r'""".*?"""', "", source, flags=re.S)
    for provider in ("replicate", "kie", "elevenlabs"):
        assert provider not in code.lower(), provider
