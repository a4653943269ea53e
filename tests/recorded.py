"""Recorded provider shapes: ``tests/fixtures/providers/<provider>/<name>.json``.

Each fixture is one response or callback body in the shape the live API sends, written
from an official SDK file, an official doc page or a public recording, with a header
naming that source (``source``), its evidence (``C`` official doc/SDK, ``O`` recorded live,
``3P`` third party) and notes. ``signature_vectors.json`` holds each provider's webhook
signature vectors. :func:`load` reads one fixture; :func:`raw` turns it into the
:class:`~callwarden.providers.raw.RawResponse` a parser takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from callwarden.providers.raw import RawResponse

__all__ = ["FIXTURES", "Recorded", "all_fixtures", "load", "vectors"]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "providers"
EVIDENCE = frozenset({"C", "O", "3P"})


@dataclass(frozen=True)
class Recorded:
    provider: str
    name: str
    source: str
    evidence: str
    notes: str
    kind: str
    family: str | None
    http: dict[str, Any]
    body: Any
    body_text: str | None

    @property
    def status(self) -> int:
        return int(self.http.get("status") or 200)

    @property
    def headers(self) -> dict[str, str]:
        return {str(k).lower(): str(v) for k, v in (self.http.get("headers") or {}).items()}

    def body_bytes(self) -> bytes:
        if self.body_text is not None:
            return self.body_text.encode()
        return msgspec.json.encode(self.body)

    def raw(self) -> RawResponse:
        return RawResponse(status=self.status, headers=self.headers, body=self.body_bytes())


def _read(path: Path) -> Recorded:
    doc = msgspec.json.decode(path.read_bytes())
    return Recorded(
        provider=path.parent.name, name=path.stem, source=doc["source"],
        evidence=doc["evidence"], notes=doc.get("notes", ""), kind=doc.get("kind", ""),
        family=doc.get("family"), http=doc.get("http") or {}, body=doc.get("body"),
        body_text=doc.get("body_text"))


def load(provider: str, name: str) -> Recorded:
    return _read(FIXTURES / provider / f"{name}.json")


def all_fixtures(provider: str | None = None) -> list[Recorded]:
    """Every shape fixture (signature vectors excluded), optionally of one provider."""
    folders = [FIXTURES / provider] if provider else sorted(FIXTURES.iterdir())
    return [_read(p) for folder in folders for p in sorted(folder.glob("*.json"))
            if p.name != "signature_vectors.json"]


def vectors(provider: str) -> dict[str, Any]:
    """``signature_vectors.json`` of ``provider`` (``source``, ``evidence``, ``vectors``)."""
    data: dict[str, Any] = msgspec.json.decode(
        (FIXTURES / provider / "signature_vectors.json").read_bytes())
    return data
