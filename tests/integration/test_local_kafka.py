"""The local broker manager: real start, idempotent up/down, clear errors."""

from __future__ import annotations

import socket

import pytest

from wavepipe.contracts.config import load_settings
from wavepipe.local.jars import SetupError
from wavepipe.local.kafka import LocalKafka, free_port

pytestmark = pytest.mark.integration


def test_up_is_idempotent_and_down_stops(tmp_path):
    broker = LocalKafka(tmp_path / "k", "127.0.0.1", free_port(), load_settings().jars_dir)
    try:
        assert "started" in broker.up()
        pid = broker.pid()
        assert pid and "already running" in broker.up() and broker.pid() == pid
        assert (tmp_path / "k" / "data" / "meta.properties").exists()
        listening = _listening(pid)
        assert {port for _, port in listening} >= {broker.port}, listening
        assert all(_loopback(address) for address, _ in listening), listening  # client and controller listeners
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


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of ``pid`` and its children."""
    import psutil

    pids = {pid} | {child.pid for child in psutil.Process(pid).children(recursive=True)}
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    }


def _loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (IPv4-mapped ``::ffff:127.0.0.1`` included)."""
    import ipaddress

    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback
