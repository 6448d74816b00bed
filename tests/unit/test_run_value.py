"""``run_store.Run``: a run as one value in a process. Its plan is read once, each step record at
most once until another process may have written it (``forget``), and what it writes it keeps;
``state_io`` counts the reads and writes of the run's state this process made."""

from __future__ import annotations

from wavepipe.contracts.config import load_settings
from wavepipe.contracts.plan import OffsetRange, RunPlan
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import ReadStats
from wavepipe.run_store import Run, RunStore

PLAN = RunPlan("value-1", "t", "g", "now", (OffsetRange("t", 0, 10, 20),))
READ = Step.consume(PLAN.ranges[0])


def _stored(tmp_path, run_id: str = "value-1") -> RunStore:
    store = RunStore(load_settings(home=tmp_path))
    store.save_plan(RunPlan(run_id, "t", "g", "now", PLAN.ranges))
    store.save_result(run_id, READ, ReadStats("t", 0, 10, 20, records=10))
    return store


def test_a_loaded_run_reads_its_plan_once_and_each_record_once(tmp_path):
    store = _stored(tmp_path)
    state_io = store.state_io
    before = state_io("value-1")
    run = Run.load(store.settings, "value-1")
    assert run is not None and run.plan.ranges == PLAN.ranges
    assert run.result(READ, ReadStats).records == 10
    assert run.result(READ, ReadStats).records == 10  # kept: not read again
    assert run.raw(Step.TIMINGS) is None and run.raw(Step.TIMINGS) is None  # a missing record is kept too
    after = state_io("value-1")
    assert after["plan_reads"] - before["plan_reads"] == 1
    assert after["reads"] - before["reads"] == 3  # the plan, the consume record, the missing timings


def test_what_a_run_records_it_keeps_and_a_forgotten_record_is_read_again(tmp_path):
    store = _stored(tmp_path, "value-2")
    state_io = store.state_io
    run = Run.load(store.settings, "value-2")
    run.record(Step.TIMINGS, {"plan": 0.5})
    reads = state_io("value-2")["reads"]
    assert run.raw(Step.TIMINGS) == {"plan": 0.5} and state_io("value-2")["reads"] == reads
    store.save_step("value-2", Step.TIMINGS, {"plan": 0.7})  # another process's write
    assert run.raw(Step.TIMINGS) == {"plan": 0.5}, "kept until forgotten"
    run.forget(Step.TIMINGS)
    assert run.raw(Step.TIMINGS) == {"plan": 0.7} and state_io("value-2")["reads"] == reads + 1
    run.clear(READ)
    assert run.result(READ, ReadStats) is None and store.load_result("value-2", READ, ReadStats) is None


def test_a_run_without_a_plan_is_none_and_a_new_plan_is_saved_and_kept(tmp_path):
    store = RunStore(load_settings(home=tmp_path))
    assert Run.load(store.settings, "none-such") is None
    run = Run(store, PLAN)
    run.replan(RunPlan("value-1", "t", "g", "now", PLAN.ranges, txn_version=3))
    assert run.plan.txn_version == 3 and store.load_plan("value-1").txn_version == 3
    assert store.state_io("value-1")["plan_writes"] == 1


def test_the_counts_are_kept_for_the_latest_runs_only(tmp_path, monkeypatch):
    import wavepipe.run_store as run_store

    monkeypatch.setattr(run_store, "COUNTED_RUNS", 2)
    store = RunStore(load_settings(home=tmp_path))
    for run_id in ("old", "mid", "new"):
        store.load_plan(run_id)
    assert store.state_io("old")["reads"] == 0 and store.state_io("new")["reads"] == 1


def test_runs_of_one_id_in_two_homes_are_counted_apart(tmp_path):
    one, other = (RunStore(load_settings(home=tmp_path / name)) for name in ("one", "other"))
    one.load_plan("same")
    assert one.state_io("same")["plan_reads"] == 1 and other.state_io("same")["plan_reads"] == 0
