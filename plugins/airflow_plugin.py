"""The ``wavepipe`` Airflow plugin (entry point ``airflow.plugins``): the timetable of the ingest
DAGs, which Airflow's scheduler and API server must find by name to read a DAG that uses it."""

from __future__ import annotations

from typing import ClassVar

from airflow.plugins_manager import AirflowPlugin

from wavepipe.plugins.schedules import BackfillWindows


class WavepipePlugin(AirflowPlugin):
    name = "wavepipe"
    timetables: ClassVar[list] = [BackfillWindows]
