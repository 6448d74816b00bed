"""The DAG through real Airflow task execution (``airflow dags test``), and the demo command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import output_rows, run_cli_json
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.local.airflow import dags_test
from wavepipe.run_store import RunStore
from wavepipe.spark_launch import settings_env

pytestmark = pytest.mark.integration


def test_dag_run_ingests_then_an_idle_run_reads_nothing(settings, spark):
    ensure_topic(settings)
    sent = produce_demo(settings, count=6, target_bytes=32 * 1024)
    result = dags_test(settings, "wavepipe_ingest", capture=True)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    # a successful run logs no errors (Kafka's client noise goes to debug); its Spark steps attached
    # to the engine, whose own log is its server's
    errors = re.findall(r"^\S+ \[(?:error|critical)\s*\].*$", log, re.M)
    assert not errors, "\n".join(errors)
    assert re.search(r"attached to the Spark engine in \d+\.\d+s", log), log[-5000:]
    reports = sorted(settings.reports_dir.glob("*.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["run_id"].startswith("manual__")
    assert report["balance_errors"] == [] and report["waveforms"] == {"output_new": 6}
    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    assert all(r[1] == r[2] for r in rows)
    ends = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert committed_offsets(settings, settings.group, settings.topic, list(ends)) == ends

    dags_test(settings, "wavepipe_ingest")  # nothing new: no Spark job, no new rows, no report file
    assert sorted(settings.reports_dir.glob("*.json")) == reports, "an idle run keeps one line of history instead"
    idle = RunStore(settings).idle_runs(settings.group)
    assert idle["count"] == 1 and idle["last_run_id"].startswith("manual__") and idle["last_run_id"] != report["run_id"]
    assert output_rows(spark, settings) == rows


def test_demo_command_end_to_end(settings):
    env = {**os.environ, **settings_env(settings)}
    cmd = [sys.executable, "-m", "wavepipe.cli", "demo", "--count", "4", "--waveform-bytes", "16384"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "OK: all 4 produced waveforms" in first.stdout
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "OK: all 4 produced waveforms" in second.stdout
    assert "'output_new': 4" in second.stdout  # only the new demo data, once


#: A team's DAG file: the ingest DAG with its own task options and failure callback.
TEAM_DAG = """
import json
from datetime import timedelta
from pathlib import Path

from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag


def tell_the_team(context):
    ti, task = context["ti"], context["task"]
    record = {{"task_id": ti.task_id, "owner": task.owner, "pool": task.pool, "queue": task.queue,
              "execution_timeout_s": task.execution_timeout.total_seconds(),
              "error": str(context.get("exception"))[:300]}}
    Path({out!r}).write_text(json.dumps(record))


dag = wavepipe_ingest_dag(
    dag_id="seismic_ingest",
    default_args={{"owner": "seis", "pool": "default_pool", "queue": "seismic",
                  "execution_timeout": timedelta(minutes=10), "on_failure_callback": tell_the_team}},
)
"""


def test_a_failed_validation_fails_the_validate_task_and_commits_nothing(settings, spark, tmp_path):
    # the demo's audio is 16 kHz: quarantined, one waveform of three, more than the run may lose
    strict = settings.replace(
        validate_sample_rate_max=1000.0, validate_max_quarantined_share=0.2, validate_quarantine_judged_from=2
    )
    ensure_topic(settings)
    sent = produce_demo(settings, count=3, target_bytes=16 * 1024)
    # a team's own DAG file, with its task options and a failure callback
    called = tmp_path / "callback.json"
    dag_file = tmp_path / "seismic_ingest.py"
    dag_file.write_text(TEAM_DAG.format(out=str(called)))
    result = dags_test(strict, "seismic_ingest", capture=True, dag_file=dag_file)
    log = result.stdout + result.stderr
    assert result.returncode != 0 and "DagRun failed" in log, log[-5000:]
    # the failure reached the team's callback, on a task that carried the team's options
    record = json.loads(called.read_text())
    assert record["task_id"] == "validate" and "failed validation" in record["error"], record
    assert (record["owner"], record["pool"], record["queue"], record["execution_timeout_s"]) == (
        "seis",
        "default_pool",
        "seismic",
        600.0,
    )
    assert "failed validation (1 expectation(s))" in log, log[-5000:]
    assert "expect_column_values_to_be_between on quarantined_share: 1 rows" in log
    assert "Report: " in log and ".html" in log
    assert not (Path(settings.output_table) / "_delta_log").exists(), "nothing published"
    assert set(committed_offsets(settings, settings.group, settings.topic, [0, 1]).values()) == {None}

    # the threshold is relaxed; the CLI resumes the DAG's run (it holds the group) and commits it;
    # --json prints its report, the document the run's JSON twin holds
    relaxed = settings.replace(validate_sample_rate_max=20_000.0)
    code, report, err = run_cli_json(relaxed, "run")
    assert code == 0, err[-3000:]
    assert report["run_id"].startswith("manual__") and report["validation"]["success"] is True, report
    twin = json.loads(Path(report["report_path"]).read_text())
    assert (twin["run_id"], twin["totals"], twin["outcome"]) == (report["run_id"], report["totals"], report["outcome"])
    assert sorted(r[0] for r in output_rows(spark, settings)) == sorted(s.waveform_id for s in sent)
    code, status, err = run_cli_json(relaxed, "status")
    assert code == 0, err[-3000:]
    assert status["group"] == settings.group and [r["run_id"] for r in status["runs"]] == [report["run_id"]]
    assert {p: part["lag"] for p, part in status["partitions"].items()} == dict.fromkeys(status["partitions"], 0)
    assert status["runs"][0]["waveforms"]["new"] == 3 and status["validation_trend"][-1]["success"] is True
    code, tables, err = run_cli_json(relaxed, "table", "status")
    assert code == 0, err[-3000:]
    assert {t["table"]: t["rows"] for t in tables}["waveforms"] == 3
    # every published table is there from the group's first publish, empty until a row reaches it
    import deltalake

    assert {t["table"] for t in tables if t["version"] is not None} == {"waveforms", "quarantine", "dead_letter", "qc"}
    dead = deltalake.DeltaTable(relaxed.dead_letter_table)
    assert dead.to_pyarrow_table().num_rows == 0 and {"offset", "reason", "detail", "run_id"} <= set(
        dead.schema().to_arrow().names
    )
