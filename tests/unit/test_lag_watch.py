"""When the lag watcher fires (pure logic: ``wavepipe.consumers.lag``), and what the DAG factory
builds for an event-driven DAG. The watcher against a real broker, scheduler and triggerer is in
tests/integration/test_watcher.py."""

from __future__ import annotations

import pytest

from wavepipe.consumers.lag import Lag, Thresholds, Watch

NOW_S = 1_800_000_000.0


def lag(start, end, committed=None, oldest=None) -> Lag:
    start, end = dict(enumerate(start)), dict(enumerate(end))
    return Lag(committed if committed is not None else dict(start), start, end, oldest or {})


def test_each_threshold_fires_on_its_own_and_zero_turns_it_off():
    backlog = lag([10, 0], [15, 3], oldest={0: (int((NOW_S - 9) * 1000), 100), 1: (int((NOW_S - 2) * 1000), 50)})
    assert backlog.records == 8 and backlog.bytes_estimate == 5 * 100 + 3 * 50
    assert backlog.oldest_age_s(int(NOW_S * 1000)) == pytest.approx(9.0)
    now_ms = int(NOW_S * 1000)
    assert backlog.reasons(Thresholds(records=8), now_ms) == ["lag 8 records >= 8"]
    assert backlog.reasons(Thresholds(records=9), now_ms) == []
    assert backlog.reasons(Thresholds(bytes=650), now_ms) == ["lag ~650 bytes >= 650"]
    assert backlog.reasons(Thresholds(bytes=651), now_ms) == []
    assert backlog.reasons(Thresholds(max_delay_s=9), now_ms) == ["oldest uncommitted record 9.0 s old >= 9 s"]
    assert backlog.reasons(Thresholds(max_delay_s=10), now_ms) == []
    assert backlog.reasons(Thresholds(), now_ms) == [] and not Thresholds().on
    # nothing to read never fires, whatever the thresholds
    assert lag([5], [5]).reasons(Thresholds(records=1, bytes=1, max_delay_s=0.001), now_ms) == []
    # a threshold that needs the oldest record does not fire without it (it could not be read)
    assert lag([0], [4]).reasons(Thresholds(bytes=1, max_delay_s=1), now_ms) == []
    # a record without a timestamp has no age
    assert lag([0], [4], oldest={0: (-1, 10)}).oldest_age_s(now_ms) is None


def test_a_backlog_fires_once_then_again_only_for_new_data_or_after_refire():
    watch = Watch(Thresholds(records=1), refire_s=300)
    assert watch.decide(lag([0, 0], [4, 0]), NOW_S) == ["lag 4 records >= 1"]
    # polled again while the run it started is in flight: the same backlog, no event
    assert watch.decide(lag([0, 0], [4, 0]), NOW_S + 1) == []
    # new data during the run: one event (Airflow queues one follow-up run for any number)
    assert watch.decide(lag([0, 0], [4, 2]), NOW_S + 2)
    assert watch.decide(lag([0, 0], [4, 2]), NOW_S + 3) == []
    # the run committed everything: nothing left, nothing fired
    assert watch.decide(lag([4, 2], [4, 2]), NOW_S + 4) == []
    # a run committed part of it (a waveform missing chunks holds the commit back): no new data,
    # so the same backlog waits for refire_s (a capped run asks for its follow-up itself)
    assert watch.decide(lag([3, 2], [4, 2]), NOW_S + 5) == []
    assert watch.decide(lag([3, 2], [4, 2]), NOW_S + 2 + 299) == []
    assert watch.decide(lag([3, 2], [4, 2]), NOW_S + 2 + 300)
    # and new data after that fires at once
    assert watch.decide(lag([3, 2], [5, 2]), NOW_S + 2 + 301)


def test_a_group_without_offsets_fires_only_when_it_has_a_start():
    new = lag([0], [7], committed={0: None})
    assert new.new_group
    assert Watch(Thresholds(records=1)).decide(new, NOW_S) == []  # its run would be refused
    watch = Watch(Thresholds(records=1), new_group_start="earliest")
    assert watch.decide(new, NOW_S) == ["the group has no offsets on the topic yet; a run starts it at earliest"]
    assert watch.decide(new, NOW_S + 1) == []


def test_the_factory_adds_a_lag_watcher_beside_the_schedule_when_a_threshold_is_set(monkeypatch):
    from airflow.sdk import AssetOrTimeSchedule

    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag
    from wavepipe.plugins.triggers import GroupLagTrigger

    plain = wavepipe_ingest_dag(dag_id="plain")
    assert plain.timetable.asset_condition.name == "plain__clock"

    live = wavepipe_ingest_dag(dag_id="live", topic="seismic", watch_records=100, watch_max_delay_s=5)
    assert isinstance(live.timetable, AssetOrTimeSchedule)  # the 15-minute clock stays
    clock, asset = live.timetable.asset_condition.objects
    assert clock.name == "live__clock" and asset.name == "live__lag"
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, GroupLagTrigger)
    path, kwargs = watcher.trigger.serialize()
    assert path == "wavepipe.plugins.triggers.GroupLagTrigger"
    assert kwargs["topic"] == "seismic" and kwargs["group"] == "wavepipe-ingest"
    assert (kwargs["records"], kwargs["bytes"], kwargs["max_delay_s"]) == (100, 0, 5.0)
    assert kwargs["settings_overrides"] == {"watch_records": 100, "watch_max_delay_s": 5}
    assert type(GroupLagTrigger(**kwargs).serialize()[1]) is dict and GroupLagTrigger(**kwargs).serialize() == (
        path,
        kwargs,
    )
    assert live.max_active_runs == 1
    # an event-driven run is one task (a micro-batch pays one task's start); a run that leaves
    # records it did not plan queues its follow-up on the same asset
    assert [t.task_id for t in live.tasks] == ["run"]
    run = live.get_task("run")
    assert run.follow_up == asset and [o.name for o in run.outlets] == ["live__follow_up", "live__published"]
    assert plain.get_task("commit").follow_up is None
    assert [o.name for o in plain.get_task("commit").outlets] == ["plain__published"]
    # asked for five tasks, its reassembly validates and publishes in the same Spark session
    apart = wavepipe_ingest_dag(dag_id="apart", topic="seismic", watch_records=100, single_task=False)
    assert [t.task_id for t in apart.topological_sort()] == ["plan", "consume", "reassemble", "validate", "commit"]
    assert apart.get_task("commit").follow_up.name == "apart__lag"
    assert apart.get_task("reassemble").validate and not plain.get_task("reassemble").validate
    # and a scheduled DAG may run in one task too, with the same params
    one = wavepipe_ingest_dag(dag_id="one", single_task=True)
    assert [t.task_id for t in one.tasks] == ["run"] and one.get_task("run").follow_up is None
    assert set(one.params) == set(plain.params)
    # with follow_s, an event-driven DAG's one task is a follow loop polling at the watcher's rate
    follow = wavepipe_ingest_dag(
        dag_id="follow", topic="seismic", watch_records=1, watch_poll_s=0.5, settings={"follow_s": 600}
    )
    assert [t.task_id for t in follow.tasks] == ["follow"]
    loop = follow.get_task("follow")
    assert (loop.follow_s, loop.poll_s, loop.follow_up.name) == (600, 0.5, "follow__lag")
    scheduled = wavepipe_ingest_dag(dag_id="scheduled", settings={"follow_s": 600})  # the clock starts its loops
    assert scheduled.task_ids == ["follow"] and scheduled.get_task("follow").follow_up is None

    # from the settings the DAG processor sees (config file, WAVEPIPE_*), on data only
    monkeypatch.setenv("WAVEPIPE_WATCH_BYTES", "1000000")
    only_data = wavepipe_ingest_dag(dag_id="only_data", schedule=None)
    assert type(only_data.timetable).__name__ == "AssetTriggeredTimetable"
    assert only_data.timetable.asset_condition.objects[0].watchers[0].trigger.thresholds.bytes == 1_000_000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"watch_records": -1}, "watch_records must be 0 .off. or a number of records, got -1"),
        ({"watch_poll_s": 0}, "watch_poll_s must be 0.1 to 3600 seconds, got 0"),
        ({"watch_records": 5, "settings": {"watch_records": 6}}, "give watch_records as the factory's argument"),
        ({"watch_records": 5, "schedule": "@continuous"}, "give a timedelta, a cron expression"),
    ],
)
def test_a_watch_the_factory_cannot_honour_is_an_import_error(kwargs, match):
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag

    with pytest.raises(ValueError, match=match):
        wavepipe_ingest_dag(dag_id="bad", **kwargs)


def test_a_follow_up_without_an_alias_to_emit_through_is_refused_at_parse_time():
    from airflow.sdk import Asset

    from wavepipe.plugins.operators import CommitOperator

    with pytest.raises(ValueError, match="follow_up needs exactly one AssetAlias among the outlets"):
        CommitOperator(task_id="commit", follow_up=Asset(name="a", uri="x-wavepipe://lag/a"))


def test_a_run_counts_what_a_cap_left_apart_from_what_came_after_its_plan(monkeypatch, tmp_path):
    """The report's ``left_by_cap`` (a capped event-driven run's follow-up) and ``unplanned``; the
    end offsets at commit time stand in for the broker's answer."""
    from wavepipe import pipeline
    from wavepipe.consumers import kafka_admin
    from wavepipe.contracts.config import load_settings
    from wavepipe.contracts.plan import OffsetRange, RunPlan

    plan = RunPlan.new("r1", "t", "g", [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 5)], latest={0: 25, 1: 5})
    report = {"partitions": {"0": {}, "1": {}}, "commit": {"0": {"after": 8}, "1": {"after": 5}}}
    monkeypatch.setattr(kafka_admin, "list_offsets", lambda *a, **k: {0: 30, 1: 7})
    pipeline._lag_after(load_settings(home=tmp_path), plan, report)
    assert report["partitions"]["0"] == {"lag_after": 22, "unplanned": 20, "left_by_cap": 15}
    assert report["partitions"]["1"] == {"lag_after": 2, "unplanned": 2, "left_by_cap": 0}
    assert pipeline.left_by_cap(report) == 15


def test_end_offsets_kafka_does_not_give_leave_the_lag_unknown_and_a_bug_is_raised(monkeypatch, tmp_path):
    """The lag after a commit only describes the run: Kafka not giving the end offsets (a leader
    that just died, asked once and briefly) leaves it unknown; a mistake in the call is raised."""
    from confluent_kafka import KafkaError, KafkaException

    from wavepipe import pipeline
    from wavepipe.consumers import kafka_admin
    from wavepipe.contracts.config import load_settings
    from wavepipe.contracts.plan import OffsetRange, RunPlan

    plan = RunPlan.new("r1", "t", "g", [OffsetRange("t", 0, 0, 10)], latest={0: 10})
    asked = []

    def timed_out(*args, **kwargs):
        asked.append(kwargs)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    report = {"partitions": {"0": {}}, "commit": {"0": {"after": 10}}}
    monkeypatch.setattr(kafka_admin, "list_offsets", timed_out)
    pipeline._lag_after(load_settings(home=tmp_path), plan, report)
    assert report["partitions"]["0"] == {"lag_after": None, "unplanned": None, "left_by_cap": 0}
    assert asked == [{"timeout_s": pipeline.LAG_TIMEOUT_S, "attempts": 1}]

    monkeypatch.setattr(kafka_admin, "list_offsets", lambda *a, **k: {}.missing)
    with pytest.raises(AttributeError):
        pipeline._lag_after(load_settings(home=tmp_path), plan, report)
