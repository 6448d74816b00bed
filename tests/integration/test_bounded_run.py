"""A bounded run on the real broker and a real Spark (spark-submit, local mode)."""

from __future__ import annotations

import time
from pathlib import Path

import deltalake
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from tests.helpers import committed_metadata, output_rows, produce_in_order, waveform_records
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.consumers.reader import read_range
from wavepipe.contracts.plan import ActiveRunError
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import Published
from wavepipe.run_store import RunStore, staged_paths

pytestmark = pytest.mark.integration


def _staged_offsets(settings, run_id, partition):
    store = RunStore(settings)
    plan = store.load_plan(run_id)
    chunk_path, dead_path = staged_paths(store, run_id, plan.range_for(partition))
    offsets = pq.read_table(chunk_path, columns=["offset"])["offset"].to_pylist()
    offsets += pq.read_table(dead_path, columns=["offset"])["offset"].to_pylist()
    return sorted(offsets)


def test_plan_is_frozen_and_reused_by_a_retry(settings):
    ensure_topic(settings)
    produce_demo(settings, count=4, target_bytes=8 * 1024)
    first = pipeline.plan_step(settings, "run-a")
    assert first.total_offsets > 0
    produce_demo(settings, count=4, target_bytes=8 * 1024)  # more data arrives before the retry
    again = pipeline.plan_step(settings, "run-a")
    assert again == first, "a retry must reuse the stored plan, not plan again"
    assert RunStore(settings).has_plan("run-a")
    with pytest.raises(ActiveRunError, match="run-a"):
        pipeline.plan_step(settings, "run-b")  # the group has an active run


def test_reader_stops_exactly_at_end_and_a_retry_overwrites(settings):
    ensure_topic(settings, partitions=1)
    records, _ = waveform_records("w", 10)
    produce_in_order(settings, records)
    plan = pipeline.plan_step(settings, "cap", max_records=4)
    assert (plan.ranges[0].start, plan.ranges[0].end) == (0, 4)
    stats = read_range(settings, "cap", 0)
    assert (stats.records, stats.first_offset, stats.last_offset) == (4, 0, 3)
    assert _staged_offsets(settings, "cap", 0) == [0, 1, 2, 3]
    read_range(settings, "cap", 0)  # a retried consume task
    files = list((Path(RunStore(settings).staging_dir("cap")) / "chunks").iterdir())
    assert len(files) == 1, files
    assert _staged_offsets(settings, "cap", 0) == [0, 1, 2, 3]


def test_transaction_markers_and_aborted_records_are_gaps_not_stalls(settings, spark):
    ensure_topic(settings, partitions=1)
    a, a_sum = waveform_records("txn-a", 5, seed=1)
    b, _ = waveform_records("txn-b", 3, seed=2)
    c, c_sum = waveform_records("txn-c", 2, seed=3)
    producer = Producer(settings.kafka_config(**{"transactional.id": f"tx-{settings.topic}"}))
    producer.init_transactions(30)
    for records, commit in ((a, True), (b, False), (c, True)):
        producer.begin_transaction()
        produce_in_order(settings, records, producer=producer)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    # offsets: a 0-4, commit marker 5, b 6-8 (aborted), abort marker 9, c 10-11, commit marker 12
    plan = pipeline.plan_step(settings, "tx-capped", max_records=6)
    assert (plan.ranges[0].start, plan.ranges[0].end) == (0, 6)
    began = time.monotonic()
    stats = read_range(settings, "tx-capped", 0)
    assert time.monotonic() - began < 15, "the reader must not wait for a record that is a marker"
    assert (stats.records, stats.gap_offsets) == (5, 1)
    RunStore(settings).release_group(settings.group, "tx-capped")

    report = pipeline.run_once(settings, run_id="tx-full")
    part = report["partitions"]["0"]
    assert (part["start"], part["end"]) == (0, 13)
    assert (part["records_read"], part["gap"], part["output"]) == (7, 6, 7)
    assert report["balance_errors"] == []
    rows = output_rows(spark, settings)
    assert [(r[0], r[1] == r[2]) for r in rows] == [("txn-a", True), ("txn-c", True)]
    assert {r[0]: r[1] for r in rows} == {"txn-a": a_sum, "txn-c": c_sum}
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 13}


def test_waveform_split_across_run_end_is_emitted_once_in_the_next_run(settings, spark, kafka):
    ensure_topic(settings, partitions=1)
    w, w_sum = waveform_records("split-w", 4, seed=4)
    x, x_sum = waveform_records("whole-x", 3, seed=5)
    produce_in_order(settings, [x[0], w[0], x[1], x[2]])  # w's other chunks are not sent yet

    first = pipeline.run_once(settings, run_id="first")
    # one value through its steps: the planner's look for an earlier plan of that id is the one
    # read of the plan in this process, and the report counts the state's reads and writes
    assert first["state_io"]["plan_reads"] == 1 and first["state_io"]["plan_writes"] == 1, first["state_io"]
    assert first["state_io"]["writes"] > 0
    # the publish is a step of its own: its record names the tables' versions the report gives
    done = RunStore(settings).load_result("first", Step.PUBLISH, Published)
    assert done.table_versions == first["table_versions"] and done.output_table_version == first["output_table_version"]
    assert deltalake.DeltaTable(str(settings.output_table)).version() == done.output_table_version  # delta-rs agrees
    p0 = first["partitions"]["0"]
    assert (p0["output"], p0["pending"], p0["safe_offset"]) == (3, 1, 1)
    assert first["waveforms"] == {"output_new": 1, "pending": 1}
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 1}
    assert [r[0] for r in output_rows(spark, settings)] == ["whole-x"]

    idle = pipeline.run_once(settings, run_id="idle")  # only the pending chunk is there to re-read
    assert idle["skipped"] and idle["balance_errors"] == []
    assert RunStore(settings).active_run(settings.group) is None
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 1}

    produce_in_order(settings, w[1:])
    second = pipeline.run_once(settings, run_id="second")
    p0 = second["partitions"]["0"]
    # reads [1, 7): all of w, and x's last two chunks, a leftover of a waveform already written
    assert (p0["start"], p0["end"], p0["output"], p0["output_already_written"], p0["pending"]) == (1, 7, 6, 2, 0)
    assert second["waveforms"] == {"output_new": 1, "output_already_written": 1}
    rows = output_rows(spark, settings)
    assert [(r[0], r[3]) for r in rows] == [("split-w", "second"), ("whole-x", "first")]
    assert {r[0]: r[1] for r in rows} == {"split-w": w_sum, "whole-x": x_sum}
    assert all(r[1] == r[2] for r in rows), "payloads must be bit-exact"
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 7}
    # the run, where it planned to end, and the tables the group is tied to
    assert committed_metadata(settings) == {"run_id": "second", "planned_end": 7, "tables": settings.tables_location}
    # and Kafka's own tool sees the same progress
    from wavepipe.local.kafka import CONSUMER_GROUPS_TOOL

    described = kafka.tool(
        CONSUMER_GROUPS_TOOL, "--bootstrap-server", kafka.bootstrap, "--describe", "--group", settings.group
    )
    assert described.returncode == 0, described.stderr[-2000:]
    row = next(line.split() for line in described.stdout.splitlines() if settings.topic in line)
    assert row[:4] == [settings.group, settings.topic, "0", "7"], described.stdout  # group topic partition offset


def test_a_waveform_longer_than_the_cap_still_completes(settings):
    ensure_topic(settings, partitions=1)
    records, _ = waveform_records("long", 6, seed=11)
    produce_in_order(settings, records)
    first = pipeline.run_once(settings, run_id="cap-1", max_records=4)
    assert (first["partitions"]["0"]["pending"], first["partitions"]["0"]["safe_offset"]) == (4, 0)
    plan = pipeline.plan_step(settings, "cap-2", max_records=4)
    assert (plan.ranges[0].start, plan.ranges[0].end) == (0, 6), "the range grows past the last run's end"
    second = pipeline.run_once(settings, run_id="cap-2", max_records=4)
    assert second["waveforms"] == {"output_new": 1}
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 6}


def test_rerunning_the_same_plan_gives_identical_output(settings, spark):
    ensure_topic(settings)
    sent = produce_demo(settings, count=6, target_bytes=16 * 1024)
    report = pipeline.run_once(settings, run_id="same")
    assert not Path(RunStore(settings).staging_dir("same")).exists(), "staged copies are removed once committed"
    before = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in before) == sorted((s.waveform_id, s.checksum) for s in sent)
    assert all(r[1] == r[2] for r in before)

    # every step again for the same run id: the plan is reused, nothing new is written
    plan = pipeline.plan_step(settings, "same")
    for partition in pipeline.partitions_to_read(plan):
        pipeline.consume_step(settings, "same", partition)
    again = pipeline.reassemble_step(settings, "same")
    assert again.waveforms == {"output_already_written": len(sent)}
    assert pipeline.validate_step(settings, "same").rows.waveforms == 0, "no candidate: all were written"
    assert output_rows(spark, settings) == before
    repeat = pipeline.commit_step(settings, "same")
    assert repeat["balance_errors"] == []
    ends = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert committed_offsets(settings, settings.group, settings.topic, list(ends)) == ends

    # and a new run with nothing new reads nothing and writes nothing
    idle = pipeline.run_once(settings)
    assert idle["skipped"] and idle["totals"]["records_read"] == 0
    assert output_rows(spark, settings) == before

    # a micro-batch of waveforms in order, appended to the table: one Spark job (the engine's own
    # list), the publish's: its Python workers write the Parquet files that delta-rs then commits
    # (a map over the staged files; issue 33: <= 4)
    more = produce_demo(settings, count=3, target_bytes=16 * 1024)
    appended = pipeline.run_once(settings)
    assert appended["verified"] == {"while_read": len(more), "from_one_staged_file": 0, "by_a_shuffle": 0}
    jobs = appended["spark_jobs"]
    assert jobs["count"] == 1 and jobs["by_step"] == {"reassemble": 1}, jobs
    assert len(output_rows(spark, settings)) == len(sent) + len(more)


def test_commit_is_refused_when_the_group_moved_or_the_run_lost_its_claim(settings):
    from confluent_kafka import TopicPartition

    from wavepipe.consumers.committer import OffsetsMovedError, commit_safe_offsets
    from wavepipe.consumers.kafka_admin import group_consumer

    ensure_topic(settings, partitions=1)
    records, _ = waveform_records("m", 3)
    produce_in_order(settings, records)
    plan = pipeline.plan_step(settings, "moved")
    mover = group_consumer(settings, settings.group)  # someone resets the group during the run
    mover.commit(offsets=[TopicPartition(settings.topic, 0, 2)], asynchronous=False)
    mover.close()
    with pytest.raises(OffsetsMovedError, match="is at 2, but was at no committed offset when the run was planned"):
        commit_safe_offsets(settings, plan, {0: 3})
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 2}

    RunStore(settings).release_group(settings.group, "moved")  # as `wavepipe abandon` does
    with pytest.raises(RuntimeError, match="no longer holds group"):
        pipeline.commit_step(settings, "moved")


def test_one_run_assembles_streamed_and_shuffled_waveforms_together(settings, spark):
    """Every route of a new waveform in one run: in order in one partition (hashed by its reader,
    verified from that digest, written once at publish), out of order in one partition (assembled
    from its staged file), spread over two partitions or with a duplicated chunk (a shuffle), and
    a damaged chunk in order (its digest differs from wp-checksum: quarantined, no payload read).
    All land once and bit-exact."""
    ensure_topic(settings)
    local, local_sum = waveform_records("local", 4, seed=11)
    spread, spread_sum = waveform_records("spread", 4, seed=12)
    dup, dup_sum = waveform_records("dup", 3, seed=13)
    swapped, swapped_sum = waveform_records("swapped", 3, seed=14)
    bad, _ = waveform_records("bad", 2, seed=15)
    key, headers, value = bad[1]
    produce_in_order(
        settings,
        [
            *local,
            spread[0],
            spread[1],
            dup[0],
            dup[0],
            dup[1],
            dup[2],
            swapped[1],
            swapped[0],
            swapped[2],
            bad[0],
            (key, headers, bytes(len(value))),
        ],
        partition=0,
    )
    produce_in_order(settings, [spread[2], spread[3]], partition=1)
    report = pipeline.run_once(settings)
    assert report["balance_errors"] == [] and report["waveforms"] == {
        "output_new": 4,
        "quarantined:checksum_mismatch": 1,
    }
    assert report["verified"] == {"while_read": 1, "from_one_staged_file": 1, "by_a_shuffle": 2}
    # every route, a quarantine: the engine's own job list, 6 jobs (issue 33's bound: 8): 3 verify the
    # waveforms no reader could (a shuffle: its map stages are jobs of their own), 3 write the files
    assert report["spark_jobs"]["count"] is not None and report["spark_jobs"]["count"] <= 6, report["spark_jobs"][
        "jobs"
    ]
    rows = output_rows(spark, settings)
    assert [(r[0], r[1]) for r in rows] == sorted(
        [("dup", dup_sum), ("local", local_sum), ("spread", spread_sum), ("swapped", swapped_sum)]
    )
    assert all(r[1] == r[2] for r in rows)
    assert {int(p): part["safe_offset"] for p, part in report["partitions"].items()} == {0: 15, 1: 2}
