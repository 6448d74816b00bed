"""The DAG through real Airflow task execution (``airflow dags test``), and the demo command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import output_rows, run_cli
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.runfiles import RunStore
from wavepipe.local.airflow import dags_test
from wavepipe.spark import settings_env

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


def test_a_failed_validation_fails_the_validate_task_and_commits_nothing(settings, spark):
    # the demo's audio is 16 kHz: quarantined, one waveform of three, more than the run may lose
    strict = settings.replace(
        validate_sample_rate_max=1000.0, validate_max_quarantined_share=0.2, validate_quarantine_judged_from=2
    )
    ensure_topic(settings)
    sent = produce_demo(settings, count=3, target_bytes=16 * 1024)
    result = dags_test(strict, "wavepipe_ingest", capture=True)
    log = result.stdout + result.stderr
    assert result.returncode != 0 and "DagRun failed" in log, log[-5000:]
    assert "failed validation (1 expectation(s))" in log, log[-5000:]
    assert "expect_column_values_to_be_between on quarantined_share: 1 rows" in log
    assert "Report: " in log and ".html" in log
    assert not (Path(settings.output_table) / "_delta_log").exists(), "nothing published"
    assert set(committed_offsets(settings, settings.group, settings.topic, [0, 1]).values()) == {None}

    # the threshold is relaxed; the CLI resumes the DAG's run (it holds the group) and commits it
    code, out = run_cli(settings.replace(validate_sample_rate_max=20_000.0), "run")
    assert code == 0, out[-3000:]
    assert "manual__" in out and "validation: passed" in out
    assert sorted(r[0] for r in output_rows(spark, settings)) == sorted(s.waveform_id for s in sent)
