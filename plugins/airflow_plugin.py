"""The ``wavepipe`` Airflow plugin (entry point ``airflow.plugins``): the timetable of the ingest
DAGs, which Airflow's scheduler and API server must find by name to read a DAG that uses it; the
run pages and Data Docs app the API server serves (``report_app``), and the task links to them."""

from __future__ import annotations

from typing import ClassVar

from airflow.plugins_manager import AirflowPlugin

from wavepipe.plugins.links import DataDocsLink, RunPageLink
from wavepipe.plugins.report_app import LazyApps
from wavepipe.plugins.schedules import BackfillWindows


class WavepipePlugin(AirflowPlugin):
    name = "wavepipe"
    timetables: ClassVar[list] = [BackfillWindows]
    operator_extra_links: ClassVar[list] = [RunPageLink(), DataDocsLink()]
    fastapi_apps = LazyApps()
