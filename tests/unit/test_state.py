"""The run state's local folder and the rules of a lease (``wavepipe.state``); the object store's
side is tested against a real store in tests/integration/test_object_store.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from wavepipe.state import LocalState, StepBusyError, lease_verdict, open_state


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
    from wavepipe.contracts.runfiles import RunStore

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
