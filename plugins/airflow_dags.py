"""DAG factories: a user's DAG file is a few lines that call one, so one Airflow runs several
pipelines (topics, groups, homes) side by side::

    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag

    seismic = wavepipe_ingest_dag(dag_id="seismic_ingest", topic="seismic", group="seismic-ingest",
                                  settings={"home": "/data/wavepipe/seismic"})

Everything a factory is given is checked when the DAG file is parsed: a mistyped setting or an
invalid topic is an import error in the UI, never a run on the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import (
    DAG,
    Asset,
    AssetAlias,
    AssetOrTimeSchedule,
    AssetWatcher,
    CronTriggerTimetable,
    DeltaDataIntervalTimetable,
    Param,
    TriggerRule,
)

from wavepipe.consumers.lag import Thresholds
from wavepipe.contracts.config import check_settings, load_settings
from wavepipe.contracts.errors import did_you_mean
from wavepipe.plugins import dag_docs
from wavepipe.plugins.assets import topic_asset
from wavepipe.plugins.hooks import SPARK_CONN_ID, WavepipeHook
from wavepipe.plugins.maintenance_operators import OptimizeTablesOperator, VacuumTablesOperator
from wavepipe.plugins.operators import (
    CommitOperator,
    ConsumeOperator,
    FollowOperator,
    PlanOperator,
    ReassembleOperator,
    RunOperator,
    ValidateOperator,
    plain_settings,
)
from wavepipe.plugins.rewind_operator import RewindOperator
from wavepipe.plugins.schedules import BackfillWindows, window_kind, windows_of
from wavepipe.plugins.triggers import ClockTrigger, GroupLagTrigger

#: The ingest DAG's default schedule: an incremental run every 15 minutes (at :00, :15, :30 and
#: :45 UTC), and 15-minute windows for backfills (``schedules``).
EVERY_15_MINUTES = DeltaDataIntervalTimetable(timedelta(minutes=15))
#: The maintenance DAG's default schedule: once a day, at 03:30 UTC.
#: The maintenance DAG's schedule: 03:30 UTC. Unpaused within 10% of a day after an 03:30, a DAG
#: without a start date runs that past 03:30 at once with a plain cron string, and also with
#: ``run_immediately=False`` (Airflow 3.2 tests only ``is True`` and treats False as its default);
#: a zero window never does.
DAILY_AT_0330 = CronTriggerTimetable("30 3 * * *", timezone="UTC", run_immediately=timedelta(0))
START_DATE = datetime(2026, 1, 1)


#: The trigger forms' section of the ingest DAG's params that only single runs use. Airflow's
#: backfill dialog shows a DAG's params as its trigger dialog does (it has no way to leave some
#: out), so these sit apart, collapsed, under a title that says a backfill does without them: its
#: window comes from its dates, and it reads the whole window (caps are refused).
SINGLE_RUNS_ONLY = "Single runs only: a backfill takes its window from its dates and leaves these empty"


def _optional(kind: str, description: str, **schema: Any) -> Param:
    """A param a run may leave empty (null: the run's default); else a value of JSON type ``kind``."""
    return Param(None, type=["null", kind], description=description, **schema)


def _pipeline(
    named: Mapping[str, Any], settings: Mapping[str, Any] | None, *, kafka_conn_id: str, spark_conn_id: str
) -> dict[str, Any]:
    """The operators' common arguments, after checking what the DAG file gave: ``named``, the
    settings given as the factory's own arguments (topic, group: the params' defaults; the
    watch thresholds: added to the settings), and ``settings``."""
    named = {k: v for k, v in named.items() if v is not None}
    check_settings(named, "the factory's arguments")
    overrides = plain_settings(settings, "the DAG's settings")
    clash = sorted(set(named) & set(overrides))
    if clash:
        raise ValueError(f"give {', '.join(clash)} as the factory's argument or in settings, not both")
    extra = {k: v for k, v in named.items() if k not in ("topic", "group")}
    return {
        "settings_overrides": {**overrides, **extra},
        "wavepipe_conn_id": kafka_conn_id,
        "spark_conn_id": spark_conn_id,
    }


def _lag_asset(dag_id: str, topic: str | None, group: str | None, common: Mapping[str, Any], resolved) -> Asset | None:
    """None, or when the DAG's settings (``resolved``: the factory's, over the config file and
    ``WAVEPIPE_*`` as the DAG processor sees them) set a ``watch_*`` threshold: an asset whose
    watcher (``GroupLagTrigger``, in the triggerer) fires when the group's lag reaches it."""
    thresholds = Thresholds.of(resolved)
    if not thresholds.on:
        return None
    topic, group = topic or resolved.topic, group or resolved.group
    trigger = GroupLagTrigger(
        topic=topic,
        group=group,
        records=thresholds.records,
        bytes=thresholds.bytes,
        max_delay_s=thresholds.max_delay_s,
        poll_s=resolved.watch_poll_s,
        new_group_start=resolved.new_group_start,
        settings_overrides=common["settings_overrides"],
        wavepipe_conn_id=common["wavepipe_conn_id"],
    )
    return Asset(
        name=f"{dag_id}__lag",
        uri=topic_asset(resolved.bootstrap_servers, topic, group).uri,
        extra={"topic": topic, "group": group, "fires_on": thresholds.describe()},
        watchers=[AssetWatcher(name=f"{dag_id}__lag", trigger=trigger)],
    )


def _ingest_schedule(dag_id: str, schedule: Any, lag_asset: Asset | None) -> Any:
    """The ingest DAG's schedule (``schedules``): incremental runs on the clock of ``schedule``
    (and on the lag asset, when there is one), and ``schedule``'s intervals as the windows a
    backfill reprocesses; with ``schedule`` None, manual runs only (or the lag asset's)."""
    try:
        windows = windows_of(schedule)
    except ValueError as exc:
        raise ValueError(f"{dag_id}: {exc}") from None
    if windows is None:
        return None if lag_asset is None else [lag_asset]
    spec = {str(k): v for k, v in windows.serialize().items()}
    clock = Asset(
        name=f"{dag_id}__clock",
        uri=f"x-wavepipe://clock/{dag_id}",
        extra={"every": windows.summary},
        watchers=[
            AssetWatcher(
                name=f"{dag_id}__clock", trigger=ClockTrigger(kind=window_kind(windows), spec=spec, dag_id=dag_id)
            )
        ],
    )
    return AssetOrTimeSchedule(
        timetable=BackfillWindows(windows), assets=clock if lag_asset is None else clock | lag_asset
    )


#: Task options the factories set themselves, per task (the wiring depends on them).
_OWN_TASK_OPTIONS = frozenset(
    {
        "task_id",
        "dag",
        "task_group",
        "params",
        "inlets",
        "outlets",
        "trigger_rule",
        "map_index_template",
        "do_xcom_push",
        "multiple_outputs",
        "default_args",
        "kwargs",
        "self",
    }
)
#: DAG options that would break a wavepipe DAG, and why.
_OWN_DAG_OPTIONS = {
    "params": "its params are the runs' (topic, group, caps, window): a run's conf gives their values",
    "max_active_runs": "one run at a time holds a pipeline's consumer group",
    "catchup": "an incremental run reads everything new; reprocess past windows with a backfill",
    "default_args": "give them as the factory's default_args",
}


def task_defaults(dag_id: str, ours: Mapping[str, Any], theirs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The DAG's ``default_args``: the factory's (``ours``), under the DAG file's (``theirs``:
    ``owner``, ``pool``, ``queue``, ``execution_timeout``, ``on_failure_callback``, ... any
    ``BaseOperator`` argument but those the factory wires itself). A name that is no task option
    is refused, with the closest ones: Airflow would drop it silently."""
    import inspect

    from airflow.sdk import BaseOperator

    if theirs is not None and not isinstance(theirs, Mapping):
        raise ValueError(f"{dag_id}: default_args must be a dict of task options, got {type(theirs).__name__}")
    options = set(inspect.signature(BaseOperator.__init__).parameters) - _OWN_TASK_OPTIONS
    theirs = dict(theirs or {})
    for name in sorted(set(theirs) - options):
        why = (
            "the DAG sets it on each task itself"
            if name in _OWN_TASK_OPTIONS
            else f"it is not a task option{did_you_mean(name, options)}"
        )
        raise ValueError(f"{dag_id}: default_args[{name!r}]: {why}")
    return {**ours, **theirs}


def dag_options(dag_id: str, ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``DAG`` arguments: the factory's, with the DAG file's other keyword arguments over them
    (``description``, ``doc_md``, ``dagrun_timeout``, ``owner_links``, ...), but none that would
    break the pipeline (``_OWN_DAG_OPTIONS``, refused with the reason)."""
    for name in sorted(set(theirs) & set(_OWN_DAG_OPTIONS)):
        raise ValueError(f"{dag_id}: {name} is the factory's to set: {_OWN_DAG_OPTIONS[name]}")
    return {**ours, **theirs}


def _dag(
    dag_id: str,
    topic: str | None,
    group: str | None,
    summary: str,
    *,
    run_params: dict[str, Param],
    tags: list[str] | None,
    defaults: Mapping[str, Any],
    default_args: Mapping[str, Any] | None,
    doc_md: str,
    **kwargs: Any,
) -> DAG:
    """A wavepipe DAG: one run at a time, no catchup, the ``topic`` and ``group`` params first;
    the DAG file's ``default_args`` over the factory's ``defaults``, its DAG options over ours."""
    own = {"description": summary, "doc_md": doc_md, "tags": tags if tags is not None else ["wavepipe"]}
    return DAG(
        dag_id=dag_id,
        catchup=False,
        max_active_runs=1,
        params={
            "topic": Param(
                topic, type=["null", "string"], description="Topic to read (default: wavepipe config `topic`)"
            ),
            "group": Param(
                group,
                type=["null", "string"],
                description="Consumer group whose offsets are the progress (default: config `group`)",
            ),
            **run_params,
        },
        default_args=task_defaults(dag_id, defaults, default_args),
        **dag_options(dag_id, own, kwargs),
    )


def wavepipe_ingest_dag(
    dag_id: str = "wavepipe_ingest",
    *,
    topic: str | None = None,
    group: str | None = None,
    schedule: Any = EVERY_15_MINUTES,
    settings: Mapping[str, Any] | None = None,
    kafka_conn_id: str = WavepipeHook.default_conn_name,
    spark_conn_id: str = SPARK_CONN_ID,
    start_date: datetime = START_DATE,
    retries: int | None = None,
    tags: list[str] | None = None,
    default_args: Mapping[str, Any] | None = None,
    watch_records: int | None = None,
    watch_bytes: int | None = None,
    watch_max_delay_s: float | None = None,
    watch_poll_s: float | None = None,
    single_task: bool | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The ingest DAG: plan -> consume (one mapped task per partition group) -> reassemble ->
    validate (then publish) -> commit, one bounded run at a time; with ``single_task`` the same
    steps in one task, ``run`` (``RunOperator``): a micro-batch then pays one task's start, not
    five. Default: one task when the DAG is event-driven (a ``watch_*`` threshold is set), the
    five tasks otherwise (each step's log, duration and retry apart).

    ``topic``/``group``: what the trigger form offers by default (else the settings' ``topic`` and
    ``group``); a run's conf may still name others. ``settings``: wavepipe settings for this
    pipeline's tasks, over the config file and ``WAVEPIPE_*`` (e.g. its own ``home``, so its runs
    and tables are its own). ``kafka_conn_id``/``spark_conn_id``: its Airflow Connections.
    ``schedule``: when incremental runs start and which windows a backfill reprocesses (a
    timedelta, a cron expression, or a Delta/CronDataIntervalTimetable: ``schedules``); None:
    manual runs only.
    ``watch_records``/``watch_bytes``/``watch_max_delay_s``/``watch_poll_s`` (the settings of
    those names, which may also come from ``settings``, the config file or ``WAVEPIPE_*``): also
    run as soon as the group's lag reaches one, besides ``schedule`` (event-driven runs,
    docs/operations.md). A DAG whose settings set ``follow_s`` runs its one task, ``follow``
    (``FollowOperator``), as a follow loop: micro-batches back to back for up to that many seconds
    from each DAG run's start (the watcher's, or the schedule's). Other keyword arguments go to
    ``DAG``."""
    named = {
        "topic": topic,
        "group": group,
        "watch_records": watch_records,
        "watch_bytes": watch_bytes,
        "watch_max_delay_s": watch_max_delay_s,
        "watch_poll_s": watch_poll_s,
    }
    common = _pipeline(named, settings, kafka_conn_id=kafka_conn_id, spark_conn_id=spark_conn_id)
    resolved = load_settings(**common["settings_overrides"])
    lag_asset = _lag_asset(dag_id, topic, group, common, resolved)
    # the tables a committed run put rows in get their events through an alias; a run that a cap
    # cut short queues its follow-up through another
    commits = {"published": AssetAlias(f"{dag_id}__published")}
    if lag_asset:
        commits.update(follow_up=lag_asset, outlets=[AssetAlias(f"{dag_id}__follow_up")])
    reads = {"inlets": [topic_asset(resolved.bootstrap_servers, topic or resolved.topic)]}
    with _dag(
        dag_id,
        topic,
        group,
        "Bounded run: frozen offset ranges -> staged chunks -> reassembled waveforms -> validated -> committed offsets",
        schedule=_ingest_schedule(dag_id, schedule, lag_asset),
        start_date=start_date,
        tags=tags,
        defaults={"retries": _retries(dag_id, retries, default_args), "retry_delay": timedelta(seconds=15)},
        default_args=default_args,
        doc_md=dag_docs.INGEST,
        run_params={
            "max_records": _optional(
                "integer", "Cap: records per partition in this run", minimum=1, section=SINGLE_RUNS_ONLY
            ),
            "max_bytes": _optional(
                "integer", "Cap: payload bytes per partition in this run", minimum=1, section=SINGLE_RUNS_ONLY
            ),
            "skip_lost_offsets": Param(  # null allowed: a form shows a flag with a default as optional
                False,
                type=["null", "boolean"],
                description="If the group is behind what the topic still retains, go on from the earliest retained offsets and record the lost range in the report (default: fail and name it)",
                section=SINGLE_RUNS_ONLY,
            ),
            "window_start": _optional(
                "string",
                "Reprocess a time window instead of continuing from the group's offsets: its start (ISO-8601). The window's output is replaced and no offset is committed. Backfill runs use their data interval without this.",
                format="date-time",
                section=SINGLE_RUNS_ONLY,
            ),
            "window_end": _optional(
                "string",
                "End (exclusive) of the time window to reprocess; give it with window_start",
                format="date-time",
                section=SINGLE_RUNS_ONLY,
            ),
            "new_group_start": _optional(
                "string",
                "Only for a group with no committed offsets on the topic: where it starts (earliest, latest or an ISO-8601 instant). Without it (or the setting new_group_start) such a run is refused, so a mistyped group reads nothing",
                section=SINGLE_RUNS_ONLY,
            ),
        },
        **dag_kwargs,
    ) as dag:
        docs = dag_docs.TASKS
        if resolved.follow_s:  # micro-batches back to back in one long task, however a DAG run starts
            FollowOperator(
                task_id="follow",
                follow_s=resolved.follow_s,
                poll_s=resolved.watch_poll_s,
                doc_md=docs["follow"],
                **reads,
                **commits,
                **common,
            )
            return dag
        if (lag_asset is not None) if single_task is None else single_task:
            # its arguments: the run's params, typed
            RunOperator(task_id="run", doc_md=docs["run"], **reads, **commits, **common)
            return dag
        # its arguments: the run's params, typed
        plan = PlanOperator(task_id="plan", doc_md=docs["plan"], **reads, **common)
        consume = ConsumeOperator.partial(
            task_id="consume",
            map_index_template="{{ task.partitions_label }}",
            doc_md=docs["consume"],
            **common,
        ).expand(partitions=plan.output)
        # an event-driven run validates and publishes in its reassembly's Spark session (fresher)
        # after the plan and its reads (none: a plan with nothing to read maps no consume task);
        # skipped with the plan when the run was refused
        reassemble = ReassembleOperator(
            task_id="reassemble",
            trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            validate=bool(lag_asset),
            doc_md=docs["reassemble"],
            **common,
        )
        validate = ValidateOperator(
            task_id="validate", trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS, doc_md=docs["validate"], **common
        )
        commit = CommitOperator(
            task_id="commit",
            trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
            doc_md=docs["commit"],
            **commits,
            **common,
        )
        plan >> consume >> reassemble >> validate >> commit
        plan >> reassemble
    return dag


def _retries(dag_id: str, retries: int | None, default_args: Mapping[str, Any] | None) -> int:
    """The ingest tasks' retries: the factory's ``retries`` or ``default_args``'s (not both), else 2."""
    if retries is not None and "retries" in (default_args or {}):
        raise ValueError(f"{dag_id}: give retries as the factory's argument or in default_args, not both")
    return 2 if retries is None else retries


def wavepipe_rewind_dag(
    dag_id: str = "wavepipe_rewind",
    *,
    topic: str | None = None,
    group: str | None = None,
    settings: Mapping[str, Any] | None = None,
    kafka_conn_id: str = WavepipeHook.default_conn_name,
    spark_conn_id: str = SPARK_CONN_ID,
    start_date: datetime = START_DATE,
    tags: list[str] | None = None,
    default_args: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The rewind DAG: manual only, a dry run unless ``execute`` (with a reason); every applied
    or refused rewind is audited. Arguments as for ``wavepipe_ingest_dag``: give a pipeline's
    rewind DAG the same ``topic``, ``group`` and ``settings`` as its ingest DAG."""
    common = _pipeline(
        {"topic": topic, "group": group}, settings, kafka_conn_id=kafka_conn_id, spark_conn_id=spark_conn_id
    )
    with _dag(
        dag_id,
        topic,
        group,
        "Rewind (or fast-forward) a consumer group's offsets: dry run unless execute, audited",
        schedule=None,
        start_date=start_date,
        tags=tags,
        defaults={"retries": 0},
        default_args=default_args,
        doc_md=dag_docs.REWIND,
        run_params={
            "partitions": Param(
                "",
                type=["null", "string"],
                description="Comma-separated partitions, e.g. 0,2 (empty: all of the topic's)",
            ),
            "mode": Param(
                "earliest",
                type="string",
                enum=["earliest", "latest", "offset", "datetime", "shift", "duration"],
                description="earliest: the oldest retained record; latest: the end (skip everything); offset: this offset; "
                "datetime: the first record at or after an ISO-8601 instant (UTC if no zone); "
                "shift: N offsets from the committed one (negative: back); duration: the first record at or after now minus e.g. 2h, 90m, P1D",
            ),
            "value": Param(
                "",
                type=["null", "string"],
                description="The offset, instant, shift or duration the mode needs (empty for earliest/latest)",
            ),
            "execute": Param(
                False, type="boolean", description="Apply it. Off: a dry run that only shows the table in the task log"
            ),
            "force": Param(
                False,
                type="boolean",
                description="Accept a target outside what the topic retains, clamped to the retained range",
            ),
            "reason": Param(
                "", type=["null", "string"], description="Why (required with execute): kept in the audit record"
            ),
        },
        **dag_kwargs,
    ) as dag:
        RewindOperator(
            task_id="rewind", doc_md=dag_docs.TASKS["rewind"], **common
        )  # its arguments: the run's params, typed
    return dag


def wavepipe_maintenance_dag(
    dag_id: str = "wavepipe_maintenance",
    *,
    schedule: Any = DAILY_AT_0330,
    settings: Mapping[str, Any] | None = None,
    zorder: bool = True,
    days: int | None = None,
    kafka_conn_id: str = WavepipeHook.default_conn_name,
    spark_conn_id: str = SPARK_CONN_ID,
    start_date: datetime | None = None,
    tags: list[str] | None = None,
    default_args: Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """The maintenance DAG: optimize (compact the output tables' partitions that hold more than one
    file; ``zorder``: also sort their waveforms by source and start time; ``days``: only the date
    partitions of the last N days, None: every one) -> vacuum (delete files unused for the setting ``table_retention_hours``). Each task waits
    for a run's Spark step that holds the tables, and runs hold back meanwhile
    (docs/operations.md, "Table maintenance"). Give it the same ``settings`` (``home``) as the
    ingest DAG whose tables it keeps. With no ``start_date``, unpausing it starts no run at once:
    the first is at the schedule's next time (with one, Airflow runs its latest past time at once)."""
    if days is not None and (isinstance(days, bool) or not isinstance(days, int) or days < 0):
        raise ValueError(f"{dag_id}: days must be None (every partition) or 0 or more, got {days!r}")
    common = _pipeline({}, settings, kafka_conn_id=kafka_conn_id, spark_conn_id=spark_conn_id)
    own = {
        "description": "Output tables: compact (OPTIMIZE, clustered by source and start time) -> VACUUM old files",
        "doc_md": dag_docs.MAINTENANCE,
        "tags": tags if tags is not None else ["wavepipe"],
    }
    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date,
        catchup=False,
        max_active_runs=1,
        default_args=task_defaults(dag_id, {"retries": 1, "retry_delay": timedelta(minutes=5)}, default_args),
        **dag_options(dag_id, own, dag_kwargs),
        params={
            "tables": Param(
                "",
                type=["null", "string"],
                description="Comma-separated output tables: waveforms, quarantine, dead_letter (empty: all)",
            ),
            "zorder": Param(
                zorder,
                type="boolean",
                description="Also cluster the waveforms by source and start_time within each date partition",
            ),
            "days": Param(
                days,
                type=["null", "integer"],
                description="Only the waveforms' date partitions of the last N days (0: today; empty: every "
                "partition that holds more than one file)",
                minimum=0,
            ),
            "retention_hours": _optional(
                "number",
                "VACUUM keeps unused files this many hours (empty: the setting table_retention_hours, 168); "
                "under 168 a reader outside wavepipe on an older version can fail",
                minimum=0,
            ),
            "dry_run": Param(False, type="boolean", description="VACUUM only counts what it would delete"),
        },
    ) as dag:
        optimize = OptimizeTablesOperator(task_id="optimize", doc_md=dag_docs.TASKS["optimize"], **common)
        vacuum = VacuumTablesOperator(task_id="vacuum", doc_md=dag_docs.TASKS["vacuum"], **common)
        optimize >> vacuum
    return dag
