"""The local broker manager: real start, idempotent up/down, clear errors."""

from __future__ import annotations

import socket

import pytest

from wavepipe.config import load_settings
from wavepipe.jars import SetupError
from wavepipe.localkafka import LocalKafka, free_port

pytestmark = pytest.mark.integration


def test_up_is_idempotent_and_down_stops(tmp_path):
    broker = LocalKafka(tmp_path / "k", "127.0.0.1", free_port(), load_settings().jars_dir)
    try:
        assert "started" in broker.up()
        pid = broker.pid()
        assert pid and "already running" in broker.up() and broker.pid() == pid
        assert (tmp_path / "k" / "data" / "meta.properties").exists()
    finally:
        assert "stopped" in broker.down()
    assert broker.pid() is None and "not running" in broker.status()
    assert "not running" in broker.down()


def test_port_taken_by_something_else_is_a_clear_error(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        broker = LocalKafka(tmp_path / "k", "127.0.0.1", port, load_settings().jars_dir)
        with pytest.raises(SetupError, match=f"port {port}"):
            broker.up()
