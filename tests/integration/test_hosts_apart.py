"""Nothing needs a shared disk: the object store, the broker, the Spark engine and the run's
processes each on a host of their own (``tests/hosts.py``: a network namespace joined to one LAN
by a veth pair, mount and UTS namespaces with a private name, /tmp and folder, the code read-only).
The tables, the runs' staging and the run state are in the store. A bounded run killed on one
worker is resumed by another worker (once the dead holder's lease on it has run out), and a window
run passes end to end; the test reads the result back from the bucket (delta-rs) and through the
engine (Spark), and the offsets from Kafka, as a host of the LAN."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.hosts import Lan, wait_for_port, why_not

REASON = why_not()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

CODE = Path(__file__).resolve().parents[2]
WAVEPIPE = str(Path(sys.executable).with_name("wavepipe"))
S3_PORT, KAFKA_PORT, CONNECT_PORT = 8333, 9092, 15002
#: the run state's leases here: a retry on another host waits this long for a killed holder's
LEASE_S = 5.0


@pytest.fixture(scope="module")
def lan(tmp_path_factory):
    net = Lan(tmp_path_factory.mktemp("hosts"), CODE)
    try:
        yield net
    finally:
        net.close()


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture(scope="module")
def apart(lan, tmp_path_factory):
    """The four hosts with their servers running: the environment of a wavepipe process on a
    host (``home`` is each host's own ``/srv/wavepipe``), and the test's own settings."""
    from wavepipe.contracts.config import load_settings
    from wavepipe.spark_launch import settings_env

    jars = load_settings().jars_dir
    addresses = {name: lan.add(name) for name in ("store", "kafka", "spark", "worker", "worker2")}
    started = (
        f"from pathlib import Path; from wavepipe.local.objectstore import LocalObjectStore; "
        f"print(LocalObjectStore(Path('/srv/objectstore'), {S3_PORT}, Path({str(jars.parent / 'go')!r}), "
        f"host={addresses['store']!r}).up())"
    )
    code, out = lan.run("store", _python(started), {})
    assert code == 0, out
    keys = json.loads((lan.root / "store" / "objectstore" / "credentials.json").read_text())
    started = (
        f"from pathlib import Path; from wavepipe.local.kafka import LocalKafka; "
        f"print(LocalKafka(Path('/srv/kafka'), {addresses['kafka']!r}, {KAFKA_PORT}, Path({str(jars)!r}), 1).up())"
    )
    code, out = lan.run("kafka", _python(started), {})
    assert code == 0, out
    settings = {
        "bootstrap_servers": f"{addresses['kafka']}:{KAFKA_PORT}",
        "spark_remote": f"sc://{addresses['spark']}:{CONNECT_PORT}",
        "spark_master": "local[2]",
        "tables_uri": "s3://wavepipe/lake",
        "staging_uri": "s3://wavepipe/staging",
        "state_uri": "s3://wavepipe/state",
        "state_lease_s": LEASE_S,
        "s3_endpoint": f"http://{addresses['store']}:{S3_PORT}",
        "s3_region": "us-east-1",
        "s3_access_key": keys["access_key"],
        "s3_secret_key": keys["secret_key"],
        "topic": "waveforms-apart",
        "group": "apart",
        "new_group_start": "earliest",
    }
    on_host = settings_env(load_settings(home=Path("/srv/wavepipe"), **settings))
    engine = lan.start(
        "spark",
        [WAVEPIPE, "spark", "serve", "--host", addresses["spark"], "--port", str(CONNECT_PORT)],
        {**on_host, "WAVEPIPE_SPARK_REMOTE": "", "SPARK_LOCAL_IP": "127.0.0.1"},
        tmp_path_factory.mktemp("engine-log") / "engine.log",
    )
    wait_for_port(addresses["spark"], CONNECT_PORT, 240, alive=lambda: engine.poll() is None)
    observer = load_settings(home=tmp_path_factory.mktemp("observer"), **settings)
    yield on_host, observer


def test_a_run_retried_after_a_killed_reader_and_a_window_run_need_no_shared_disk(lan, apart):
    from pyspark.sql import SparkSession

    from tests.helpers import assert_delta_rs_reads_as_spark, produce_in_order, quarter_hour_ago, waveform_records
    from wavepipe import storage
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.run_store import RunStore

    on_host, observer = apart
    storage.configure(observer)
    ensure_topic(observer, partitions=1)
    t0 = quarter_hour_ago(2)
    sent = {}
    for i in range(3):
        records, checksum = waveform_records(f"w{i}", 4, seed=i)
        produce_in_order(observer, records, when=t0 + timedelta(minutes=1 + i))
        sent[f"w{i}"] = checksum

    code, out = lan.run("worker", [WAVEPIPE, "run"], {**on_host, "WAVEPIPE_FAILPOINTS": "consume.record@6=kill"})
    assert code in (-9, 137), out[-3000:]  # the failpoint killed it
    assert committed_offsets(observer, observer.group, observer.topic, [0]) == {0: None}
    state = RunStore(observer)
    killed = state.active_run(observer.group)
    assert killed is not None and state.load_plan(killed) is not None, "the plan and the claim are in the bucket"
    code, out = lan.run("worker2", [WAVEPIPE, "run"], on_host)  # another host: the lease is live still
    assert code != 0 and "lease good for" in out and "wp-worker" in out, out[-3000:]
    time.sleep(LEASE_S)
    code, out = lan.run("worker2", [WAVEPIPE, "run"], on_host)
    assert code == 0 and killed in out, out[-3000:]
    assert committed_offsets(observer, observer.group, observer.topic, [0]) == {0: 12}
    [report] = state.reports()
    assert report["run_id"] == killed and report["waveforms"] == {"output_new": 3}, "resumed, counted once"

    spark = SparkSession.builder.remote(observer.spark_remote).create()
    try:
        assert assert_delta_rs_reads_as_spark(spark, observer.output_table) == 3
        table = storage.delta_table(observer.output_table).to_pyarrow_table(columns=["waveform_id", "checksum"])
        assert dict(zip(*table.to_pydict().values(), strict=True)) == sent
        window = [t0.isoformat(), (t0 + timedelta(minutes=15)).isoformat()]
        code, out = lan.run("worker", [WAVEPIPE, "run", "--window", *window], on_host)
        assert code == 0 and "window" in out, out[-3000:]
        assert assert_delta_rs_reads_as_spark(spark, observer.output_table) == 3
    finally:
        spark.stop()
    assert committed_offsets(observer, observer.group, observer.topic, [0]) == {0: 12}, "a window run commits none"

    for host in ("worker", "worker2", "spark"):
        assert not (lan.root / host / "wavepipe" / "runs").exists(), f"no run state on {host}'s disk"
        assert not (lan.root / host / "wavepipe" / "groups").exists(), f"no group claim on {host}'s disk"
        assert not list((lan.root / host).rglob("*.parquet")), f"nothing staged or published on {host}'s disk"
    staged = storage.open_store(observer.staging_location).list_keys()
    assert staged == [], f"committed runs leave no staging behind: {staged[:5]}"
