"""The ingest DAG's schedule: incremental runs on a clock (no logical date), windows for backfills."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

W = timedelta(minutes=15)


def _serialized(dag):
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def test_the_scheduler_makes_no_run_and_a_backfill_gets_every_window_on_the_grid():
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag
    from wavepipe.plugins.schedules import BackfillWindows

    dag = _serialized(wavepipe_ingest_dag(dag_id="x"))  # as the scheduler reads it (the plugin's timetable)
    assert isinstance(dag.timetable.timetable, BackfillWindows) and dag.timetable.periodic
    assert dag.next_dagrun_info(last_automated_run_info=None) is None  # the clock starts incremental runs
    began = datetime(2026, 11, 25, 10, 37, 15, tzinfo=UTC)  # between ticks: windows start on the grid
    infos = list(dag.iter_dagrun_infos_between(began, began + timedelta(minutes=40)))
    assert [(i.logical_date.isoformat(), i.data_interval.end - i.data_interval.start) for i in infos] == [
        ("2026-11-25T10:45:00+00:00", W),
        ("2026-11-25T11:00:00+00:00", W),
        ("2026-11-25T11:15:00+00:00", W),
    ]
    # a backfill's run id names its window's start (Airflow names it by run_after)
    assert all(i.run_after == i.data_interval.start for i in infos)


def test_the_clock_ticks_on_the_schedule_and_never_twice_on_one_tick():
    from wavepipe.plugins.schedules import next_tick, windows_of

    at = datetime(2026, 11, 25, 10, 37, 15, tzinfo=UTC)
    grid = datetime(2026, 11, 25, 10, 45, tzinfo=UTC)
    assert next_tick(windows_of(W), at) == grid
    assert next_tick(windows_of(W), grid) == grid + W  # a tick just fired: the next one
    assert next_tick(windows_of("*/15 * * * *"), at) == grid
    assert next_tick(windows_of("0 3 * * *"), at) == datetime(2026, 11, 26, 3, tzinfo=UTC)


def test_a_schedule_is_a_period_or_a_cron_or_a_data_interval_timetable():
    from airflow.sdk import CronTriggerTimetable, DeltaDataIntervalTimetable

    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag
    from wavepipe.plugins.schedules import windows_of

    assert windows_of(None) is None
    assert windows_of(DeltaDataIntervalTimetable(W)).summary == windows_of(W).summary
    assert windows_of("@hourly").summary == "0 * * * *"
    for bad in (timedelta(0), CronTriggerTimetable("*/5 * * * *", timezone="UTC"), 15, "@continuous", "*/15 * *"):
        with pytest.raises(ValueError, match=r"give a timedelta, a cron expression|must be positive"):
            windows_of(bad)
    with pytest.raises(ValueError, match=r"^bad: schedule"):  # an import error naming the DAG
        wavepipe_ingest_dag(dag_id="bad", schedule=CronTriggerTimetable("*/5 * * * *", timezone="UTC"))
    manual = wavepipe_ingest_dag(dag_id="manual", schedule=None)
    assert manual.schedule is None


def test_the_clock_trigger_round_trips_and_fires_at_its_ticks():
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag
    from wavepipe.plugins.triggers import ClockTrigger

    dag = wavepipe_ingest_dag(dag_id="x", schedule=timedelta(seconds=1))
    clock = dag.timetable.asset_condition
    assert clock.name == "x__clock" and clock.uri == "x-wavepipe://clock/x"
    path, kwargs = clock.watchers[0].trigger.serialize()
    assert path == "wavepipe.plugins.triggers.ClockTrigger" and kwargs == {
        "kind": "delta",
        "spec": {"delta": 1.0},
        "dag_id": "x",
    }

    async def two_ticks():
        events = ClockTrigger(**kwargs).run()
        return [(await anext(events)).payload["tick"] for _ in range(2)]

    ticks = [datetime.fromisoformat(t) for t in asyncio.run(asyncio.wait_for(two_ticks(), 10))]
    assert ticks[1] - ticks[0] == timedelta(seconds=1) and all(t.microsecond == 0 for t in ticks)
