"""Airflow on this machine: its home under wavepipe's home, the project's DAGs, low parallelism."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from wavepipe.config import PROJECT_ROOT, Settings
from wavepipe.spark import settings_env

DAGS_FOLDER = PROJECT_ROOT / "dags"
PLUGINS_FOLDER = PROJECT_ROOT / "plugins"


def airflow_env(settings: Settings) -> dict[str, str]:
    """Environment for every local Airflow command: sqlite metadata DB in ``<home>/airflow``."""
    home = settings.airflow_home
    return {
        **os.environ,
        **settings_env(settings),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__SCHEDULER__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "PYSPARK_PYTHON": sys.executable,
    }


def _airflow(settings: Settings, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    airflow = Path(sys.executable).parent / "airflow"
    return subprocess.run([str(airflow), *args], env=airflow_env(settings), text=True,
                          capture_output=capture)


def ensure_db(settings: Settings) -> None:
    """Create or upgrade Airflow's metadata database (idempotent; quick when up to date)."""
    settings.airflow_home.mkdir(parents=True, exist_ok=True)
    marker = settings.airflow_home / ".migrated"
    version = importlib.metadata.version("apache-airflow")  # not `import airflow`: it reads ~/airflow
    if marker.exists() and marker.read_text().strip() == version:
        return
    result = _airflow(settings, "db", "migrate", capture=True)
    if result.returncode != 0:
        raise RuntimeError(f"`airflow db migrate` failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    marker.write_text(version + "\n")


def dags_test(settings: Settings, dag_id: str, conf: dict | None = None, *,
              capture: bool = False) -> subprocess.CompletedProcess:
    """Run one DAG run in this machine's Airflow (``airflow dags test``); raise if it fails, unless
    ``capture`` (then the caller reads the task logs from the result's output)."""
    ensure_db(settings)
    args = ["dags", "test", dag_id]
    if conf:
        args += ["-c", json.dumps(conf)]
    result = _airflow(settings, *args, capture=capture)
    if capture:
        return result
    if result.returncode != 0:
        raise RuntimeError(f"`airflow dags test {dag_id}` failed (exit {result.returncode}); see the task logs above")
    return result
