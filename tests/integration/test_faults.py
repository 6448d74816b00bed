"""Faults on the real broker and a real Spark: killed steps, a restarted broker, racing runs,
retention, open transactions. After each, the output and the committed offsets are correct."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import deltalake
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import OffsetSpec

from tests.helpers import (
    assert_accounted,
    assert_delta_rs_reads_as_spark,
    output_rows,
    produce_in_order,
    quarantine_reasons,
    run_cli,
    start_cli,
    start_python,
    waveform_records,
    when_stopped,
)
from wavepipe import maintenance, pipeline
from wavepipe.consumers.kafka_admin import admin_client, committed_offsets, ensure_topic, list_offsets
from wavepipe.consumers.planner import RetentionGapError
from wavepipe.contracts.config import load_settings
from wavepipe.delta_txn import app_id
from wavepipe.local.engine_server import LocalEngine
from wavepipe.run_store import RunStore
from wavepipe.spark_apps.tables import delta_version

pytestmark = pytest.mark.integration


def _produce(
    settings, count: int, partitions=(0,), chunks: int = 4, prefix: str = "w", chunk_size: int = 256
) -> dict[str, str]:
    """``count`` waveforms of ``chunks`` chunks, round-robin over ``partitions``; id -> checksum."""
    expected = {}
    for i in range(count):
        records, digest = waveform_records(f"{prefix}{i:03d}", chunks, chunk_size=chunk_size, seed=i)
        produce_in_order(settings, records, partition=partitions[i % len(partitions)])
        expected[records[0][0].decode()] = digest
    return expected


def _assert_output(spark, settings, expected: dict[str, str]) -> None:
    rows = output_rows(spark, settings)
    assert {r[0]: r[1] for r in rows} == expected
    assert all(r[1] == r[2] for r in rows), "payloads must be bit-exact"


def _ends(settings, partitions) -> dict[int, int]:
    return list_offsets(settings, settings.topic, partitions, OffsetSpec.latest())


def _report(settings, run_id: str) -> dict:
    return json.loads((settings.reports_dir / f"{run_id}.json").read_text())


def test_consume_killed_mid_range_then_retried(settings, spark):
    ensure_topic(settings, partitions=1)
    expected = _produce(settings, 12)
    pipeline.plan_step(settings, "kill-consume")
    child = start_python(
        settings,
        "from wavepipe import pipeline; from wavepipe.contracts.config import load_settings; "
        "pipeline.consume_step(load_settings(), 'kill-consume', 0)",
        failpoints="consume.record@20=kill",
    )
    assert child.wait(120) == -signal.SIGKILL
    staging = Path(RunStore(settings).staging_dir("kill-consume"))
    for kind in ("chunks", "digests"):  # 5 of the 12 waveforms were complete: the digest file was open too
        files = [p.name for p in (staging / kind).iterdir()]
        assert [f for f in files if f.endswith(".parquet")] == [], f"no half-staged {kind} file under its final name"
        assert any(f.endswith(".tmp") for f in files), f"the reader was killed while staging {kind}"

    read = pipeline.consume_step(settings, "kill-consume", 0)  # the retry
    assert read["records"] == 48
    reassembled = pipeline.reassemble_step(settings, "kill-consume", validate=True)
    # the retry's digests, not the killed reader's leftovers: every waveform verified as it was read
    assert reassembled.verified == {"while_read": 12, "from_one_staged_file": 0, "by_a_shuffle": 0}
    report = pipeline.commit_step(settings, "kill-consume")
    assert_accounted(spark, settings, report)
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 48}


def test_a_run_whose_reader_threads_are_killed_mid_range_resumes_exactly_once(settings, spark):
    """A small plan is read by threads of the run's process (``consume_in_process_max_records``):
    a reader's kill takes the whole run; the plain retry resumes the same plan and ends exactly once."""
    ensure_topic(settings, partitions=2)
    expected = _produce(settings, 8, partitions=(0, 1))
    code, out = run_cli(
        settings, "run", "--run-id", "threads", "--new-group-start", "earliest", failpoints="consume.record@10=kill"
    )  # each partition's 10th record: mid-range
    assert code == -signal.SIGKILL, out  # a reader process's kill would fail the run with exit 1 instead
    staging = Path(RunStore(settings).staging_dir("threads")) / "chunks"
    assert any(p.name.endswith(".tmp") for p in staging.iterdir()), "killed while a reader thread staged"
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}

    code, out = run_cli(settings, "run")  # resumes run "threads": its plan, read again
    assert code == 0, out
    report = _report(settings, "threads")
    assert report["totals"]["output"] == 32
    assert_accounted(spark, settings, report)
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 16, 1: 16}


def test_spark_engine_killed_mid_write_leaves_nothing_visible_then_retried(settings, own_engine, spark, monkeypatch):
    # the write is killed on this test's own engine; the retry runs on the shared one (a run's
    # state is in its home, not in an engine), as it would on the killed one restarted
    killed = own_engine.replace(output_batch_bytes=2 * 1024 * 1024)  # a waveform per batch: five a task
    ensure_topic(settings)
    expected = _produce(settings, 10, partitions=(0, 1), chunks=32, chunk_size=64 * 1024)  # 2 MiB each
    plan = pipeline.plan_step(settings, "kill-spark")
    for p in pipeline.partitions_to_read(plan):
        pipeline.consume_step(settings, "kill-spark", p)
    pipeline.reassemble_step(settings, "kill-spark")  # metadata only: the bytes are written at publish
    # a Python worker pauses after its second batch, then the whole engine is SIGKILLed. (The second:
    # the tail of a batch stays in the worker's socket buffer until the next one pushes it out.)
    LocalEngine(killed).up()  # warm first: the time below is the step's, not the engine's start
    monkeypatch.setenv("WAVEPIPE_FAILPOINTS", "assemble.batch@2=sleep:4+kill-app")
    began = time.monotonic()
    with pytest.raises(Exception) as failed:
        pipeline.validate_step(killed, "kill-spark")
    monkeypatch.delenv("WAVEPIPE_FAILPOINTS")
    assert time.monotonic() - began < 120, "the step fails soon after its server died, it does not hang"
    assert LocalEngine(killed).pid() is None, failed.value
    written = list(Path(settings.output_table).rglob("*.parquet"))
    assert written, "the engine was killed while it wrote the output's data files"
    assert delta_version(settings.output_table) is None, "but none of them is committed, so none is visible"

    pipeline.validate_step(settings, "kill-spark")
    report = pipeline.commit_step(settings, "kill-spark")
    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": 10}
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 160, 1: 160}


@pytest.mark.parametrize("failpoint", ["commit.before_offsets=kill", "publish.after_write=kill-app"])
def test_crash_after_the_output_is_durable_then_a_rerun_adds_nothing_twice(request, settings, spark, failpoint):
    # kill-app kills the engine of the crashing run: this test's own; the rerun is on the shared one
    crashing = request.getfixturevalue("own_engine") if "kill-app" in failpoint else settings
    ensure_topic(settings)
    expected = _produce(settings, 6, partitions=(0, 1))
    crashed = start_cli(crashing, "run", "--run-id", "crash", failpoints=failpoint)
    out, _ = crashed.communicate(timeout=600)
    assert crashed.returncode != 0, out[-3000:]
    _assert_output(spark, settings, expected)  # durable before the crash
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}

    report = pipeline.run_once(settings)  # resumes the group's unfinished run at its first unfinished step
    assert report["run_id"] == "crash"
    assert report["state_io"]["plan_reads"] == 1, "the resumed run's plan is read once, by run_once"
    assert report["waveforms"] == {"output_new": 6}, "its own waveforms, published once, by this run"
    assert_accounted(spark, settings, report)
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 12, 1: 12}
    qc = deltalake.DeltaTable(str(settings.qc_table))  # its hours, by the crashed attempt or the rerun: once
    assert qc.version() == 0 and qc.transaction_version(app_id(settings.group, settings.topic)) == 1
    hours = qc.to_pyarrow_table().to_pylist()
    assert sum(h["waveforms"] for h in hours) >= 6 and {h["run_id"] for h in hours} == {"crash"}


def test_killed_between_the_engines_write_and_the_clients_commit_nothing_shows_and_the_retry_publishes_once(
    settings, spark
):
    """A publish's files are written by the engine, then committed by the run's process: killed
    in between, none of them is in the table (they lie in an uncommitted folder); the resumed run
    writes and commits its own, once; VACUUM then removes the orphans, and delta-rs reads what
    Spark reads."""
    ensure_topic(settings)
    before = _produce(settings, 2, partitions=(0, 1), prefix="early")
    pipeline.run_once(settings)  # the table exists: the kill is an append's, not a create's
    expected = {**before, **_produce(settings, 4, partitions=(0, 1), prefix="torn")}
    crashed = start_cli(settings, "run", "--run-id", "torn", failpoints="publish.before_commit=kill")
    out, _ = crashed.communicate(timeout=600)
    assert crashed.returncode == -signal.SIGKILL, out[-3000:]
    _assert_output(spark, settings, before)  # its files are on disk, in no version
    orphans = maintenance.table_status("waveforms", settings.output_table).unreferenced_files
    assert orphans > 0 and list(Path(settings.output_table).glob("wavepipe-append-*/date=*/*.parquet"))

    report = pipeline.run_once(settings)  # resumes the group's unfinished run
    assert report["run_id"] == "torn" and report["waveforms"] == {"output_new": 4}
    assert_accounted(spark, settings, report)
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 12, 1: 12}

    (vacuumed,) = maintenance.vacuum(settings, tables=["waveforms"], retention_hours=0)
    assert vacuumed["files_deleted"] == orphans and vacuumed["unreferenced_left"] == 0, vacuumed
    _assert_output(spark, settings, expected)
    assert assert_delta_rs_reads_as_spark(spark, settings.output_table) == len(expected)


def test_a_lost_kafka_commit_is_found_in_the_delta_log_when_the_home_lost_the_run(settings, spark, kafka):
    # the publish went through, the Kafka commit did not, and the run's state under the home is
    # gone (a fresh worker, a wiped disk): the next run learns it from the tables' Delta log
    import shutil

    import deltalake

    from tests.helpers import read_topic
    from wavepipe import delta_txn
    from wavepipe.local.kafka import CONSUMER_GROUPS_TOOL

    settings = settings.replace(dead_letter_topic=f"{settings.topic}-dlq")
    ensure_topic(settings)
    ensure_topic(settings, settings.dead_letter_topic, partitions=1)
    expected = _produce(settings, 4, partitions=(0, 1))
    produce_in_order(settings, [(b"junk", [], b"no headers")], partition=1)
    crashed = start_cli(settings, "run", "--run-id", "lost", failpoints="commit.before_offsets=kill")
    out, _ = crashed.communicate(timeout=600)
    assert crashed.returncode != 0, out[-3000:]
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}
    for state in (settings.runs_dir, settings.groups_dir, settings.staging_dir):
        shutil.rmtree(state)
    (newest, *_) = delta_txn.published_runs(settings.output_table, delta_txn.app_id(settings.group, settings.topic))
    assert newest["run_id"] == "lost" and newest["safe_offsets"] == {0: 8, 1: 9}

    report = pipeline.run_once(settings, run_id="next")

    assert report["recovered"]["run_id"] == "lost"
    assert {int(p): o for p, o in report["recovered"]["offsets"].items()} == {0: [None, 8], 1: [None, 9]}
    assert report["skipped"] and report["waveforms"] == {}, "nothing re-read: the log said where the run got to"
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 8, 1: 9}
    _assert_output(spark, settings, expected)
    assert len(read_topic(settings, settings.dead_letter_topic)) == 1, "its dead letter went out, once"
    described = kafka.tool(
        CONSUMER_GROUPS_TOOL, "--bootstrap-server", kafka.bootstrap, "--describe", "--group", settings.group
    )
    lags = sorted(line.split()[2:6] for line in described.stdout.splitlines() if settings.topic + " " in line + " ")
    assert lags == [["0", "8", "8", "0"], ["1", "9", "9", "0"]], described.stdout
    # one transaction entry per group in every table, at the version of the group's last publish
    app = delta_txn.app_id(settings.group, settings.topic)
    assert deltalake.DeltaTable(str(settings.output_table)).transaction_version(app) == 1

    # and the next publishing run goes on from there, with the next version
    more = _produce(settings, 2, partitions=(0,), prefix="x")
    report = pipeline.run_once(settings, run_id="after")
    assert "recovered" not in report and report["waveforms"] == {"output_new": 2}
    _assert_output(spark, settings, {**expected, **more})
    assert deltalake.DeltaTable(str(settings.output_table)).transaction_version(app) == 2
    assert len(read_topic(settings, settings.dead_letter_topic)) == 1


@pytest.fixture
def own_kafka(tmp_path):
    """A broker of this test's own, so restarting it disturbs no other test."""
    from wavepipe.local.kafka import LocalKafka, free_port

    broker = LocalKafka(tmp_path / "own-kafka", "127.0.0.1", free_port(), load_settings().jars_dir)
    broker.up()
    yield broker
    broker.down()


def test_broker_restarted_during_a_run(settings, spark, own_kafka):
    settings = settings.replace(bootstrap_servers=own_kafka.bootstrap)
    ensure_topic(settings)
    expected = _produce(settings, 10, partitions=(0, 1))
    # each reader pauses at its 5th record, long enough for a restart under it
    run = start_cli(settings, "run", "--run-id", "restart", failpoints="consume.record@5=sleep:6")
    staging = Path(RunStore(settings).staging_dir("restart")) / "chunks"
    deadline = time.monotonic() + 120
    while not (staging.exists() and any(staging.iterdir())):
        assert time.monotonic() < deadline and run.poll() is None, "the run never started reading"
        time.sleep(0.2)
    time.sleep(1)
    own_kafka.down()
    own_kafka.up()
    out, _ = run.communicate(timeout=600)
    if run.returncode != 0:  # allowed: a clean failure, then the retry completes
        assert "failed" in out, out[-3000:]
        retry = start_cli(settings, "run")
        out, _ = retry.communicate(timeout=600)
        assert retry.returncode == 0, out[-3000:]
    report = _report(settings, "restart")
    assert_accounted(spark, settings, report)
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 20, 1: 20}


@pytest.mark.parametrize("where", ["plan.after_claim", "commit.before_offsets"])
def test_the_broker_down_when_a_step_asks_it_fails_the_step_in_one_line_and_the_rerun_commits_once(
    settings, spark, own_kafka, where
):
    """The broker stops while the run is frozen at a step that asks it next (the plan's offsets,
    the commit's check of the group's offsets): the run fails with exit 1 in one line naming the
    bootstrap servers, the request, and `wavepipe kafka up`, instead of librdkafka's bare
    ``KafkaError{code=_TIMED_OUT...}``. With the broker back, `wavepipe run` commits each waveform once."""
    settings = settings.replace(bootstrap_servers=own_kafka.bootstrap)
    ensure_topic(settings)
    expected = _produce(settings, 4, partitions=(0, 1))
    run = start_cli(settings, "run", failpoints=f"{where}=stop")
    frozen = when_stopped(run)
    own_kafka.down()
    frozen.resume()
    try:
        out, _ = run.communicate(timeout=300)
    finally:
        own_kafka.up()
    said = [line for line in out.splitlines() if line.startswith("wavepipe run failed: ")]
    assert run.returncode == 1 and len(said) == 1, out[-3000:]
    assert f"Kafka at {own_kafka.bootstrap} did not answer in " in said[0], said[0]
    assert "`wavepipe kafka up`" in said[0] and "KafkaError{" not in out, out[-3000:]

    code, out = run_cli(settings, "run")
    assert code == 0, out[-3000:]
    _assert_output(spark, settings, expected)
    assert assert_delta_rs_reads_as_spark(spark, settings.output_table) == len(expected)  # an independent reader
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 8, 1: 8}


@pytest.mark.parametrize("same_run", [False, True], ids=["two-run-ids", "one-run-id-twice"])
def test_two_runs_of_a_group_started_at_once_only_one_consumes_and_commits(settings, spark, same_run):
    ensure_topic(settings)
    expected = _produce(settings, 6, partitions=(0, 1))
    ids = ["race", "race"] if same_run else ["race-a", "race-b"]
    runs = [start_cli(settings, "run", "--run-id", run_id, failpoints="consume.record@2=sleep:3") for run_id in ids]
    outs = [run.communicate(timeout=600)[0] for run in runs]
    codes = [run.returncode for run in runs]
    assert sorted(codes) == [0, 1], outs
    loser = outs[codes.index(1)]
    if same_run:  # the same run's steps are locked
        assert "is running in another process right now" in loser, loser[-2000:]
    else:  # the group has one active run, planned or being planned
        assert re.search(r"of group '[^']+' is (planned but not committed|being planned right now)", loser), loser[
            -2000:
        ]
    assert not re.search(r"\b[A-Z]\w*(Error|Exception)\b", loser.splitlines()[-1]), loser[-2000:]
    winner = ids[codes.index(0)]
    report = _report(settings, winner)
    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": 6}
    _assert_output(spark, settings, expected)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 12, 1: 12}


def test_start_older_than_retention_fails_loudly_or_skips_on_request(settings, spark):
    ensure_topic(settings, partitions=1)
    first = _produce(settings, 1, chunks=3, prefix="kept")  # offsets 0-2
    pipeline.run_once(settings, run_id="before")
    lost = _produce(settings, 1, chunks=3, prefix="lost")  # 3-5, deleted before they are read
    after = _produce(settings, 1, chunks=3, prefix="after")  # 6-8
    admin = admin_client(settings)  # kept alive until its futures resolve
    futures = admin.delete_records([TopicPartition(settings.topic, 0, 6)])
    for future in futures.values():
        future.result(timeout=30)

    with pytest.raises(RetentionGapError, match=r"\[0\] \[3, 6\)"):
        pipeline.plan_step(settings, "gap")
    assert RunStore(settings).active_run(settings.group) is None, "a refused plan leaves the group free"
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 3}

    code, out = run_cli(settings, "run")
    assert code == 1 and "--skip-lost-offsets" in out, out[-2000:]
    report = pipeline.run_once(settings, run_id="skip", skip_lost_offsets=True)
    assert_accounted(spark, settings, report)
    p0 = report["partitions"]["0"]
    assert (p0["lost"], p0["start"], p0["end"], report["totals"]["lost"]) == ([3, 6], 6, 9, 3)
    assert _report(settings, "skip")["partitions"]["0"]["lost"] == [3, 6]
    _assert_output(spark, settings, {**first, **after})
    assert "lost000" not in quarantine_reasons(spark, settings)
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 9}
    assert lost  # produced, and never seen by wavepipe


_CRASHING_PRODUCER = """
import os, signal
from confluent_kafka import Producer
from tests.helpers import produce_in_order, waveform_records
from wavepipe.contracts.config import load_settings
settings = load_settings()
producer = Producer(settings.kafka_config(**{"transactional.id": "crashing-" + settings.topic,
                                             "transaction.timeout.ms": 20000}))
producer.init_transactions(30)
producer.begin_transaction()
records, _ = waveform_records("in-crashed-txn", 2, seed=9)
produce_in_order(settings, records, producer=producer)
producer.flush(30)
os.kill(os.getpid(), signal.SIGKILL)  # dies inside its transaction
"""


def test_open_and_abandoned_transactions_do_not_stall_runs(settings, spark):
    ensure_topic(settings, partitions=1)
    a, a_sum = waveform_records("before-txn", 2, seed=1)
    t, t_sum = waveform_records("in-txn", 3, seed=2)
    b, b_sum = waveform_records("after-txn", 2, seed=3)
    produce_in_order(settings, a)  # 0-1
    # held open across a whole run: well past librdkafka's default 60 s timeout, after which the
    # broker aborts the transaction and fences the producer (a slow machine takes that long)
    tx = Producer(
        settings.kafka_config(**{"transactional.id": f"open-{settings.topic}", "transaction.timeout.ms": 600_000})
    )
    tx.init_transactions(30)
    tx.begin_transaction()
    produce_in_order(settings, t, producer=tx)  # 2-4, not committed yet
    tx.flush(30)
    produce_in_order(settings, b)  # 5-6, committed, but behind the open transaction

    while_open = pipeline.run_once(settings, run_id="while-open")
    p0 = while_open["partitions"]["0"]
    assert (p0["start"], p0["end"]) == (0, 2), "the plan ends at the last stable offset"
    assert_accounted(spark, settings, while_open, gaps=True)

    tx.commit_transaction(30)  # marker at 7
    resolved = pipeline.run_once(settings, run_id="resolved")
    p0 = resolved["partitions"]["0"]
    assert (p0["start"], p0["end"], p0["output"], p0["gap"]) == (2, 8, 5, 1)
    assert_accounted(spark, settings, resolved, gaps=True)

    crashed = start_python(settings, _CRASHING_PRODUCER)  # 8-9 in a transaction nobody will finish
    assert crashed.wait(120) == -signal.SIGKILL
    d, d_sum = waveform_records("after-crash", 2, seed=4)
    produce_in_order(settings, d)  # 10-11
    # planned within the crashed transaction's 20 s timeout (3 s was too short on a loaded machine:
    # the broker had aborted it before the plan, and the run read past it)
    stuck = pipeline.run_once(settings, run_id="stuck")
    assert (stuck["partitions"]["0"]["start"], stuck["partitions"]["0"]["end"]) == (8, 8)

    deadline = time.monotonic() + 90  # the broker aborts it after transaction.timeout.ms (checked every 10 s)
    while _ends(settings, [0])[0] <= 10:
        assert time.monotonic() < deadline, "the broker never aborted the crashed producer's transaction"
        time.sleep(0.5)
    after = pipeline.run_once(settings, run_id="after-abort")
    p0 = after["partitions"]["0"]
    assert (p0["start"], p0["output"], p0["gap"]) == (8, 2, p0["end"] - 8 - 2)
    assert_accounted(spark, settings, after, gaps=True)
    _assert_output(spark, settings, {"before-txn": a_sum, "in-txn": t_sum, "after-txn": b_sum, "after-crash": d_sum})
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: p0["end"]}
