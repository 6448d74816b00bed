"""The chunking producer against the real broker: keyed placement and delivery."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.protocol import H_ID

pytestmark = pytest.mark.integration


def java_murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Java DefaultPartitioner for a keyed record: toPositive(murmur2(key)) % partitions."""
    m, r, seed = 0x5BD1E995, 24, 0x9747B28C
    length = len(key)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= key[base + 2] << 16
    if tail >= 2:
        h ^= key[base + 1] << 8
    if tail >= 1:
        h ^= key[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def test_chunks_land_where_a_java_client_puts_their_key_in_order(settings):
    partitions = 4
    ensure_topic(settings, partitions=partitions)
    sent = produce_demo(settings, count=9, target_bytes=100_000)
    consumer = Consumer(settings.kafka_config(**{"group.id": "inspect", "enable.auto.commit": False}))
    consumer.assign([TopicPartition(settings.topic, p, 0) for p in range(partitions)])
    seen: dict[str, list[tuple[int, int, int]]] = {}
    total = sum(s.chunks for s in sent)
    records = 0
    while records < total:
        msg = consumer.poll(10)
        assert msg is not None, f"only {records} of {total} records came back"
        assert msg.error() is None, msg.error()
        headers = dict(msg.headers())
        seen.setdefault(headers[H_ID].decode(), []).append((msg.partition(), msg.offset(), int(headers["wp-seq"])))
        records += 1
    consumer.close()
    assert sorted(seen) == sorted(s.waveform_id for s in sent)
    for s in sent:
        chunks = seen[s.waveform_id]
        assert {p for p, _, _ in chunks} == {java_murmur2_partition(s.waveform_id.encode(), partitions)}
        assert [seq for _, _, seq in sorted(chunks)] == list(range(s.chunks)), "chunks in sequence order"
