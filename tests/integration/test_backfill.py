"""Time-window runs (backfills) against a real broker and Spark: each window is the offsets Kafka's
offsets-for-times lookup gives for its bounds, a waveform belongs to the window of its first
chunk (also when its chunks straddle the window's end), reprocessing a window replaces its rows,
and the incremental group's committed offsets never move."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import OffsetSpec

from tests.helpers import output_rows, run_cli, waveform_records
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, list_offsets
from wavepipe.pipeline import run_once

MINUTE = timedelta(minutes=1)
# record timestamps within the topic's retention (7 days), or the broker deletes them: two hours
# ago, on a quarter hour (the windows of wavepipe_ingest's 15-minute schedule)
_now = datetime.now(timezone.utc) - timedelta(hours=2)
T0 = _now.replace(minute=_now.minute - _now.minute % 15, second=0, microsecond=0)


def produce_at(settings, records, when: datetime, producer: Producer) -> None:
    """Produce ``records`` to partition 0 with record timestamps ``when`` (CreateTime)."""
    for key, headers, value in records:
        producer.produce(settings.topic, value=value, key=key, headers=headers, partition=0,
                         timestamp=int(when.timestamp() * 1000))


def produce_windows(settings) -> dict[str, int]:
    """Four waveforms around two 15-minute windows ``[T0, T0+15m)`` and ``[T0+15m, T0+30m)``:
    A inside the first, B straddling the edge (two chunks before it, two after), C inside the
    second, D after both. Returns the offset of each waveform's first chunk."""
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    a, _ = waveform_records("wf-A", 3, seed=1)
    b, _ = waveform_records("wf-B", 4, seed=2)
    c, _ = waveform_records("wf-C", 2, seed=3)
    d, _ = waveform_records("wf-D", 2, seed=4)
    produce_at(settings, a, T0 + 1 * MINUTE, producer)
    produce_at(settings, b[:2], T0 + 14 * MINUTE, producer)
    produce_at(settings, b[2:], T0 + 16 * MINUTE, producer)
    produce_at(settings, c, T0 + 20 * MINUTE, producer)
    produce_at(settings, d, T0 + 31 * MINUTE, producer)
    assert producer.flush(30) == 0
    return {"wf-A": 0, "wf-B": 3, "wf-C": 7, "wf-D": 9}


def rows_by_id(spark, settings) -> dict[str, tuple]:
    return {wid: (checksum, sha, run_id) for wid, checksum, sha, run_id in output_rows(spark, settings)}


def test_window_runs_replace_their_waveforms_and_leave_the_group_alone(settings, spark):
    ensure_topic(settings, partitions=1)
    first = produce_windows(settings)
    incremental = run_once(settings)
    assert incremental["waveforms"].get("output_new") == 4
    before = rows_by_id(spark, settings)
    group_offsets = committed_offsets(settings, settings.group, settings.topic, [0])
    assert group_offsets == {0: 11}

    w1 = run_once(settings, window=(T0, T0 + 15 * MINUTE))
    assert w1["status"] == "window_replaced" and w1["commit"] == {}
    # the window is offsets [0, 5): A and B's first half; B's second half is read to complete it
    assert w1["window"]["offsets"] == {"0": [first["wf-A"], 5]}
    part = w1["partitions"]["0"]
    assert (part["start"], part["end"]) == (0, first["wf-C"])
    assert part["output"] == 7 and part["other_window"] == 0 and part["pending"] == 0
    assert not w1["balance_errors"]

    w2 = run_once(settings, window=(T0 + 15 * MINUTE, T0 + 30 * MINUTE))
    part = w2["partitions"]["0"]
    # B's last two chunks open the second window's offsets but B is the first window's
    assert w2["window"]["offsets"] == {"0": [5, first["wf-D"]]}
    assert (part["start"], part["end"]) == (5, first["wf-D"])
    assert part["output"] == 2 and part["other_window"] == 2
    assert w2["waveforms"].get("output_new") == 1

    after = rows_by_id(spark, settings)
    assert sorted(after) == ["wf-A", "wf-B", "wf-C", "wf-D"]
    # the same waveforms, bit for bit; the windows' rows were rewritten by the window runs
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
    assert after["wf-A"][2] == after["wf-B"][2] == w1["run_id"]
    assert after["wf-C"][2] == w2["run_id"]
    assert after["wf-D"][2] == incremental["run_id"]
    # the incremental group did not move, and it has nothing new to read
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == group_offsets
    assert list_offsets(settings, settings.topic, [0], OffsetSpec.latest()) == {0: 11}

    # a second backfill of the first window replaces its rows again instead of adding to them
    again = run_once(settings, window=(T0, T0 + 15 * MINUTE))
    final = rows_by_id(spark, settings)
    assert sorted(final) == sorted(after)
    assert final["wf-A"][2] == final["wf-B"][2] == again["run_id"]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{settings.output_table}`").collect()
    replaces = [h for h in history if "replaceWhere" in str(h["operationParameters"])
                or "predicate" in str(h["operationParameters"]) and h["operation"] == "WRITE"]
    assert len(replaces) >= 2, [(h["operation"], h["operationParameters"]) for h in history]

    # `wavepipe status`: the group's offsets, lag and pending work, and the runs of both lanes
    code, out = run_cli(settings, "status")
    assert code == 0, out
    assert f"partition 0: committed 11, end 11, lag 0, pending 0 chunks of incomplete waveforms " \
           f"(run {incremental['run_id']})" in out
    assert f"{incremental['run_id']}: committed;" in out
    assert f"{again['run_id']}: window_replaced [{T0.isoformat()}, {(T0 + 15 * MINUTE).isoformat()});" in out


def test_a_window_that_has_not_closed_is_refused(settings):
    from wavepipe.consumers.planner import WindowError

    ensure_topic(settings, partitions=1)
    now = datetime.now(timezone.utc)
    with pytest.raises(WindowError, match="has not closed yet"):
        run_once(settings, window=(now - 10 * MINUTE, now + 5 * MINUTE))
    with pytest.raises(WindowError, match="is empty"):
        run_once(settings, window=(T0, T0))
