"""The cluster path of Spark: a real standalone master and worker on loopback (from the installed
pyspark), the DAG's Spark apps submitted there through the Airflow connection ``wavepipe_spark``,
and the same data reassembled in local mode by the CLI: the three tables must hold the same rows.
The DAG run also reads both partitions in one mapped consume task (``consume_tasks=1``).

Alone: ``.venv/bin/pytest tests/integration/test_spark_cluster.py -v`` (about 3-4 minutes here).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers import produce_in_order, run_cli, waveform_records, with_headers
from wavepipe import processes
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.local.airflow import dags_test
from wavepipe.local.kafka import free_port
from wavepipe.local.spark_cluster import LocalSparkCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    cluster = LocalSparkCluster(
        tmp_path_factory.mktemp("spark-standalone"), port=free_port(), workers=1, worker_cores=2, worker_memory="1g"
    )
    cluster.up()
    yield cluster
    pids = cluster.pids()
    assert len(pids) == 2  # the master and its worker lived through the test
    cluster.down()
    assert not [pid for pid in pids if _running(pid)], "down() left a Spark daemon running"


def _running(pid: int) -> bool:
    """Alive and not a zombie (this process started the daemons, and reaps them only later)."""
    return processes.alive(pid)


def _master_status(cluster: LocalSparkCluster) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster._state()['ui_port']}/json/", timeout=5) as resp:
        return json.load(resp)


def _table_rows(spark, path) -> list[tuple]:
    """A table's rows without what differs between two runs by design (the run id, when a record was
    quarantined, how long after its end a waveform was written), payloads as sha256."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(path))
    cols = [
        F.sha2(F.col(c), 256).alias(c) if t == "binary" else F.col(c)
        for c, t in df.dtypes
        if c not in ("run_id", "quarantined_at", "latency_s")
    ]
    return sorted(tuple(r) for r in df.select(*cols).collect())


def test_reassembly_on_a_standalone_cluster_equals_local_mode(settings, spark, spark_cluster, tmp_path, monkeypatch):
    ensure_topic(settings)
    sent = produce_demo(settings, count=6, target_bytes=32 * 1024)  # keyed: partitions by their ids' hash
    good, _ = waveform_records("wf-good", 2, seed=8)
    produce_in_order(settings, good, partition=0)  # so both partitions have records (all 6 in partition 1: 1 in 64)
    broken, _ = waveform_records("wf-bad-checksum", 3, seed=7)
    broken[1] = (broken[1][0], broken[1][1], b"\x00" * len(broken[1][2]))  # payload no longer matches
    produce_in_order(
        settings, [*broken, (b"junk", [], b"not a chunk"), with_headers(broken, 0, **{"wp-version": b"9"})], partition=1
    )

    local = settings.replace(home=tmp_path / "local", group=f"{settings.group}-local")
    code, out = run_cli(local, "run")
    assert code == 0, out[-4000:]

    # and both partitions read by one mapped consume task (a partition group), two processes in it
    on_cluster = settings.replace(
        home=tmp_path / "cluster", group=f"{settings.group}-cluster", consume_tasks=1, consume_parallelism=2
    )
    before = {app["id"] for app in _master_status(spark_cluster)["completedapps"]}
    monkeypatch.setenv(
        "AIRFLOW_CONN_WAVEPIPE_SPARK",
        json.dumps(
            {
                "conn_type": "spark",
                "host": "spark://127.0.0.1",
                "port": spark_cluster.port,
                "extra": {"conf": {"spark.executor.memory": "1g", "spark.cores.max": "2"}},
            }
        ),
    )
    result = dags_test(on_cluster, "wavepipe_ingest", capture=True)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-6000:]
    assert f"Spark from Airflow connection 'wavepipe_spark': {spark_cluster.master_url}" in log, log[-6000:]
    assert "1 consume tasks (consume_tasks=1): partitions [[0, 1]]" in log and "reading partitions [0, 1]" in log
    # the DAG's two Spark apps (reassemble, validate) ran on the cluster, with executors on its worker
    apps = [app for app in _master_status(spark_cluster)["completedapps"] if app["id"] not in before]
    assert len(apps) == 2, apps
    assert all(app["state"] == "FINISHED" for app in apps), apps
    work_dirs = list((spark_cluster.folder / "worker-1").glob("app-*/*/stderr"))
    assert len(work_dirs) >= 2, "no executor ran on the standalone worker"

    for table in ("output_table", "quarantine_table", "dead_letter_table"):
        local_rows = _table_rows(spark, getattr(local, table))
        assert local_rows, f"{table}: the local run wrote nothing to compare"
        assert _table_rows(spark, getattr(on_cluster, table)) == local_rows, table
    assert len(_table_rows(spark, on_cluster.output_table)) == len(sent) + 1

    [report] = [json.loads(p.read_text()) for p in on_cluster.reports_dir.glob("*.json")]
    assert report["balance_errors"] == [] and report["waveforms"]["output_new"] == len(sent) + 1
    ends = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert committed_offsets(on_cluster, on_cluster.group, on_cluster.topic, list(ends)) == ends
