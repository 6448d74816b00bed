"""``wavepipe follow``: micro-batches back to back on the real broker and Spark engine, stopped,
killed and doubled the way an operator or Airflow would."""

from __future__ import annotations

import json
import signal
import time

import pytest
from confluent_kafka.admin import OffsetSpec

from tests.helpers import assert_accounted, output_rows, produce_in_order, run_cli, start_cli, waveform_records
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, list_offsets
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.runfiles import html_path
from wavepipe.spark_apps.tables import delta_row_count

pytestmark = pytest.mark.integration


def _caught_up(settings, timeout: float = 180.0) -> dict[int, int]:
    """Wait until the group has committed every offset the topic holds; returns them."""
    partitions = list(range(settings.partitions))
    deadline = time.monotonic() + timeout
    while True:
        ends = list_offsets(settings, settings.topic, partitions, OffsetSpec.latest())
        if committed_offsets(settings, settings.group, settings.topic, partitions) == ends:
            return ends
        assert time.monotonic() < deadline, f"the loop did not catch up with {ends} in {timeout:.0f} s"
        time.sleep(0.5)


def _reports(settings) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(settings.reports_dir.glob("*.json"))]


def test_follow_publishes_each_burst_as_its_own_micro_batch_and_stops_on_sigterm(settings, spark):
    ensure_topic(settings)
    loop = start_cli(settings, "follow", "--poll", "0.5")
    try:
        first = produce_demo(settings, count=4, target_bytes=16 * 1024)
        _caught_up(settings)
        second = produce_demo(settings, count=3, target_bytes=16 * 1024)
        _caught_up(settings)
    finally:
        loop.send_signal(signal.SIGTERM)
        out, _ = loop.communicate(timeout=120)
    assert loop.returncode == 0, out
    assert "micro-batch 1: run " in out and "micro-batch 2: run " in out and "ended: stopped" in out, out
    sent = [*first, *second]
    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    assert all(r[1] == r[2] for r in rows), "every payload hashes to its checksum"
    published = [r for r in _reports(settings) if not r.get("skipped")]
    assert len({r["run_id"] for r in published}) >= 2, "each burst is a run of its own"
    for report in published:
        assert_accounted(spark, settings, report)
        # described after its commit by the loop's own thread, before SIGTERM ended the loop
        validation = report["validation"]
        assert validation["data_docs_index"].startswith("file://") and "describe" in report["timings_s"], report
        assert all(s.get("data_docs") for s in validation["suites"]), validation["suites"]
        assert validation["plot"] or any("described with run" in n for n in report["notes"]), report
        assert report["run_id"] in html_path(settings, report["run_id"]).read_text()


def test_a_loop_killed_between_the_table_and_the_kafka_commit_resumes_and_a_second_loop_refuses(settings, spark):
    """The loop is SIGKILLed after its micro-batch's Delta commit, before its Kafka commit, while
    a second loop on the same group is refused; the next start resumes that micro-batch: it
    commits the offsets and publishes nothing twice."""
    ensure_topic(settings)
    sent = produce_demo(settings, count=4, target_bytes=16 * 1024)
    loop = start_cli(settings, "follow", "--poll", "0.5", failpoints="commit.before_offsets=sleep:120")
    try:
        deadline = time.monotonic() + 180
        while (delta_row_count(settings.output_table) or 0) < len(sent):
            assert loop.poll() is None and time.monotonic() < deadline, "the micro-batch was not published"
            time.sleep(0.5)
        code, out = run_cli(settings, "follow", "--max-batches", "1", timeout=120)
        assert code == 1 and "is being run by another process" in out, out
    finally:
        loop.kill()
        loop.communicate(timeout=60)
    partitions = list(range(settings.partitions))
    assert set(committed_offsets(settings, settings.group, settings.topic, partitions).values()) <= {None, 0}

    code, out = run_cli(settings, "follow", "--max-batches", "1", timeout=300)
    assert code == 0 and "micro-batch 1: run " in out and "ended: 1 micro-batches run" in out, out
    ends = _caught_up(settings, timeout=10)
    assert sum(ends.values()) > 0
    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    (report,) = [r for r in _reports(settings) if not r.get("skipped")]
    assert report["outcome"]["new"] == len(sent), "the resumed run is the killed one, published once"
    assert_accounted(spark, settings, report)


def test_a_lag_held_back_by_a_waveform_still_missing_chunks_starts_no_run_after_run(settings, spark):
    """The group's commit stays before a waveform whose last chunks have not come, so its lag
    stays above 0; the loop reads it once, then waits for new records instead of running the
    same backlog again and again. When they come, the waveform completes, once."""
    ensure_topic(settings)
    records, checksum = waveform_records("late", 4, seed=21)
    produce_in_order(settings, records[:2], partition=0)
    # --max-batches 3 is never reached: with nothing new to read, --max-idle ends the loop
    code, out = run_cli(settings, "follow", "--poll", "0.2", "--max-batches", "3", "--max-idle", "3", timeout=120)
    assert code == 0 and out.count("micro-batch ") == 1 and "micro-batch 1: run " in out, out
    assert "ended: idle for 3 s" in out, out
    (pending,) = [r for r in _reports(settings) if not r.get("skipped")]
    assert pending["outcome"]["new"] == 0 and pending["outcome"]["pending"] == 1, pending["outcome"]
    produce_in_order(settings, records[2:], partition=0)
    code, out = run_cli(settings, "follow", "--poll", "0.2", "--max-batches", "1", timeout=300)
    assert code == 0, out
    assert [(r[0], r[1]) for r in output_rows(spark, settings)] == [("late", checksum)]


def test_a_micro_batch_failing_on_a_bug_ends_the_loop_at_once_with_the_reason(settings, monkeypatch, caplog):
    import threading

    from wavepipe import follow
    from wavepipe.waiting import WaitError

    ensure_topic(settings, partitions=2)
    produce_in_order(settings, waveform_records("w-bug", n_chunks=2, chunk_size=100)[0], partition=0)
    tries = []

    def buggy(*_):  # what a bug in a step looks like: "str / str"
        tries.append(1)
        return "table" / "_delta_log"

    monkeypatch.setattr(follow, "_one_batch", buggy)
    options = follow.FollowOptions(poll_s=0.5, max_failures=3)
    with pytest.raises(WaitError, match=r"TypeError: unsupported operand type.*cannot fix"):
        follow.follow(settings.replace(new_group_start="earliest"), options, threading.Event())
    assert tries == [1]  # not tried again after a pause, as a service's failure is
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [TypeError]  # its traceback, once
