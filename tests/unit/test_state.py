"""The run state's local folder and the rules of a lease (``wavepipe.state``); the object store's
side is tested against a real store in tests/integration/test_object_store.py."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import subprocess
import sys
import time

import pytest
import tenacity

from wavepipe.state import LocalState, ObjectState, StepBusyError, lease_verdict, lock_retrying, open_state


def test_a_create_is_refused_when_the_key_exists_and_leaves_no_temporary_file(tmp_path):
    state = LocalState(tmp_path)
    assert state.create("groups/g/active.json", b"first")
    assert not state.create("groups/g/active.json", b"second")
    assert state.read("groups/g/active.json") == b"first"
    assert sorted(p.name for p in (tmp_path / "groups" / "g").iterdir()) == ["active.json"]
    state.delete("groups/g/active.json")
    state.delete("groups/g/active.json")  # gone already: nothing to do
    assert state.read("groups/g/active.json") is None and not state.exists("groups/g/active.json")


def test_an_append_keeps_the_last_lines_and_a_listing_names_files_only(tmp_path):
    state = LocalState(tmp_path)
    for i in range(200):
        state.append("groups/g/failed.jsonl", f'{{"i": {i}, "reason": "{"x" * 20}"}}', keep=5)
    lines = state.read("groups/g/failed.jsonl").decode().splitlines()
    assert len(lines) < 200 and lines[-1].startswith('{"i": 199')
    (tmp_path / "groups" / "g" / "sub").mkdir()
    assert [key for key, _ in state.listing("groups/g")] == ["groups/g/failed.jsonl"]
    assert state.listing("nothing/here") == []
    files, folders = state.entries("groups/g")  # both from one look
    assert [key for key, _ in files] == ["groups/g/failed.jsonl"] and list(folders) == ["sub"]
    assert folders == state.folders("groups/g") and files == state.listing("groups/g")
    assert state.entries("nothing/here") == ([], {})


def test_a_lock_is_refused_to_another_process_and_free_once_its_holder_exits(tmp_path):
    state = LocalState(tmp_path)
    hold = (
        f"import time; from wavepipe.state import LocalState; lock = LocalState({str(tmp_path)!r}).lock('runs/r/.l', "
        "'r'); lock.__enter__(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StepBusyError, match=rf"pid {holder.pid}"), state.lock("runs/r/.l", "step r"):
            pass
    finally:
        holder.kill()
        holder.wait()
    with state.lock("runs/r/.l", "step r"), state.lock("runs/r/.l", "step r"):  # again inside: no wait on itself
        pass


class _Clock:
    """``time.monotonic`` that only ``sleep`` moves on."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_a_lock_held_elsewhere_is_tried_each_second_until_wait_s_then_refused_naming_its_holder(monkeypatch, caplog):
    clock, tries = _Clock(), []
    monkeypatch.setattr(time, "monotonic", lambda: clock.now)

    def take():
        tries.append(clock.now)
        return "pid 7 on h"

    taking = lock_retrying(
        "step r", 3.0, tenacity.retry_if_result(lambda holder: holder is not None), lambda s: s.outcome.result()
    ).copy(sleep=clock.sleep)
    busy = r"step r is running in another process right now \(pid 7 on h\).* Waited 3s\. Wait for it"
    with caplog.at_level(logging.INFO, "wavepipe.state"), pytest.raises(StepBusyError, match=busy):
        taking(take)
    assert clock.slept == [1.0, 1.0, 1.0] and len(tries) == 4
    assert [r.getMessage() for r in caplog.records] == ["waiting for step r (pid 7 on h) to finish"]

    tries.clear()
    with pytest.raises(StepBusyError, match=r"\(pid 7 on h\); two of them must not overlap\. Wait for it"):
        lock_retrying("step r", 0.0, tenacity.retry_if_result(bool), lambda s: s.outcome.result())(take)
    assert len(tries) == 1, "no wait: refused at the first try"


def test_a_lock_taken_once_its_holder_lets_go_and_a_failing_store_is_not_tried_again(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", lambda: clock.now)
    answers = iter(["pid 7 on h", None])
    taking = lock_retrying(
        "step r", 60.0, tenacity.retry_if_result(lambda holder: holder is not None), lambda s: s.outcome.result()
    )
    assert taking.copy(sleep=clock.sleep)(lambda: next(answers)) is None and clock.slept == [1.0]

    def store_down():
        raise OSError("the store did not answer")

    with pytest.raises(OSError, match="did not answer"):
        taking.copy(sleep=clock.sleep)(store_down)
    assert clock.slept == [1.0]


def test_a_local_lock_waits_for_its_holder_and_says_who_holds_it(tmp_path, monkeypatch):
    state = LocalState(tmp_path)
    path = tmp_path / "runs" / "r" / ".l"
    path.parent.mkdir(parents=True)
    path.write_text("4242")
    other = os.open(path, os.O_RDWR)  # another open file: flock refuses this process's too
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    sleeps = []

    def sleep(seconds):  # the holder lets go during the second pause
        sleeps.append(seconds)
        if len(sleeps) == 2:
            os.close(other)

    monkeypatch.setattr(time, "sleep", sleep)
    try:
        with pytest.raises(StepBusyError, match="pid 4242"), state.lock("runs/r/.l", "step r"):
            pass
        with state.lock("runs/r/.l", "step r", wait_s=60):
            assert path.read_text() == str(os.getpid())
    finally:
        if len(sleeps) < 2:
            os.close(other)
    assert sleeps == [1.0, 1.0]


class _RacedStore:
    """A store where ``first`` other writers replace the object between each read and write."""

    def __init__(self, first: int):
        self.text, self.etag, self.first, self.puts = b"", "v0", first, 0

    def get_tagged(self, key):
        return (self.text, self.etag) if self.text else None

    def put_if(self, key, data, etag=None):
        self.puts += 1
        if self.first:
            self.first -= 1
            self.text, self.etag = self.text + b"theirs\n", f"v{self.puts}x"
            return None
        self.text, self.etag = data, f"v{self.puts}"
        return self.etag


def _object_state(store) -> ObjectState:
    state = ObjectState.__new__(ObjectState)
    state.uri, state.lease_s, state._store = "s3://b/state", 30.0, store
    return state


def test_an_object_store_append_is_tried_again_while_other_writers_are_first_then_logged(caplog):
    store = _RacedStore(first=3)
    _object_state(store).append("groups/g/failed.jsonl", "mine", keep=10)
    assert store.text == b"theirs\ntheirs\ntheirs\nmine\n" and store.puts == 4

    store = _RacedStore(first=ObjectState.APPEND_TRIES)
    with caplog.at_level(logging.WARNING, "wavepipe.state"):
        _object_state(store).append("groups/g/failed.jsonl", "mine", keep=10)
    assert b"mine" not in store.text and store.puts == ObjectState.APPEND_TRIES
    assert [r.getMessage() for r in caplog.records] == [
        "could not add to groups/g/failed.jsonl: 8 other writers were first; the line was: mine"
    ]


def test_a_lease_is_held_until_its_term_unless_its_holder_on_this_host_is_gone():
    now = time.time()
    here = socket.gethostname()
    assert lease_verdict({"expires_at": now + 10, "host": here, "pid": os.getpid()}, now) == "held"
    assert lease_verdict({"expires_at": now - 1, "host": here, "pid": os.getpid()}, now) == "expired"
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(gone.stdout)
    assert lease_verdict({"expires_at": now + 10, "host": here, "pid": dead_pid}, now) == "orphaned"
    assert lease_verdict({"expires_at": now + 10, "host": "elsewhere", "pid": dead_pid}, now) == "held", (
        "another host's process is never taken for gone"
    )
    assert lease_verdict({"host": here}, now) == "expired", "a lease without a term (not one of ours) is void"


def test_the_state_is_the_home_unless_state_uri_names_another_place(tmp_path):
    from wavepipe.contracts.config import load_settings

    assert open_state(load_settings(home=tmp_path)).where("runs") == str(tmp_path / "runs")
    assert open_state(load_settings(home=tmp_path, state_uri=str(tmp_path / "shared"))).where("runs") == str(
        tmp_path / "shared" / "runs"
    )
    with pytest.raises(ValueError, match="state_uri"):
        load_settings(home=tmp_path, state_uri="relative/folder")
    with pytest.raises(ValueError, match="state_lease_s"):
        load_settings(home=tmp_path, state_lease_s=1)


def test_the_reports_in_the_state_are_listed_oldest_first_and_what_is_not_one_is_skipped(tmp_path):
    import json

    from wavepipe.contracts.config import load_settings
    from wavepipe.run_store import RunStore

    store = RunStore(load_settings(home=tmp_path))
    folder = store.settings.reports_dir
    folder.mkdir()
    for i, text in enumerate(
        [json.dumps({"run_id": "b"}), "[1, 2]", "{not json", json.dumps({"run_id": "a"}), json.dumps({"x": 1})]
    ):
        path = folder / f"{i}.json"
        path.write_text(text)
        os.utime(path, (1000 + i, 1000 + i))
    (folder / "validation_history.jsonl").write_text("{}\n")
    assert [r["run_id"] for r in store.reports()] == ["b", "a"]


def test_a_groups_last_committed_run_outlives_its_pruned_report(tmp_path):
    """``wavepipe status`` reads a group's last committed run from the group's state, per topic:
    the reports themselves go with their pages once newer runs fill the state."""
    from wavepipe import pages
    from wavepipe.contracts.config import load_settings
    from wavepipe.run_store import RunStore

    store = RunStore(load_settings(home=tmp_path / "worker", state_uri=str(tmp_path / "state")))
    committed = {"run_id": "r1", "group": "g", "topic": "t", "commit": {"0": {"after": 5}}}
    store.save_report(committed)
    store.save_report({"run_id": "r2", "group": "g", "topic": "t", "commit": {}})  # a window run: no offsets
    store.save_report({"run_id": "r3", "group": "g", "topic": "other", "commit": {"0": {"after": 1}}})
    for i, run_id in enumerate(("r1", "r2", "r3")):  # saved in this order
        os.utime(tmp_path / "state" / "reports" / f"{run_id}.json", (1000 + i, 1000 + i))
    assert pages.prune(store.state, kept=1) == ["r2", "r1"]
    assert [r["run_id"] for r in store.reports()] == ["r3"]
    assert store.last_committed("g", "t") == committed and store.last_committed("g", "other")["run_id"] == "r3"
    assert store.last_committed("g", "nothing-yet") is None and store.last_committed("h", "t") is None


def test_the_state_keeps_the_newest_runs_and_any_that_still_holds_its_group(tmp_path):
    from tests.helpers import assert_prune_keeps_the_newest_runs_and_the_one_holding_its_group
    from wavepipe.contracts.config import load_settings
    from wavepipe.run_store import RunStore

    assert_prune_keeps_the_newest_runs_and_the_one_holding_its_group(RunStore(load_settings(home=tmp_path)))
