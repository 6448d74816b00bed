"""wavepipe_ingest: one bounded run of the chunked-waveform ingest (wiring only).

plan -> consume (one mapped task per partition group) -> reassemble (Spark) -> validate (Great Expectations,
then publish) -> commit. Scheduled and manual runs continue from the group's committed offsets;
backfill runs (``airflow backfill create``) reprocess their data interval and replace its output.
"""

from datetime import datetime, timedelta

from airflow.sdk import DAG, DeltaDataIntervalTimetable, Param, TriggerRule

from wavepipe.airflow.operators import (
    CommitOperator, ConsumeOperator, PlanOperator, ReassembleOperator, ValidateOperator,
)

with DAG(
    dag_id="wavepipe_ingest",
    description="Bounded run: frozen offset ranges -> staged chunks -> reassembled waveforms -> validated -> committed offsets",
    # data intervals (Airflow 3's plain timedelta schedule has none): a backfill run's window
    schedule=DeltaDataIntervalTimetable(timedelta(minutes=15)),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=15)},
    params={
        "topic": Param(None, type=["null", "string"], description="Topic to read (default: wavepipe config `topic`)"),
        "group": Param(None, type=["null", "string"], description="Consumer group whose offsets are the progress (default: config `group`)"),
        "max_records": Param(None, type=["null", "integer"], minimum=1, description="Cap: records per partition in this run"),
        "max_bytes": Param(None, type=["null", "integer"], minimum=1, description="Cap: payload bytes per partition in this run"),
        "skip_lost_offsets": Param(False, type="boolean", description="If the group is behind what the topic still retains, go on from the earliest retained offsets and record the lost range in the report (default: fail and name it)"),
        "window_start": Param(None, type=["null", "string"], format="date-time", description="Reprocess a time window instead of continuing from the group's offsets: its start (ISO-8601). The window's output is replaced and no offset is committed. Backfill runs use their data interval without this."),
        "window_end": Param(None, type=["null", "string"], format="date-time", description="End (exclusive) of the time window to reprocess; give it with window_start"),
        "new_group_start": Param(None, type=["null", "string"], description="Only for a group with no committed offsets on the topic: where it starts (earliest, latest or an ISO-8601 instant). Without it (or the setting new_group_start) such a run is refused, so a mistyped group reads nothing"),
    },
    tags=["wavepipe"],
) as dag:
    plan = PlanOperator(
        task_id="plan",
        topic="{{ params.topic or '' }}",
        group="{{ params.group or '' }}",
        max_records="{{ params.max_records or '' }}",
        max_bytes="{{ params.max_bytes or '' }}",
        skip_lost_offsets="{{ params.skip_lost_offsets }}",
        window_start="{{ params.window_start or '' }}",
        window_end="{{ params.window_end or '' }}",
        new_group_start="{{ params.new_group_start or '' }}",
    )
    consume = ConsumeOperator.partial(
        task_id="consume", map_index_template="{{ task.partitions_label }}",
    ).expand(partitions=plan.output)
    reassemble = ReassembleOperator(task_id="reassemble", trigger_rule=TriggerRule.NONE_FAILED)
    validate = ValidateOperator(task_id="validate", trigger_rule=TriggerRule.NONE_FAILED)
    commit = CommitOperator(task_id="commit", trigger_rule=TriggerRule.NONE_FAILED)
    plan >> consume >> reassemble >> validate >> commit
