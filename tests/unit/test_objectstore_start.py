"""The local object store's start: tried again with new internal ports when one was taken before
the store bound it, never for another failure (``LocalObjectStore.up``)."""

from __future__ import annotations

import pytest

from wavepipe.jars import SetupError
from wavepipe.local import objectstore
from wavepipe.local.objectstore import START_TRIES, LocalObjectStore, PortTakenError


class _Proc:
    pid = 4242


def _store(tmp_path, monkeypatch, logs: list[str]) -> tuple[LocalObjectStore, list[str]]:
    """A store whose starts write ``logs`` (one per start) to its log and fail while one is left."""
    store, done = LocalObjectStore(tmp_path, 18333, tmp_path / "tools"), []
    tmp_path.mkdir(exist_ok=True)
    monkeypatch.setattr(objectstore, "port_is_free", lambda host, port: True)
    monkeypatch.setattr(store, "pid", lambda: None)

    def start():
        done.append("start")
        with store.log_file.open("a") as fh:
            fh.write(logs.pop(0) if logs else "S3 API serving\n")
        return _Proc()

    def wait_ready(proc):
        if "serving" not in store._log_since(0).splitlines()[-1]:
            raise SetupError(f"the object store exited with code 1; see {store.log_file}")

    monkeypatch.setattr(store, "start", start)
    monkeypatch.setattr(store, "wait_ready", wait_ready)
    monkeypatch.setattr(store, "down", lambda: done.append("down"))
    return store, done


def test_a_start_whose_internal_port_was_taken_is_tried_again(tmp_path, monkeypatch):
    store, done = _store(tmp_path, monkeypatch, ["bind: address already in use\n"])
    assert "started (pid 4242" in store.up()
    assert done == ["start", "down", "start"]


def test_a_start_that_fails_otherwise_is_not_tried_again(tmp_path, monkeypatch):
    store, done = _store(tmp_path, monkeypatch, ["panic: no disk\n"])
    with pytest.raises(SetupError, match="exited with code 1") as raised:
        store.up()
    assert not isinstance(raised.value, PortTakenError) and done == ["start", "down"]


def test_the_last_start_whose_port_was_taken_is_raised(tmp_path, monkeypatch):
    store, done = _store(tmp_path, monkeypatch, ["address already in use\n"] * START_TRIES)
    with pytest.raises(SetupError, match="exited with code 1"):
        store.up()
    assert done == ["start", "down"] * START_TRIES
