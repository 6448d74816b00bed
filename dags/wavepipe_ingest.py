"""wavepipe_ingest: one bounded run of the chunked-waveform ingest, on the settings' topic and group.

plan -> consume -> reassemble (Spark) -> validate (Great Expectations, then publish) -> commit; see
``wavepipe.plugins.airflow_dags.wavepipe_ingest_dag`` to run other pipelines beside it.
"""

from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag

dag = wavepipe_ingest_dag(dag_id="wavepipe_ingest")
