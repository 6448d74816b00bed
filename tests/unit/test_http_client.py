"""wavepipe's HTTP requests through one client (``wavepipe.http_client``), against a server on
loopback: what each answer and each failure becomes."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from wavepipe import http_client


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []

    def log_message(self, *args):  # quiet
        pass

    def _answer(self, status: int, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/jobs":
            self._answer(200, b'[{"jobId": 1}]')
        elif self.path == "/moved":
            self._answer(302, b"", {"Location": "/jobs"})
        elif self.path == "/half":
            self._answer(200, b'[{"jobId": 1')
        elif self.path == "/slow":
            time.sleep(2)
            self._answer(200, b"[]")
        else:
            self._answer(503, b"starting")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Handler.seen.append(
            {"type": self.headers["Content-Type"], "auth": self.headers["Authorization"], "body": json.loads(body)}
        )
        self._answer(409, b'{"detail": "already a running backfill"}')


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_get_json_returns_the_answer_and_follows_redirects(server):
    assert http_client.get_json(f"{server}/jobs", timeout_s=5) == [{"jobId": 1}]
    assert http_client.get_json(f"{server}/moved", timeout_s=5) == [{"jobId": 1}]


def test_what_get_json_raises_when_the_server_cannot_answer_now_is_failed_in_one_line(server):
    with pytest.raises(httpx.HTTPStatusError) as error_page:
        http_client.get_json(f"{server}/ui-starting", timeout_s=5)
    assert str(error_page.value) == f"{server}/ui-starting answered 503 Service Unavailable"
    with pytest.raises(ValueError) as half:
        http_client.get_json(f"{server}/half", timeout_s=5)
    with pytest.raises(httpx.ConnectError) as refused:
        http_client.get_json(f"http://127.0.0.1:{_closed_port()}/", timeout_s=5)
    began = time.monotonic()
    with pytest.raises(httpx.ReadTimeout) as late:
        http_client.get_json(f"{server}/slow", timeout_s=0.3)
    assert time.monotonic() - began < 1.5, "the timeout is the request's, not the server's"
    for raised in (error_page, half, refused, late):
        assert isinstance(raised.value, http_client.FAILED)
    assert not isinstance(KeyError("jobTags"), http_client.FAILED), "a bug is not a server's failure"


def test_a_rest_call_sends_json_and_a_token_and_returns_any_status(server):
    from wavepipe.local.airflow import _http_json

    _Handler.seen.clear()
    status, answer = _http_json(f"{server}/backfills", method="POST", body={"dag_id": "d"}, token="jwt")
    assert (status, answer) == (409, {"detail": "already a running backfill"})
    assert _Handler.seen == [{"type": "application/json", "auth": "Bearer jwt", "body": {"dag_id": "d"}}]
    assert _http_json(f"{server}/ui-starting") == (503, "starting"), "an answer that is not JSON: its text"


def test_airflow_health_is_none_while_nothing_answers(monkeypatch):
    from wavepipe.local import airflow

    port = _closed_port()
    monkeypatch.setattr(airflow, "airflow_url", lambda settings: f"http://127.0.0.1:{port}")
    assert airflow.health(None) is None
