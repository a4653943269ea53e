"""Credential shapes an error text may carry (``$S`` stands for the secret): the redaction
must drop the secret from every one, in Python (tests/unit/test_redact.py) and in the host
API's SQL (tests/integration/test_host_api.py)."""

from __future__ import annotations

__all__ = ["LEAKS", "S"]

S = "SECRETVALUE123456"
LEAKS = {  # the shapes the review of issue 24.10 found still leaking, and their kin
    "json bearer": '{"Authorization": "Bearer $S"}',
    "headers repr": "<CIMultiDictProxy('Xi-Api-Key': '$S', 'Host': 'api')>",
    "dsn url": "postgresql://app:$S@db.internal:5432/prod",
    "dsn keyword quoted": "host=db password='$S x' dbname=prod",
    "url without scheme": "GET api.example.com/v1/models?key=$S failed",
    "json-escaped url": '{"url": "https:\\/\\/h\\/p?key=$S"}',
    "percent-encoded url": "redirect=https%3A%2F%2Fh%2Fp%3Ftoken%3D$S",
    "presigned s3 path-style": "b.s3.amazonaws.com/k?X-Amz-Signature=$S",
    "private key": "private_key=$S",
    "pwd and pass": "login failed pwd=$S pass=$S",
    "cookie": "headers: {'Cookie': 'session=$S'}",
    "set-cookie": "Set-Cookie: sid=$S; HttpOnly",
    "lowercase token scheme": "authorization: token r8_$S",
    "bare anthropic key": "invalid x api key sk-ant-api03-$S",
    "key in a sentence": "401: key $S is not valid",
    "api key with a space": "api key: $S",
    "digest": 'Authorization: Digest username="u", response="$S"',
    "signature header": "webhook-signature: v1,$S",
    # the review of the host API (issue 38): Python's \s and unquote, not PostgreSQL's
    "percent-escaped em space": "Bearer%E2%80%83$S",
    "percent-escaped no-break space": "password%C2%A0= $S",
    "no-break space": "password\u00a0= $S",
}
