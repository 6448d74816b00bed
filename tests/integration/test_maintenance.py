"""Table maintenance on the real broker, Spark engine and Airflow: compaction and VACUUM (with no
retention at all) in another process while runs publish, then the maintenance DAG."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import (
    assert_delta_rs_reads_as_spark,
    assert_output_unique,
    output_rows,
    progress,
    published_tables,
    start_python,
)
from wavepipe import maintenance
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.runfiles import Step
from wavepipe.local.airflow import dags_test
from wavepipe.pipeline import run_once
from wavepipe.run_store import RunStore

pytestmark = pytest.mark.integration

#: At most this many runs wait for the maintenance loop's two rounds.
MAX_RUNS = 15

#: Maintenance rounds in a loop until a file appears: optimize (sorted) then vacuum, retention 0.
LOOP = """
import pathlib, sys, time
from wavepipe import maintenance
from wavepipe.contracts.config import load_settings

settings, stop, rounds = load_settings(), pathlib.Path(sys.argv[1]), 0
print("home", settings.home, flush=True)
while not stop.exists():
    if not (pathlib.Path(settings.output_table) / "_delta_log").is_dir():
        time.sleep(0.5)  # no run has published yet
        continue
    for r in maintenance.optimize(settings, zorder=True):
        print("optimize", r.get("table"), r.get("files_removed", r.get("skipped")), flush=True)
    for r in maintenance.vacuum(settings, retention_hours=0):
        print("vacuum", r.get("table"), r.get("files_deleted", r.get("skipped")), flush=True)
    rounds += 1
    (stop.parent / "maintenance-rounds").write_text(str(rounds))
    time.sleep(2)
print("rounds", rounds, flush=True)
"""


def test_compaction_and_vacuum_while_runs_publish_lose_and_double_nothing(settings, spark):
    ensure_topic(settings)
    s = settings.replace(new_group_start="earliest")
    stop = settings.home / "stop-maintenance"
    proc = start_python(
        s, LOOP.replace("sys.argv[1]", repr(str(stop))), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    rounds_file = settings.home / "maintenance-rounds"
    sent, reports = [], []
    try:
        # small runs, each publishing a few files to the tables: at least five, and on until the
        # maintenance loop has done two rounds beside them (a slow machine needs more runs)
        for batch in range(MAX_RUNS):
            if batch >= 5 and rounds_file.exists() and int(rounds_file.read_text() or 0) >= 2:
                break
            sent += produce_demo(s, count=3, target_bytes=24 * 1024, batch=f"maint-{batch}")
            reports.append(run_once(s))
            progress(f"run {batch + 1} published {reports[-1]['waveforms']}")
            assert reports[-1]["balance_errors"] == [], reports[-1]
            assert reports[-1]["waveforms"]["output_new"] == 3, reports[-1]["waveforms"]
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-5000:]
    rounds = int(re.search(r"^rounds (\d+)$", out, re.M).group(1))
    compacted = [int(n) for n in re.findall(r"^optimize waveforms (\d+)$", out, re.M)]
    vacuumed = [int(n) for n in re.findall(r"^vacuum waveforms (\d+)$", out, re.M)]
    progress(f"maintenance beside the runs: {rounds} rounds, {sum(compacted)} files compacted, {sum(vacuumed)} deleted")
    # the loop ran beside the runs, and really rewrote and deleted files of the published table
    assert f"home {settings.home}\n" in out, out[:3000]
    assert rounds >= 2 and sum(compacted) > 0 and sum(vacuumed) > 0, out[-3000:]

    rows = output_rows(spark, settings)  # every waveform once, bit-exact, whatever was rewritten
    assert sorted((r[0], r[1]) for r in rows) == sorted((w.waveform_id, w.checksum) for w in sent)
    assert all(r[1] == r[2] for r in rows)
    assert_output_unique(spark, settings)
    status = {t.table: t for t in maintenance.status(settings)}
    assert status["waveforms"].rows == len(sent)

    # one more run after the loop's last round: today's partition holds more than one file again
    sent += produce_demo(s, count=3, target_bytes=24 * 1024, batch="maint-last")
    assert run_once(s)["waveforms"]["output_new"] == 3
    rows = output_rows(spark, settings)
    assert maintenance.status(settings, ["waveforms"])[0].partitions_to_compact >= 1

    # the maintenance DAG through Airflow's task execution: one file per partition, nothing unused
    result = dags_test(settings, "wavepipe_maintenance", {"days": None, "retention_hours": 0}, capture=True)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-5000:]
    assert re.search(r"optimize waveforms: \d+ files -> \d+", log) and "vacuum waveforms: deleted" in log, log[-3000:]
    after = maintenance.status(settings, ["waveforms"])[0]
    assert after.files_per_partition_max == 1 and after.unreferenced_files == 0, after
    assert after.rows == len(sent) and after.last_optimize and after.last_vacuum
    assert output_rows(spark, settings) == rows
    assert assert_delta_rs_reads_as_spark(spark, settings.output_table) == len(sent)  # the compacted table
    # a second pass finds each partition in one file: it says so and rewrites nothing
    before_again = after
    again = dags_test(settings, "wavepipe_maintenance", {"retention_hours": 0}, capture=True)
    assert again.returncode == 0 and "each holds one file, nothing to compact" in again.stdout + again.stderr
    after = maintenance.status(settings, ["waveforms"])[0]  # its vacuum commits; no compaction did
    assert after.last_optimize == before_again.last_optimize and after.files == before_again.files

    # a typo in the trigger's conf refuses the DAG's first task before anything is touched: it
    # ends skipped, not failed, and is not tried again
    bad = dags_test(settings, "wavepipe_maintenance", {"tabels": "waveforms"}, capture=True)
    log = bad.stdout + bad.stderr
    assert "did you mean 'tables'" in log and "new_state=skipped" in log, log[-3000:]
    assert "new_state=failed" not in log and "up_for_retry" not in log.lower(), log[-3000:]
    assert maintenance.status(settings, ["waveforms"])[0].version == after.version


def test_runs_compact_the_small_files_they_add_and_lose_nothing(settings, spark):
    """With ``compact_after_files`` 3, the commit of the run that leaves a partition with three
    small files rewrites them into one (delta-rs, no Spark job): every waveform once and bit-exact
    after it, read alike by Spark and delta-rs, and the group's transaction still refuses a second
    publish of a run it holds."""
    from wavepipe import delta_txn
    from wavepipe.spark_apps.tables import delta_log

    ensure_topic(settings)
    s = settings.replace(new_group_start="earliest", compact_after_files=3)
    sent, reports = [], []
    for batch in range(4):
        sent += produce_demo(s, count=2, target_bytes=16 * 1024, batch=f"compact-{batch}")
        reports.append(run_once(s))
        assert reports[-1]["waveforms"]["output_new"] == 2, reports[-1]["waveforms"]
    compacted = [{d["table"] for d in r.get("compacted", [])} for r in reports]
    progress(f"tables compacted by each run's commit: {compacted}")
    assert compacted[:2] == [set(), set()] and "waveforms" in compacted[2], compacted
    for d in reports[2]["compacted"]:
        assert d["files_removed"] >= 3 and d["files_added"] >= 1, d
    assert reports[2]["timings_s"]["compact"] > 0
    saved = RunStore(s).load_step(reports[2]["run_id"], Step.REPORT)
    assert saved["compacted"] == reports[2]["compacted"]  # in the run's own record too
    for path in published_tables(s).values():
        assert maintenance.crowded_partitions(delta_log(path), 3) == [], path

    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((w.waveform_id, w.checksum) for w in sent)
    assert all(r[1] == r[2] for r in rows)
    assert_output_unique(spark, settings)
    assert assert_delta_rs_reads_as_spark(spark, settings.output_table) == len(sent)
    assert assert_delta_rs_reads_as_spark(spark, settings.qc_table) > 0
    # the rewrite kept the group's Delta transaction: the last run's version is still there
    app = delta_txn.app_id(s.group, s.topic)
    last = RunStore(s).load_plan(reports[-1]["run_id"])
    assert last.txn_version > 0 and delta_txn.txn_version(settings.output_table, app) == last.txn_version
    assert delta_txn.published_runs(settings.output_table, app)[0]["run_id"] == reports[-1]["run_id"]
