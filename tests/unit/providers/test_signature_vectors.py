"""Each webhook signature scheme against its vectors (``signature_vectors.json`` per
provider, each naming its source). Replicate's are the official Svix vectors the SDKs test
with (evidence ``C``). KIE's docs and ElevenLabs' SDK tests give the algorithm but publish
no literal expected value (the SDK tests compute theirs at run time), so those files are
``D`` (derived): their values are recomputed here from the published algorithm with
``hmac`` directly, independently of the providers' webhook modules, before our signer and
verifier are checked against them."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import pytest

from callwarden.providers.elevenlabs.webhook import elevenlabs_sign, verify_elevenlabs
from callwarden.providers.errors import SignatureError
from callwarden.providers.kie.webhook import kie_sign, verify_kie
from callwarden.providers.replicate.webhook import replicate_sign, verify_replicate
from tests.recorded import vectors

REPLICATE = vectors("replicate")
KIE = vectors("kie")
ELEVENLABS = vectors("elevenlabs")


@pytest.mark.parametrize("v", REPLICATE["vectors"])
def test_replicate_official_svix_vector(v: dict[str, Any]) -> None:
    body, ts = v["body"].encode(), int(v["timestamp"])
    assert replicate_sign(v["secret"], v["id"], ts, body) == v["signature"]
    headers = {"webhook-id": v["id"], "webhook-timestamp": str(ts),
               "webhook-signature": v["signature"]}
    assert verify_replicate(v["secret"], headers, body, now=ts) == v["id"]


@pytest.mark.parametrize("v", REPLICATE["negative_vectors"])
def test_replicate_official_negative_vector_is_refused(v: dict[str, Any]) -> None:
    ts = int(v["timestamp"])
    headers = {"webhook-id": v["id"], "webhook-timestamp": str(ts),
               "webhook-signature": v["signature"]}
    with pytest.raises(SignatureError):
        verify_replicate(v["secret"], headers, v["body"].encode(), now=ts)


@pytest.mark.parametrize("v", KIE["vectors"])
def test_kie_vectors_follow_the_documented_algorithm(v: dict[str, Any]) -> None:
    """docs.kie.ai webhook verification: base64(HMAC-SHA256(key, taskId + "." + ts))."""
    mac = hmac.new(v["key"].encode(), f"{v['task_id']}.{v['timestamp']}".encode(),
                   hashlib.sha256).digest()
    assert base64.b64encode(mac).decode() == v["signature"]


@pytest.mark.parametrize("v", ELEVENLABS["vectors"])
def test_elevenlabs_vectors_follow_the_sdk_algorithm(v: dict[str, Any]) -> None:
    """elevenlabs-python webhooks_custom.py: t=<ts>,v0=hex(HMAC-SHA256(secret, "ts.body"))."""
    mac = hmac.new(v["secret"].encode(), f"{v['timestamp']}.{v['body']}".encode(),
                   hashlib.sha256).hexdigest()
    assert f"t={v['timestamp']},v0={mac}" == v["header"]


@pytest.mark.parametrize("v", KIE["vectors"])
def test_kie_vectors(v: dict[str, Any]) -> None:
    assert kie_sign(v["key"], v["task_id"], v["timestamp"]) == v["signature"]
    headers = {"X-Webhook-Timestamp": str(v["timestamp"]), "X-Webhook-Signature": v["signature"]}
    verify_kie(v["key"], v["task_id"], headers, now=v["timestamp"])
    with pytest.raises(SignatureError):
        verify_kie(v["key"], v["task_id"] + "x", headers, now=v["timestamp"])


@pytest.mark.parametrize("v", ELEVENLABS["vectors"])
def test_elevenlabs_vectors(v: dict[str, Any]) -> None:
    body = v["body"].encode()
    assert elevenlabs_sign(v["secret"], v["timestamp"], body) == v["header"]
    verify_elevenlabs(v["secret"], v["header"], body, now=v["timestamp"])
    with pytest.raises(SignatureError):
        verify_elevenlabs(v["secret"], v["header"], body + b" ", now=v["timestamp"])


@pytest.mark.parametrize("provider", ["replicate", "kie", "elevenlabs"])
def test_every_vector_file_names_its_source(provider: str) -> None:
    data = vectors(provider)
    assert data["source"].strip()
    assert data["evidence"] == ("C" if provider == "replicate" else "D")
    assert data["vectors"]
