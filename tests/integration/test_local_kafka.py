"""The local broker manager: real start, idempotent up/down, clear errors."""

from __future__ import annotations

import socket

import pytest

from wavepipe.contracts.config import load_settings
from wavepipe.jars import SetupError
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


def test_two_starts_at_once_start_one_broker_and_both_succeed(tmp_path):
    """Two `wavepipe kafka up` (two `make demo`) of one home at the same moment: the second waits
    for the first's start (a lock on the broker's folder) and finds it running; nothing is
    formatted twice."""
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    brokers = [LocalKafka(tmp_path / "k", "127.0.0.1", port, load_settings().jars_dir) for _ in range(2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            said = list(pool.map(lambda broker: broker.up(), brokers))
        assert sorted("already running" in line for line in said) == [False, True], said
        assert any(
            line.endswith(f"started (pid {brokers[0].pid()}, data in {brokers[0].data_dir})") for line in said
        ), said
        assert brokers[0].pid() == brokers[1].pid() is not None
    finally:
        brokers[0].down()


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
