"""wavepipe_quality_alert: an alert DAG, scheduled on the quality asset of the waveforms table.

It runs only after an ingest run published waveforms that broke a quality rule (a dead channel,
clipping, a gap, a late station: docs/quality.md) and says per run what broke, the most flagged
sources first: a template for paging the on-call; here the lines are warnings in the task's log.
Paused until you unpause it.
"""

from airflow.sdk import dag, task

from wavepipe.plugins import downstream
from wavepipe.plugins.airflow_dags import START_DATE
from wavepipe.plugins.assets import quality_asset


@dag(
    schedule=[quality_asset()],
    start_date=START_DATE,
    catchup=False,
    tags=["wavepipe", "downstream", "quality"],
    doc_md=__doc__,
)
def wavepipe_quality_alert():
    @task
    def alert(triggering_asset_events=None) -> list[str]:
        """One line per run whose waveforms broke quality rules: the rules, the counts, the sources."""
        return downstream.alert(triggering_asset_events)

    alert()


wavepipe_quality_alert()
