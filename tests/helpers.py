"""Test helpers: hand-made chunk records in a chosen order, and reading the tables back."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
from confluent_kafka import Producer

from wavepipe.config import Settings
from wavepipe.protocol import checksum, split_waveform

START = datetime(2026, 11, 2, 8, 30, tzinfo=timezone.utc)


def waveform_records(waveform_id: str, n_chunks: int, chunk_size: int = 256, seed: int = 0):
    """(records, checksum) of a float32 two-channel waveform split into exactly ``n_chunks``."""
    samples = np.random.default_rng(seed).normal(size=(n_chunks * chunk_size // 8, 2)).astype("<f4")
    records = split_waveform(samples, waveform_id=waveform_id, sample_rate=100.0, start_time=START,
                             source="test-src", chunk_size=chunk_size)
    assert len(records) == n_chunks
    return records, checksum(samples.tobytes())


def produce_in_order(settings: Settings, records, partition: int = 0, producer: Producer | None = None) -> None:
    """Produce ``records`` to one partition in exactly this order (idempotent, acks=all)."""
    own = producer is None
    producer = producer or Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    errors = []
    for key, headers, value in records:
        producer.produce(settings.topic, value=value, key=key, headers=headers, partition=partition,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
    if own:
        assert producer.flush(30) == 0
    assert not errors, errors


def output_rows(spark, settings: Settings):
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(settings.output_table))
    return sorted(
        (r["waveform_id"], r["checksum"], r["payload_sha"], r["run_id"])
        for r in df.select("waveform_id", "checksum", F.concat(F.lit("sha256:"), F.sha2("payload", 256)).alias("payload_sha"),
                           "run_id").collect()
    )


def committed_metadata(settings: Settings, partition: int = 0) -> dict:
    """The metadata wavepipe stored with the group's committed offset (run id, planned end)."""
    import json

    from confluent_kafka import TopicPartition

    from wavepipe.consumers.kafka_admin import group_consumer

    consumer = group_consumer(settings, settings.group)
    try:
        [tp] = consumer.committed([TopicPartition(settings.topic, partition)], timeout=30)
    finally:
        consumer.close()
    return json.loads(tp.metadata)
