"""Records that come back, on the real broker and a real Spark: a dead letter is on the dead-letter
topic once whatever re-reads happen (a pending waveform's re-read, a rewind to earliest, a window
run), and a waveform id that returns is a re-delivery (same ``wp-checksum``: nothing happens) or a
conflict (another ``wp-checksum``: quarantined as ``id_conflict`` with both checksums)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from confluent_kafka import Producer

from tests.helpers import (
    assert_accounted,
    produce_in_order,
    quarter_hour_ago,
    read_topic,
    rows_by_id,
    run_cli,
    waveform_records,
    with_headers,
)
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic

pytestmark = pytest.mark.integration


def _produce(settings, records, when) -> None:
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    produce_in_order(settings, records, producer=producer, when=when)
    assert producer.flush(30) == 0


def _published_origins(settings) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every record on the dead-letter topic, sorted (repeats kept)."""
    origins = (h["wp-dlq-origin"].decode().rsplit("/", 2) for _, h in read_topic(settings, settings.dead_letter_topic))
    return sorted((topic, int(p), int(o)) for topic, p, o in origins)


def _table_origins(spark, settings) -> list[tuple[str, int, int]]:
    dead = spark.read.format("delta").load(str(settings.dead_letter_table)).collect()
    return sorted((r["topic"], r["partition"], r["offset"]) for r in dead)


def _quarantine(spark, settings) -> list[dict]:
    rows = spark.read.format("delta").load(str(settings.quarantine_table)).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: (r["waveform_id"], r["reason"]))


def test_dead_letters_go_out_once_and_a_reused_id_is_a_visible_conflict(settings, spark):
    settings = settings.replace(dead_letter_topic=f"{settings.topic}-dlq")
    ensure_topic(settings, partitions=1)
    ensure_topic(settings, settings.dead_letter_topic, partitions=1)
    t0 = quarter_hour_ago(2)
    c, c_sum = waveform_records("c", 2, seed=1)
    a, a_sum = waveform_records("a", 2, seed=2)
    b, b_sum = waveform_records("b", 1, seed=3)
    b_other, b_other_sum = waveform_records("b", 2, seed=4)  # the id reused for another recording
    assert b_other_sum != b_sum
    # offsets 0-5: c stays pending (its second chunk comes later), so the next run re-reads 0-5
    _produce(
        settings,
        [c[0], *a, (b"k1", None, b"junk 1"), *b, with_headers(a, 0, **{"wp-version": b"9"})],
        t0 + timedelta(minutes=1),
    )
    first = pipeline.run_once(settings, run_id="first")
    assert_accounted(spark, settings, first)
    assert first["waveforms"] == {"output_new": 2, "pending": 1} and first["partitions"]["0"]["safe_offset"] == 0
    assert (
        _published_origins(settings)
        == _table_origins(spark, settings)
        == [(settings.topic, 0, 3), (settings.topic, 0, 5)]
    )

    # offsets 6-11: c completes, a is delivered again (same content), b returns with other content
    _produce(settings, [c[1], *a, *b_other, (b"k3", None, b"junk 3")], t0 + timedelta(minutes=2))
    second = pipeline.run_once(settings, run_id="second")
    assert_accounted(spark, settings, second)
    assert second["waveforms"] == {"output_new": 1, "output_already_written": 2, "quarantined:id_conflict": 1}
    assert second["partitions"]["0"]["quarantine_reasons"] == {"id_conflict": 2}
    [conflict] = _quarantine(spark, settings)  # none for a: a re-delivery is not a conflict
    assert (conflict["waveform_id"], conflict["reason"], conflict["first_offset"], conflict["records"]) == (
        "b",
        "id_conflict",
        9,
        2,
    )
    assert (conflict["checksum"], conflict["output_checksum"]) == (b_other_sum, b_sum)
    assert b_sum in conflict["detail"] and b_other_sum in conflict["detail"], conflict["detail"]
    output = rows_by_id(spark, settings)
    assert {k: v[0] for k, v in output.items()} == {"a": a_sum, "b": b_sum, "c": c_sum}
    origins = [(settings.topic, 0, o) for o in (3, 5, 11)]
    assert _published_origins(settings) == _table_origins(spark, settings) == origins, (
        "the re-read 3 and 5 went out once"
    )

    # a rewind to earliest re-reads everything: nothing is published or quarantined again
    code, out = run_cli(settings, "rewind", "--to-earliest", "--execute", "--reason", "reprocess")
    assert code == 0, out
    third = pipeline.run_once(settings, run_id="third")
    assert_accounted(spark, settings, third)
    assert third["waveforms"] == {"output_already_written": 3, "quarantined:id_conflict": 1}
    assert third["partitions"]["0"]["dead_letter"] == 3
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 12}
    assert _published_origins(settings) == _table_origins(spark, settings) == origins
    assert _quarantine(spark, settings) == [conflict]
    assert rows_by_id(spark, settings) == output

    # a window run recomputes the window's rows (both contents of b inside it) and publishes nothing
    window = pipeline.run_once(settings, window=(t0, t0 + timedelta(minutes=15)))
    assert window["status"] == "window_replaced"
    assert window["waveforms"] == {"output_new": 3, "quarantined:id_conflict": 1}
    assert _published_origins(settings) == _table_origins(spark, settings) == origins
    assert [
        (q["waveform_id"], q["reason"], q["checksum"], q["output_checksum"]) for q in _quarantine(spark, settings)
    ] == [("b", "id_conflict", b_other_sum, b_sum)]
    assert {k: v[:2] for k, v in rows_by_id(spark, settings).items()} == {k: v[:2] for k, v in output.items()}
