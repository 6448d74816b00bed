"""wavepipe_rewind: move a consumer group's committed offsets (wiring only).

Manual only. A dry run by default: the task log shows, per partition, the committed offset, the
target and the lag before and after. With execute on (and a reason) it applies the rewind, unless
the group has live members or an active wavepipe run; every applied or refused rewind is audited.
"""

from datetime import datetime

from airflow.sdk import DAG, Param

from wavepipe.airflow.rewind import RewindOperator

with DAG(
    dag_id="wavepipe_rewind",
    description="Rewind (or fast-forward) a consumer group's offsets: dry run unless execute, audited",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 0},
    params={
        "topic": Param(None, type=["null", "string"], description="Topic (default: wavepipe config `topic`)"),
        "group": Param(None, type=["null", "string"], description="Consumer group to move (default: config `group`)"),
        "partitions": Param("", type=["null", "string"], description="Comma-separated partitions, e.g. 0,2 (empty: all of the topic's)"),
        "mode": Param("earliest", type="string", enum=["earliest", "latest", "offset", "datetime", "shift", "duration"],
                      description="earliest: the oldest retained record; latest: the end (skip everything); offset: this offset; "
                                  "datetime: the first record at or after an ISO-8601 instant (UTC if no zone); "
                                  "shift: N offsets from the committed one (negative: back); duration: the first record at or after now minus e.g. 2h, 90m, P1D"),
        "value": Param("", type=["null", "string"], description="The offset, instant, shift or duration the mode needs (empty for earliest/latest)"),
        "execute": Param(False, type="boolean", description="Apply it. Off: a dry run that only shows the table in the task log"),
        "force": Param(False, type="boolean", description="Accept a target outside what the topic retains, clamped to the retained range"),
        "reason": Param("", type=["null", "string"], description="Why (required with execute): kept in the audit record"),
    },
    tags=["wavepipe"],
) as dag:
    RewindOperator(
        task_id="rewind",
        topic="{{ params.topic or '' }}",
        group="{{ params.group or '' }}",
        partitions="{{ params.partitions or '' }}",
        mode="{{ params.mode }}",
        value="{{ params.value or '' }}",
        apply="{{ params.execute }}",
        force="{{ params.force }}",
        reason="{{ params.reason or '' }}",
    )
