"""wavepipe_maintenance: daily compaction (sorted by start time) and VACUUM of the output tables."""

from wavepipe.plugins.airflow_dags import wavepipe_maintenance_dag

dag = wavepipe_maintenance_dag(dag_id="wavepipe_maintenance")
