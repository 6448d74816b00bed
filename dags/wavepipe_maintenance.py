"""wavepipe_maintenance: daily compaction (clustered by source and start time) and VACUUM of the output tables."""

from wavepipe.plugins.airflow_dags import wavepipe_maintenance_dag

dag = wavepipe_maintenance_dag(dag_id="wavepipe_maintenance")
