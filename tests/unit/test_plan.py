import pytest

from wavepipe.contracts.config import load_settings
from wavepipe.contracts.plan import ActiveRunError, OffsetRange, RunPlan, run_request, safe_run_id
from wavepipe.run_store import RunStore


def test_plan_round_trips_through_its_file(tmp_path):
    store = RunStore(load_settings(home=tmp_path))
    plan = RunPlan(
        "r1",
        "t",
        "g",
        "2026-11-22T00:00:00Z",
        (OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 0, 0)),
        previous={0: [5, 5]},
        caps={"records_per_partition": 4},
    )
    store.save_plan(plan)
    assert store.load_plan("r1") == plan
    assert store.load_plan("other") is None


def test_new_data_means_a_range_differs_from_the_previous_run():
    ranges = (OffsetRange("t", 0, 5, 9),)
    assert not RunPlan("r", "t", "g", "", ranges, previous={0: [5, 9]}).has_new_data  # pending re-read only
    assert RunPlan("r", "t", "g", "", ranges, previous={0: [5, 8]}).has_new_data  # new records
    assert RunPlan("r", "t", "g", "", ranges, previous={0: [7, 9]}).has_new_data  # rewound
    assert not RunPlan("r", "t", "g", "", (OffsetRange("t", 0, 9, 9),)).has_new_data  # empty


def test_one_active_run_per_group(tmp_path):
    store = RunStore(load_settings(home=tmp_path))
    store.claim_group("g", "a")
    store.claim_group("g", "a")  # the same run again: a retry
    store.claim_group("h", "b")  # another group is independent
    with pytest.raises(ActiveRunError, match="run a of group 'g'"):
        store.claim_group("g", "b")
    store.release_group("g", "b")  # not the holder: no effect
    assert store.active_run("g") == "a"
    store.release_group("g", "a")
    store.claim_group("g", "b")
    assert store.active_run("g") == "b"


def test_airflow_run_ids_become_folder_names():
    assert safe_run_id("manual__2026-11-22T07:13:54.306853+00:00") == "manual__2026-11-22T07_13_54.306853_00_00"
    with pytest.raises(ValueError):
        safe_run_id("///")


def test_replace_predicate_selects_the_window_keeps_its_edges_and_quotes_ids():
    from wavepipe.spark_apps.tables import replace_predicate, sql_string, window_predicate

    inside = window_predicate("wf.1", {1: (5, 9), 0: (0, 3)}, "first_offset")
    assert inside == (
        "(topic = 'wf.1' AND ((`partition` = 0 AND `first_offset` >= 0 AND `first_offset` < 3) OR "
        "(`partition` = 1 AND `first_offset` >= 5 AND `first_offset` < 9)))"
    )
    assert window_predicate("t", {}, "offset") == "false"
    assert sql_string("it's a \\ path") == "'it\\'s a \\\\ path'"
    where = replace_predicate("t", {0: (0, 3)}, "first_offset", keep=["b"], extra=["x'y"])
    assert where == (
        f"(({window_predicate('t', {0: (0, 3)}, 'first_offset')} AND waveform_id NOT IN ('b')) "
        "OR waveform_id IN ('x\\'y'))"
    )
    assert replace_predicate("t", {0: (0, 3)}, "offset") == window_predicate("t", {0: (0, 3)}, "offset")


def test_partition_groups_balance_offsets_over_at_most_n_consume_tasks():
    from wavepipe.pipeline import partition_groups

    ranges = tuple(OffsetRange("t", p, 0, size) for p, size in enumerate([100, 10, 40, 0, 60, 50]))
    plan = RunPlan("r", "t", "g", "", ranges)
    assert partition_groups(plan, 0) == [[0], [1], [2], [4], [5]]  # one task per partition with data
    assert partition_groups(plan, 9) == [[0], [1], [2], [4], [5]]  # more tasks than partitions
    assert partition_groups(plan, 1) == [[0, 1, 2, 4, 5]]
    groups = partition_groups(plan, 2)
    assert sorted(p for g in groups for p in g) == [0, 1, 2, 4, 5]  # each partition read once
    assert groups == [[0, 2], [1, 4, 5]]  # largest range first to the lighter task: 100 + 40 vs 60 + 50 + 10
    assert partition_groups(RunPlan("r", "t", "g", "", (OffsetRange("t", 0, 5, 5),)), 2) == []  # nothing new


def test_a_consume_task_label_stays_within_airflows_250_characters():
    from wavepipe.pipeline import partition_ranges

    assert partition_ranges([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert partition_ranges([5]) == "5"
    gappy = partition_ranges(list(range(0, 2000, 2)))
    assert len(gappy) <= 200 and gappy.endswith("... (1000 partitions)") and gappy.startswith("0,2,4,")


def test_a_mistyped_run_option_is_refused_before_anything_is_planned(tmp_path):
    from wavepipe.pipeline import plan_step, run_once

    settings = load_settings(home=tmp_path / "home", bootstrap_servers="127.0.0.1:1")
    assert run_request({"topic": "t", "max_records": 5}) == {"topic": "t", "max_records": 5}
    with pytest.raises(TypeError, match=r"unknown run option\(s\) \['max_record'\]"):
        run_once(settings, max_record=5)
    with pytest.raises(TypeError, match=r"\['windows'\]"):
        plan_step(settings, "r1", windows=None)
    assert not (tmp_path / "home" / "runs").exists() and not (tmp_path / "home" / "groups").exists()


def test_a_dag_run_airflow_reuses_for_a_window_works_under_a_new_run_id_and_keeps_the_old_one(tmp_path):
    """A backfill's "All Runs" or "Missing and Errored Runs" clears an existing DAG run and runs it
    again as a window run: the earlier run's plan and report stay as they were."""
    from datetime import UTC, datetime, timedelta

    from wavepipe.contracts.runfiles import Step
    from wavepipe.pipeline import current_run_id, window_run_id

    settings = load_settings(home=tmp_path)
    store = RunStore(settings)
    start = datetime(2026, 11, 25, 10, 45, tzinfo=UTC)
    window, other = (start, start + timedelta(minutes=15)), (start, start + timedelta(minutes=30))
    run = "scheduled__2026-11-25T10_45_00_00_00"

    def plan(run_id, w=None):
        store.save_plan(
            RunPlan.new(
                run_id,
                "t",
                "g",
                [OffsetRange("t", 0, 0, 5)],
                window=w and {"start": w[0].isoformat(), "end": w[1].isoformat()},
            )
        )

    def finish(run_id):
        store.save_step(run_id, Step.REPORT, {"commit": {}})

    assert window_run_id(settings, run, window) == run  # never planned: its own id
    plan(run)  # it ran as an incremental run, and finished
    finish(run)
    assert window_run_id(settings, run, window) == f"{run}.reprocess-1"
    plan(f"{run}.reprocess-1", window)
    assert current_run_id(settings, run) == f"{run}.reprocess-1"  # the later steps of the DAG run
    assert window_run_id(settings, run, window) == f"{run}.reprocess-1"  # a retry of the unfinished window run
    assert window_run_id(settings, run, other) == f"{run}.reprocess-2"  # another window
    finish(f"{run}.reprocess-1")
    assert window_run_id(settings, run, window) == f"{run}.reprocess-2"  # reprocessed again after it finished
    assert store.load_plan(run).window is None and store.load_step(run, Step.REPORT) == {"commit": {}}


def test_planned_ranges_skip_what_the_topic_lost_and_grow_past_a_capped_waveform():
    from wavepipe.consumers.planner import planned_ranges

    starts, earliest, stable = {1: 40, 0: 5}, {0: 10, 1: 0}, {0: 100, 1: 200}
    ranges, lost = planned_ranges("t", starts, earliest, stable, cap=0, previous={})
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 10, 100), (1, 40, 200)]
    assert lost == {0: [5, 10]}
    # capped: 50 records new to this run; partition 1's last run also started at 40 and read to
    # 90 (a waveform longer than the cap is pending there), so this one reads 50 past that
    ranges, _ = planned_ranges("t", starts, earliest, stable, cap=50, previous={1: [40, 90], 0: [0, 10]})
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 10, 60), (1, 40, 140)]
    ranges, _ = planned_ranges("t", {0: 100}, {0: 0}, {0: 80}, cap=0, previous={})
    assert [(r.start, r.end) for r in ranges] == [(100, 100)], "an end never precedes its start"
