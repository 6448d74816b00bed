"""wavepipe_waveforms_summary: a downstream DAG, scheduled on the ``waveforms`` table's asset.

It runs after each ingest run that published waveforms (never for a run that read nothing) and
summarizes what each of those runs wrote, read back with delta-rs at the version its event names:
a template for features, QC plots or a model fed by new waveforms. Paused until you unpause it.
"""

from airflow.sdk import dag, task

from wavepipe.contracts.config import load_settings
from wavepipe.plugins import downstream
from wavepipe.plugins.airflow_dags import START_DATE
from wavepipe.plugins.assets import table_assets


@dag(
    schedule=[table_assets()["waveforms"]],
    start_date=START_DATE,
    catchup=False,
    tags=["wavepipe", "downstream"],
    doc_md=__doc__,
)
def wavepipe_waveforms_summary():
    @task
    def summarize(triggering_asset_events=None) -> list[dict]:
        """Per publishing run that started this one: its rows (announced and read back), sources
        and seconds of signal."""
        return downstream.summarize(load_settings(), triggering_asset_events)

    summarize()


wavepipe_waveforms_summary()
