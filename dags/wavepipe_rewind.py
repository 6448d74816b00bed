"""wavepipe_rewind: move a consumer group's committed offsets (manual; a dry run unless execute; audited)."""

from wavepipe.plugins.airflow_dags import wavepipe_rewind_dag

dag = wavepipe_rewind_dag(dag_id="wavepipe_rewind")
