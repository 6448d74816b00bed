"""wavepipe's own HTTP requests (the Spark UI's REST API, a Spark master's status page, Airflow's
REST API), all through one client: httpx.

Each request gets ``timeout_s`` for each of its steps (connecting, and each read of the answer),
as a socket timeout would, and follows redirects. A server that cannot answer now raises one of
``FAILED``, with a one-line message. Import this module where a request is made, not at a
module's top: httpx takes about 60 ms to import, which a CLI command that asks nothing should not pay.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

#: What a request raises when the server could not answer it now: no connection, a timeout, a cut
#: or malformed answer (``httpx.TransportError``), an error status from ``get_json``
#: (``httpx.HTTPStatusError``), an answer that is not whole JSON (``ValueError``).
FAILED: tuple[type[Exception], ...] = (httpx.HTTPError, ValueError)


def request(method: str, url: str, *, timeout_s: float, body: Any = None, token: str | None = None) -> httpx.Response:
    """One request: ``body`` (if not None) sent as JSON, ``token`` as a bearer token. Any status
    is returned; only a server that does not answer raises (``httpx.TransportError``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = None
    if body is not None:
        content, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    return httpx.request(method, url, content=content, headers=headers, timeout=timeout_s, follow_redirects=True)


def get_json(url: str, *, timeout_s: float) -> Any:
    """The JSON ``url`` answers; an error status raises ``httpx.HTTPStatusError`` that names it
    (``<url> answered 503 Service Unavailable``), an answer that is not JSON ``ValueError``."""
    response = request("GET", url, timeout_s=timeout_s)
    if response.is_error:
        raise httpx.HTTPStatusError(
            f"{url} answered {response.status_code} {response.reason_phrase}".rstrip(),
            request=response.request,
            response=response,
        )
    return response.json()
