"""The DAG factories, built in this process (no Airflow service): what a user's DAG file gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from wavepipe.contracts.config import SettingsError, load_settings
from wavepipe.plugins.airflow_dags import SINGLE_RUNS_ONLY


def test_the_dag_folder_imports_with_its_wiring():
    """Airflow's DagBag over the DAG folder ``wavepipe airflow up`` serves (the package's)."""
    from airflow.dag_processing.dagbag import DagBag

    from wavepipe.local.airflow import DAGS_FOLDER

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    assert sorted(bag.dags) == [
        "wavepipe_ingest",
        "wavepipe_maintenance",
        "wavepipe_quality_alert",
        "wavepipe_rewind",
        "wavepipe_waveforms_summary",
    ]
    dag = bag.dags["wavepipe_ingest"]
    assert [t.task_id for t in dag.topological_sort()] == ["plan", "consume", "reassemble", "validate", "commit"]
    # every DAG and task says in the UI what it does
    assert all(d.doc_md for d in bag.dags.values()) and all(t.doc_md for d in bag.dags.values() for t in d.tasks)
    # the plan reads the topic (named as the apache-kafka provider names it); the commit emits the
    # tables' events through an alias, the downstream example runs on the waveforms table
    settings = load_settings()
    assert [a.uri for a in dag.get_task("plan").inlets] == [
        f"kafka://{settings.bootstrap_servers.split(',')[0]}/{settings.topic}"
    ]
    assert [o.name for o in dag.get_task("commit").outlets] == ["wavepipe_ingest__published"]
    downstream = bag.dags["wavepipe_waveforms_summary"]
    (asset,) = downstream.timetable.asset_condition.objects
    assert asset.uri == Path(settings.output_table).resolve().as_uri()
    (breaches,) = bag.dags["wavepipe_quality_alert"].timetable.asset_condition.objects
    assert breaches.uri == f"{asset.uri}?wavepipe=quality"
    assert dag.max_active_runs == 1 and not dag.catchup
    assert set(dag.params) == {
        "topic",
        "group",
        "max_records",
        "max_bytes",
        "skip_lost_offsets",
        "window_start",
        "window_end",
        "new_group_start",
    }
    # the forms (trigger and backfill dialogs alike) open on what every run uses; the rest is in a
    # section whose title says a backfill leaves it empty
    sections = {name: dag.params.get_param(name).schema.get("section") for name in dag.params}
    assert {n for n, s in sections.items() if s is None} == {"topic", "group"}
    assert set(sections.values()) == {None, SINGLE_RUNS_ONLY}
    # incremental runs on the clock asset; 15-minute windows for backfills (test_schedules.py)
    assert type(dag.timetable).__name__ == "AssetOrTimeSchedule" and dag.timetable.asset_condition.name.endswith(
        "__clock"
    )
    rewind = bag.dags["wavepipe_rewind"]
    assert [t.task_id for t in rewind.tasks] == ["rewind"] and rewind.schedule is None
    assert {"mode", "value", "execute", "force", "reason", "partitions"} <= set(rewind.params)
    maintenance = bag.dags["wavepipe_maintenance"]
    assert [t.task_id for t in maintenance.topological_sort()] == ["optimize", "vacuum"]
    assert maintenance.max_active_runs == 1 and not maintenance.catchup
    assert type(maintenance.timetable).__name__ == "CronTriggerTimetable"
    assert {k: maintenance.params[k] for k in maintenance.params} == {
        "tables": "",
        "zorder": True,
        "days": None,
        "retention_hours": None,
        "dry_run": False,
    }


def test_the_maintenance_dag_keeps_a_pipelines_tables_and_refuses_bad_arguments():
    from wavepipe.plugins.airflow_dags import wavepipe_maintenance_dag

    dag = wavepipe_maintenance_dag(
        dag_id="seismic_maintenance", settings={"home": "/data/seismic"}, zorder=False, days=None, schedule=None
    )
    assert dag.params["zorder"] is False and dag.params["days"] is None and dag.schedule is None
    assert {t.settings_overrides["home"] for t in dag.tasks} == {"/data/seismic"}
    for days in (-1, 1.5, True):
        with pytest.raises(ValueError, match="days must be None"):
            wavepipe_maintenance_dag(dag_id="m", days=days)
    with pytest.raises(SettingsError, match="table_retention_hours"):
        wavepipe_maintenance_dag(dag_id="m", settings={"table_retention_hours": -2})


def test_unpausing_the_maintenance_dag_starts_no_past_run():
    """Its first run is the schedule's next time, not today's 03:30 already gone (which Airflow
    starts at once on unpause when the DAG has a start date)."""
    from datetime import UTC, datetime

    from airflow.serialization.serialized_objects import DagSerialization

    from wavepipe.plugins.airflow_dags import wavepipe_maintenance_dag

    dag = DagSerialization.from_dict(DagSerialization.to_dict(wavepipe_maintenance_dag()))
    first = dag.next_dagrun_info(last_automated_run_info=None)
    assert first is not None and first.run_after > datetime.now(UTC), first


def test_two_pipelines_side_by_side_each_with_its_own_settings_and_connections():
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag, wavepipe_rewind_dag

    seismic = wavepipe_ingest_dag(
        dag_id="seismic",
        topic="seismic",
        group="seismic-ingest",
        settings={"home": Path("/data/seismic"), "max_records_per_partition": 500},
    )
    wards = wavepipe_ingest_dag(
        dag_id="wards",
        topic="ecg",
        schedule=None,
        kafka_conn_id="wards_kafka",
        spark_conn_id="wards_spark",
        tags=["wards"],
    )
    rewind = wavepipe_rewind_dag(dag_id="seismic_rewind", topic="seismic", settings={"home": "/data/seismic"})
    assert [t.task_id for t in seismic.topological_sort()] == ["plan", "consume", "reassemble", "validate", "commit"]
    assert seismic.params["topic"] == "seismic" and seismic.params["group"] == "seismic-ingest"
    assert wards.params["topic"] == "ecg" and wards.params["group"] is None
    assert seismic.timetable.asset_condition.name == "seismic__clock" and seismic.max_active_runs == 1
    assert type(wards.timetable).__name__ == "NullTimetable" and wards.tags == {"wards"}
    for task in seismic.tasks:  # every task, the mapped consume's partial arguments included
        kwargs = getattr(task, "partial_kwargs", None) or vars(task)
        # plain values (a mapped task's arguments are serialized): the Path as a string
        assert kwargs["settings_overrides"] == {"home": "/data/seismic", "max_records_per_partition": 500}, task
    plan = seismic.get_task("plan")
    assert (plan.wavepipe_conn_id, plan.spark_conn_id) == ("wavepipe_kafka", "wavepipe_spark")
    assert (wards.get_task("plan").wavepipe_conn_id, wards.get_task("commit").spark_conn_id) == (
        "wards_kafka",
        "wards_spark",
    )
    assert rewind.get_task("rewind").settings_overrides == {"home": "/data/seismic"}
    # None is no value (as for load_settings' overrides); ~ is the workers' home, kept as written
    assert wavepipe_ingest_dag(dag_id="n", settings={"topic": None, "home": "~/w"}).get_task(
        "plan"
    ).settings_overrides == {"home": "~/w"}
    assert rewind.params["topic"] == "seismic" and rewind.schedule is None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"settings": {"hme": "/x"}}, SettingsError, "'hme' is not a wavepipe setting; did you mean 'home'"),
        ({"settings": {"partitions": "many"}}, SettingsError, "partitions must be an integer"),
        ({"topic": "two words"}, SettingsError, "must be a Kafka topic name"),
        ({"group": " "}, SettingsError, "must be a non-empty consumer group name"),
        (
            {"topic": "a", "settings": {"topic": "b"}},
            ValueError,
            "topic as the factory's argument or in settings, not both",
        ),
        ({"settings": {"home": "data/seismic"}}, SettingsError, "home must be an absolute path in a DAG's settings"),
        ({"settings": {"home": 7}}, SettingsError, "home must be a string, got 7"),
    ],
)
def test_what_a_dag_file_gets_wrong_is_an_import_error_naming_it(kwargs, error, match):
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag

    with pytest.raises(error, match=match):
        wavepipe_ingest_dag(dag_id="bad", **kwargs)


def test_a_tasks_argument_wins_over_the_runs_param_and_params_arrive_typed():
    """The factories' operators take their arguments from the run's params as Airflow checked them:
    a topic named "123" stays a string (a rendered native template would make it an int)."""
    from wavepipe.plugins.operators import PlanOperator
    from wavepipe.plugins.rewind_operator import RewindOperator

    context = {"params": {"topic": "123", "group": None, "max_records": 7, "skip_lost_offsets": True}}
    plan = PlanOperator(task_id="plan", max_records=5)
    assert plan.arg(context, "max_records") == 5  # given to the task: it wins
    assert plan.arg(context, "topic") == "123" and plan.arg(context, "group") is None
    assert plan.arg(context, "skip_lost_offsets") is True and plan.arg(context, "max_bytes") is None
    assert PlanOperator(task_id="p2", topic="").arg(context, "topic") == "123"  # empty: not given
    rewind = RewindOperator(task_id="rewind")
    assert rewind.arg({"params": {"execute": True}}, "apply", "execute") is True
    assert RewindOperator(task_id="r2", apply=False).arg({"params": {"execute": True}}, "apply", "execute") is False


@pytest.mark.parametrize(
    ("run_type", "window", "expected"),
    [
        ("manual", (None, None), None),
        ("manual", ("2026-11-20T00:00:00+00:00", "2026-11-20T00:15:00+00:00"), "window"),
        ("backfill", (None, None), "interval"),
        ("backfill", ("", ""), "interval"),  # what a form's emptied field sends
        ("backfill", ("2026-11-20T00:00:00+00:00", "2026-11-20T00:15:00+00:00"), "takes its window from its dates"),
        ("manual", ("2026-11-20T00:00:00+00:00", None), "give both window_start and window_end"),
    ],
)
def test_which_window_a_run_reprocesses(run_type, window, expected):
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from wavepipe.contracts.errors import UsageError
    from wavepipe.plugins.operators import run_window

    interval = (datetime(2026, 11, 21, tzinfo=UTC), datetime(2026, 11, 21, 0, 15, tzinfo=UTC))
    context = {
        "dag_run": SimpleNamespace(run_type=run_type),
        "data_interval_start": interval[0],
        "data_interval_end": interval[1],
    }
    if expected is None:
        assert run_window(context, *window) is None
    elif expected == "interval":
        assert run_window(context, *window) == interval
    elif expected == "window":
        assert run_window(context, *window) == (
            datetime(2026, 11, 20, tzinfo=UTC),
            datetime(2026, 11, 20, 0, 15, tzinfo=UTC),
        )
    else:
        with pytest.raises(UsageError, match=expected):
            run_window(context, *window)


def _on_failure(context):  # a DAG file's callback
    pass


def test_a_dag_files_default_args_and_dag_options_reach_every_task():
    from datetime import timedelta

    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag, wavepipe_maintenance_dag, wavepipe_rewind_dag

    options = {
        "owner": "seis",
        "pool": "seismic",
        "queue": "spark-side",
        "execution_timeout": timedelta(minutes=20),
        "on_failure_callback": _on_failure,
    }
    dag = wavepipe_ingest_dag("seis", default_args=options, description="Seismic", dagrun_timeout=timedelta(hours=1))
    assert dag.description == "Seismic" and dag.dagrun_timeout == timedelta(hours=1) and dag.max_active_runs == 1
    for task in dag.tasks:
        assert (task.owner, task.pool, task.queue, task.execution_timeout) == (
            "seis",
            "seismic",
            "spark-side",
            timedelta(minutes=20),
        ), task.task_id
        assert task.on_failure_callback == [_on_failure] and task.retries == 2  # ours, where theirs is silent
    assert wavepipe_ingest_dag("seis", default_args={"retries": 5}).get_task("plan").retries == 5
    for factory in (wavepipe_rewind_dag, wavepipe_maintenance_dag):
        assert {t.owner for t in factory(default_args={"owner": "ops"}).tasks} == {"ops"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"default_args": {"excution_timeout": 60}},
            r"default_args\['excution_timeout'\]: it is not a task option; did you mean 'execution_timeout'",
        ),
        ({"default_args": {"trigger_rule": "all_done"}}, "the DAG sets it on each task itself"),
        ({"default_args": {"retries": 1}, "retries": 3}, "not both"),
        ({"max_active_runs": 2}, "one run at a time holds a pipeline's consumer group"),
        ({"catchup": True}, "backfill"),
        ({"params": {}}, "params are the runs'"),
        ({"default_args": [("owner", "seis")]}, "default_args must be a dict of task options, got list"),
    ],
)
def test_task_and_dag_options_that_would_be_dropped_or_break_the_pipeline_are_refused(kwargs, match):
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag

    with pytest.raises(ValueError, match=match):
        wavepipe_ingest_dag("seis", **kwargs)
