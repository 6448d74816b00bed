"""A test's SASL/OAUTHBEARER token minter, named by dotted path (``tests.kafka_tokens.mint``) in
a Kafka client configuration: unsecured JWS tokens (``alg: none``, empty signature), which the
local broker's OAUTHBEARER listener accepts (Kafka's unsecured validator). Calls are counted in
``MINTED`` (per process) and appended to the file named by ``WAVEPIPE_TEST_TOKEN_LOG``, if set,
so a test sees which processes minted tokens."""

from __future__ import annotations

import base64
import json
import os
import time

PRINCIPAL = "wavepipe-oauth"
LIFETIME_S = 3600
MINTED = 0


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def mint(oauthbearer_config: str) -> tuple[str, float]:
    """confluent-kafka's ``oauth_cb``: (token, expiry in seconds since the epoch)."""
    global MINTED
    MINTED += 1
    now = int(time.time())
    token = f"{_b64({'alg': 'none'})}.{_b64({'sub': PRINCIPAL, 'iat': now, 'exp': now + LIFETIME_S})}."
    log = os.environ.get("WAVEPIPE_TEST_TOKEN_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    return token, float(now + LIFETIME_S)


#: Not a function: a dotted path naming it is refused.
NOT_CALLABLE = "a constant, not a function"

#: What ``note_error`` heard (an ``error_cb`` named by dotted path, composed with wavepipe's own).
ERRORS: list = []


def note_error(err) -> None:
    ERRORS.append(err)
