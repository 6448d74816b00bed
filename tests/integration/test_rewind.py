"""Rewinds on the real broker: every mode, the refusals, snapping to a waveform's first chunk,
the audit record, Kafka's own consumer-groups tool both ways, a re-read through a real run, and
the ``wavepipe_rewind`` DAG through real Airflow."""

from __future__ import annotations

import getpass
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.helpers import (
    assert_output_unique,
    committed_metadata,
    output_rows,
    produce_in_order,
    run_cli,
    run_cli_json,
    waveform_records,
)
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import admin_client, committed_offsets, ensure_topic, group_consumer
from wavepipe.consumers.rewind import (
    RewindRefused,
    RewindTarget,
    audit_path,
    execute_rewind,
    plan_rewind,
)
from wavepipe.local.kafka import CONSUMER_GROUPS_TOOL
from wavepipe.run_store import RunStore

pytestmark = pytest.mark.integration


def _singles(settings, n: int, partition: int = 0, prefix: str = "s", timestamps=None) -> None:
    """``n`` one-chunk waveforms on ``partition`` (every offset is a waveform boundary)."""
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    for i in range(n):
        [(key, headers, value)], _ = waveform_records(f"{prefix}{partition}-{i}", 1, seed=i)
        extra = {"timestamp": timestamps[i]} if timestamps else {}
        producer.produce(settings.topic, value=value, key=key, headers=headers, partition=partition, **extra)
    assert producer.flush(30) == 0


def _commit(settings, offsets: dict[int, int]) -> None:
    consumer = group_consumer(settings, settings.group)
    try:
        consumer.commit(offsets=[TopicPartition(settings.topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def _committed(settings, partitions=(0,)) -> dict[int, int | None]:
    return committed_offsets(settings, settings.group, settings.topic, list(partitions))


def _plan(settings, mode: str, value=None, **kw):
    return plan_rewind(
        settings, topic=settings.topic, group=settings.group, target=RewindTarget.parse(mode, value), **kw
    )


def _audit(settings) -> list[dict]:
    path = audit_path(settings)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_mode_moves_the_group_where_it_says(settings):
    ensure_topic(settings, partitions=1)
    now = datetime.now(UTC)
    old, recent = now - timedelta(hours=3), now - timedelta(hours=1)
    stamps = [int(old.timestamp() * 1000)] * 5 + [int(recent.timestamp() * 1000)] * 5
    _singles(settings, 10, timestamps=stamps)

    shift_without_commit = _plan(settings, "shift", "3")  # no committed offset: from the earliest
    assert (shift_without_commit.partitions[0].committed, shift_without_commit.partitions[0].final) == (None, 3)
    _commit(settings, {0: 7})
    between = (now - timedelta(hours=2)).isoformat()
    steps = [
        ("earliest", None, 0),
        ("latest", None, 10),
        ("offset", "4", 4),
        ("shift", "-3", 1),
        ("shift", "+5", 6),
        ("datetime", between, 5),
        ("datetime", (now + timedelta(hours=1)).isoformat(), 10),  # nothing after: the end
        ("datetime", (old - timedelta(days=1)).replace(tzinfo=None).isoformat(), 0),  # naive: UTC
        ("duration", "90m", 5),
        ("duration", "PT2H30M", 5),
        ("duration", "1d", 0),
    ]
    for mode, value, expected in steps:
        before = _committed(settings)[0]
        plan = _plan(settings, mode, value)
        part = plan.partitions[0]
        assert (part.committed, part.requested, part.final, part.end) == (before, expected, expected, 10), (mode, value)
        assert (part.lag_before, part.lag_after) == (10 - before, 10 - expected)
        assert _committed(settings) == {0: before}, "planning changes nothing"
        done = execute_rewind(settings, plan, who="tester", reason=f"mode {mode}")
        assert _committed(settings) == {0: expected}, (mode, value)
        assert done["partitions"]["0"]["from"] == before and done["partitions"]["0"]["to"] == expected
    records = _audit(settings)
    assert [(r["mode"], r["outcome"]) for r in records] == [(m, "applied") for m, _, _ in steps]
    assert records[-1]["instant"] is not None and records[0]["who"] == "tester"


def test_partition_selection_leaves_the_others_alone(settings):
    ensure_topic(settings, partitions=2)
    _singles(settings, 4, partition=0)
    _singles(settings, 6, partition=1)
    _commit(settings, {0: 4, 1: 6})
    plan = _plan(settings, "earliest", partitions=[1])
    assert [p.partition for p in plan.partitions] == [1]
    execute_rewind(settings, plan, who="tester")
    assert _committed(settings, (0, 1)) == {0: 4, 1: 0}
    with pytest.raises(ValueError, match=r"no partition\(s\) \[5\]; its partitions are \[0, 1\]"):
        _plan(settings, "earliest", partitions=[1, 5])


def test_cli_dry_run_changes_nothing_and_execute_applies_and_audits(settings):
    ensure_topic(settings, partitions=2)
    _singles(settings, 5, partition=0)
    _singles(settings, 3, partition=1)
    _commit(settings, {0: 5, 1: 3})
    code, out = run_cli(settings, "rewind", "--shift-by", "-2", "--partitions", "0")
    assert code == 0, out
    assert "dry run: nothing changed; add --execute to apply" in out
    assert "3 -> 5" not in out and "0 -> 2" in out  # lag before -> after of partition 0
    assert _committed(settings, (0, 1)) == {0: 5, 1: 3} and _audit(settings) == []
    code, out = run_cli(settings, "rewind", "--shift-by", "-2", "--partitions", "0", "--execute")
    assert code == 2 and "--execute needs --reason" in out, out
    assert _committed(settings, (0, 1)) == {0: 5, 1: 3} and _audit(settings) == []

    code, out = run_cli(
        settings,
        "rewind",
        "--shift-by",
        "-2",
        "--partitions",
        "0",
        "--execute",
        "--reason",
        "reprocess after a bad deploy",
    )
    assert code == 0, out
    assert RunStore(settings).active_run(settings.group) is None  # the rewind's claim was released
    assert f"{settings.topic}[0] 5 -> 3" in out and f"audit: {audit_path(settings)}" in out
    assert _committed(settings, (0, 1)) == {0: 3, 1: 3}
    [record] = _audit(settings)
    assert record["outcome"] == "applied" and record["who"] == getpass.getuser()
    assert (record["group"], record["topic"], record["mode"], record["value"]) == (
        settings.group,
        settings.topic,
        "shift",
        "-2",
    )
    assert record["reason"] == "reprocess after a bad deploy" and record["force"] is False
    assert record["partitions"]["0"]["from"] == 5 and record["partitions"]["0"]["to"] == 3
    assert datetime.fromisoformat(record["when"]).tzinfo is not None
    assert committed_metadata(settings, 0) == {"rewind": record["id"]}

    code, out = run_cli(settings, "rewind", "--by-duration", "2 hours")
    assert code == 2 and "duration '2 hours' is not understood" in out

    # --json: the plan and its outcome as one document, dry run and applied alike
    code, doc, err = run_cli_json(settings, "rewind", "--to-earliest", "--partitions", "1")
    assert code == 0, err
    assert (doc["outcome"], doc["execute"], doc["applied"]) == ("dry_run", False, None)
    assert [(p["partition"], p["committed"], p["final"]) for p in doc["plan"]["partitions"]] == [(1, 3, 0)], doc["plan"]
    code, doc, err = run_cli_json(
        settings, "rewind", "--to-earliest", "--partitions", "1", "--execute", "--reason", "json"
    )
    assert code == 0 and doc["outcome"] == "applied", (err, doc)
    assert doc["applied"]["partitions"]["1"] == {**doc["applied"]["partitions"]["1"], "from": 3, "to": 0}
    assert _committed(settings, (0, 1)) == {0: 3, 1: 0}


def test_refused_while_the_group_has_a_live_member(settings):
    ensure_topic(settings, partitions=1)
    _singles(settings, 3)
    _commit(settings, {0: 3})
    live = Consumer(
        settings.kafka_config(
            **{
                "group.id": settings.group,
                "client.id": "live-reader",
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
            }
        )
    )
    live.subscribe([settings.topic])
    try:
        deadline = time.monotonic() + 60
        while not live.assignment():
            assert time.monotonic() < deadline, "the live consumer never got an assignment"
            live.poll(0.5)
        with pytest.raises(RewindRefused, match=r"active member\(s\) \(live-reader@") as refused:
            _plan(settings, "earliest")
        assert refused.value.plan is not None and refused.value.plan.partitions[0].final == 0  # the table still shows
        code, out = run_cli(settings, "rewind", "--to-earliest", "--execute", "--reason", "try")
        assert code == 2 and "refused" in out and "stop those consumers first" in out, out
        assert _committed(settings) == {0: 3}
        [record] = _audit(settings)
        assert record["outcome"] == "refused" and "live-reader" in record["message"]
    finally:
        live.close()
    execute_rewind(settings, _plan(settings, "earliest"), who="tester")  # gone: now it may
    assert _committed(settings) == {0: 0}


def test_refused_while_wavepipe_has_an_active_run(settings):
    ensure_topic(settings, partitions=1)
    _singles(settings, 3)
    store = RunStore(settings)
    store.claim_group(settings.group, "run-in-flight")
    with pytest.raises(RewindRefused, match=r"run-in-flight .*wavepipe abandon --group"):
        _plan(settings, "earliest")
    code, out = run_cli(settings, "rewind", "--to-latest")
    assert code == 2 and "dry run: would be refused" in out and "run-in-flight" in out, out
    store.release_group(settings.group, "run-in-flight")
    plan = _plan(settings, "latest")
    store.claim_group(settings.group, "run-late")  # a run planned between the dry run and the execute
    with pytest.raises(RewindRefused, match="run-late"):
        execute_rewind(settings, plan, who="tester")
    assert _committed(settings) == {0: None}


def test_out_of_retention_is_refused_unless_forced_then_clamped(settings):
    ensure_topic(settings, partitions=1)
    _singles(settings, 10)
    admin = admin_client(settings)
    [fut] = admin.delete_records([TopicPartition(settings.topic, 0, 4)]).values()
    fut.result(30)
    with pytest.raises(RewindRefused, match=r"\[0\] 2 is outside the retained range \[4, 10\].*--force"):
        _plan(settings, "offset", "2")
    low = _plan(settings, "offset", "2", force=True).partitions[0]
    assert (low.requested, low.final, low.clamped_from) == (2, 4, 2) and "clamped from 2" in low.note
    high = _plan(settings, "offset", "25", force=True).partitions[0]
    assert (high.final, high.lag_after) == (10, 0)
    with pytest.raises(RewindRefused, match="outside the retained range"):
        _plan(settings, "shift", "-20")
    code, out = run_cli(settings, "rewind", "--to-offset", "2", "--execute", "--force", "--reason", "gone")
    assert code == 0, out
    assert _committed(settings) == {0: 4}
    assert _audit(settings)[-1]["partitions"]["0"]["clamped_from"] == 2


def test_a_target_inside_a_waveform_snaps_back_to_its_first_chunk(settings):
    ensure_topic(settings, partitions=1)
    a, _ = waveform_records("a", 1, seed=1)
    b, _ = waveform_records("b", 4, seed=2)
    c, _ = waveform_records("c", 2, seed=3)
    d, _ = waveform_records("d", 3, seed=4)
    # a@0, b@1-4 interleaved with c: c0@2 ... ; layout: a0 b0 c0 b1 b2 c1 b3 d0 d1 (d2 not sent yet)
    produce_in_order(settings, [a[0], b[0], c[0], b[1], b[2], c[1], b[3], d[0], d[1]])
    plan = _plan(settings, "offset", "4")  # inside b (and c): back to b's first chunk
    part = plan.partitions[0]
    assert (part.requested, part.final, part.snapped_from) == (4, 1, 4)
    assert "snapped from 4" in part.note and "b" in part.note
    assert _plan(settings, "offset", "7").partitions[0].final == 7  # a boundary: unchanged
    latest = _plan(settings, "latest").partitions[0]
    assert (latest.requested, latest.final) == (9, 7), "d is still missing a chunk at the end"
    execute_rewind(settings, plan, who="tester")
    assert _committed(settings) == {0: 1}


def test_snap_scans_back_further_than_the_first_window(settings):
    ensure_topic(settings, partitions=1)
    head, _ = waveform_records("head", 1, seed=1)
    long, _ = waveform_records("long", 700, chunk_size=8, seed=2)
    produce_in_order(settings, head + long)  # long's chunks at 1..700
    part = _plan(settings, "offset", "690").partitions[0]
    assert (part.final, part.snapped_from) == (1, 690)
    assert _plan(settings, "offset", "690", max_scan=100).partitions[0].final == 690, (
        "beyond the scan limit the waveform would be quarantined as incomplete anyway: not moved"
    )


def test_kafka_tool_describes_what_a_rewind_set(settings, kafka):
    ensure_topic(settings, partitions=1)
    _singles(settings, 6)
    _commit(settings, {0: 6})
    code, out = run_cli(settings, "rewind", "--to-offset", "2", "--execute", "--reason", "tool interop")
    assert code == 0, out
    described = kafka.tool(
        CONSUMER_GROUPS_TOOL, "--bootstrap-server", kafka.bootstrap, "--describe", "--group", settings.group
    )
    assert described.returncode == 0, described.stderr[-2000:]
    row = next(line.split() for line in described.stdout.splitlines() if settings.topic in line)
    assert row[:6] == [settings.group, settings.topic, "0", "2", "6", "4"], described.stdout  # offset, end, lag


def test_a_reset_by_kafka_tool_is_honoured_by_the_next_run(settings, kafka):
    ensure_topic(settings, partitions=1)
    _singles(settings, 6)
    reset = kafka.tool(
        CONSUMER_GROUPS_TOOL,
        "--bootstrap-server",
        kafka.bootstrap,
        "--reset-offsets",
        "--to-offset",
        "4",
        "--topic",
        f"{settings.topic}:0",
        "--group",
        settings.group,
        "--execute",
    )
    assert reset.returncode == 0, reset.stderr[-2000:]
    assert _committed(settings) == {0: 4}
    report = pipeline.run_once(settings, run_id="after-tool-reset")
    part = report["partitions"]["0"]
    assert (part["start"], part["end"], part["records_read"]) == (4, 6, 2)
    assert _committed(settings) == {0: 6}


def test_rewind_to_earliest_re_reads_and_emits_each_waveform_once(settings, spark):
    ensure_topic(settings, partitions=1)
    records = []
    for i, n in enumerate((1, 3, 2)):
        recs, _ = waveform_records(f"e2e-{i}", n, seed=i)
        records += recs
    produce_in_order(settings, records)
    first = pipeline.run_once(settings, run_id="e2e-first")
    assert first["waveforms"] == {"output_new": 3} and _committed(settings) == {0: 6}
    rows = output_rows(spark, settings)

    code, out = run_cli(settings, "rewind", "--to-earliest", "--execute", "--reason", "reprocess")
    assert code == 0, out
    assert _committed(settings) == {0: 0}
    second = pipeline.run_once(settings, run_id="e2e-second")
    part = second["partitions"]["0"]
    assert (part["start"], part["end"], part["records_read"]) == (0, 6, 6), "the rewind makes the run re-read"
    assert second["waveforms"].get("output_new", 0) == 0 and second["waveforms"]["output_already_written"] == 3
    assert output_rows(spark, settings) == rows
    assert_output_unique(spark, settings)
    assert _committed(settings) == {0: 6}


def test_the_rewind_dag_refuses_then_applies_and_audits_who(settings):
    from airflow.dag_processing.dagbag import DagBag

    from wavepipe.local.airflow import DAGS_FOLDER, dags_test

    bag = DagBag(dag_folder=str(DAGS_FOLDER / "wavepipe_rewind.py"))
    assert bag.import_errors == {}
    dag = bag.dags["wavepipe_rewind"]
    assert dag.schedule is None and [t.task_id for t in dag.tasks] == ["rewind"]
    assert set(dag.params) == {"topic", "group", "partitions", "mode", "value", "execute", "force", "reason"}

    ensure_topic(settings, partitions=2)
    _singles(settings, 5, partition=0)
    _singles(settings, 5, partition=1)
    _commit(settings, {0: 5, 1: 5})
    conf = {
        "topic": settings.topic,
        "group": settings.group,
        "partitions": "1",
        "mode": "offset",
        "value": "2",
        "execute": True,
        "reason": "dag test",
    }
    store = RunStore(settings)
    store.claim_group(settings.group, "run-in-flight")
    refused = dags_test(settings, "wavepipe_rewind", conf=conf, capture=True)
    log = refused.stdout + refused.stderr
    assert "run-in-flight" in log and "wavepipe abandon" in log, log[-5000:]
    assert "new_state=skipped" in log and "new_state=failed" not in log, "a refusal is no failed run"
    assert "lag before -> after" in log, "the table is logged also when refused"
    assert _committed(settings, (0, 1)) == {0: 5, 1: 5}
    store.release_group(settings.group, "run-in-flight")

    dags_test(settings, "wavepipe_rewind", conf=conf)
    assert _committed(settings, (0, 1)) == {0: 5, 1: 2}
    first, record = _audit(settings)
    assert first["outcome"] == "refused" and "run-in-flight" in first["message"]
    assert record["outcome"] == "applied" and record["reason"] == "dag test"
    assert record["who"] == "dag_test"  # the triggering user `airflow dags test` names
    assert record["origin"].startswith("airflow:wavepipe_rewind/")
    assert record["partitions"] == {"1": {**record["partitions"]["1"], "from": 5, "to": 2}}


def test_scan_skips_transaction_markers_and_aborted_chunks(settings):
    ensure_topic(settings, partitions=1)
    a, _ = waveform_records("tx-a", 3, seed=1)
    b, _ = waveform_records("tx-b", 2, seed=2)
    c, _ = waveform_records("tx-c", 4, seed=3)
    producer = Producer(settings.kafka_config(**{"transactional.id": f"tx-{settings.topic}"}))
    producer.init_transactions(30)
    # a0 a1 @0-1, marker @2, b (aborted) @3-4, marker @5, a2 c0 c1 @6-8, marker @9, c2 c3 @10-11, marker @12
    for records, commit in (([a[0], a[1]], True), (b, False), ([a[2], c[0], c[1]], True), (c[2:], True)):
        producer.begin_transaction()
        produce_in_order(settings, records, producer=producer)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    assert _plan(settings, "offset", "4").partitions[0].final == 0  # a is open across the aborted b
    assert _plan(settings, "offset", "10").partitions[0].final == 7  # inside c
    assert _plan(settings, "offset", "9").partitions[0].final == 7  # a marker inside c
    assert _plan(settings, "latest").partitions[0].final == 13
