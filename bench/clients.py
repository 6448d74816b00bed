"""Processes the benchmark starts: the ceiling reader and the hand-written Python consumer.

``python -m wavepipe.bench.clients ceiling ...`` reads one partition's range with the fewest steps
confluent-kafka allows and appends the values to one file; ``... pyconsumer ...`` is what a user
writes by hand: one process, every partition, reassembly in a dict, Parquet out. Each prints one
JSON line with its counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

FETCH = {  # the same fetch sizes wavepipe's reader uses
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "queued.max.messages.kbytes": 128 * 1024,
}

OUTPUT_SCHEMA = pa.schema(
    [
        ("waveform_id", pa.string()),
        ("source", pa.string()),
        ("start_time", pa.timestamp("us", tz="UTC")),
        ("dtype", pa.string()),
        ("channels", pa.int32()),
        ("sample_rate", pa.float64()),
        ("size_bytes", pa.int64()),
        ("n_chunks", pa.int32()),
        ("checksum", pa.string()),
        ("payload", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
    ]
)


def _consumer(bootstrap: str) -> Consumer:
    from wavepipe.consumers.kafka_admin import new_consumer

    return new_consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "wavepipe-bench-unused",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **FETCH,
        }
    )


def ceiling(bootstrap: str, topic: str, partition: int, start: int, end: int, out: Path) -> dict:
    """Values of ``[start, end)`` appended to ``out`` (fsynced): the floor of any reader's work."""
    consumer = _consumer(bootstrap)
    consumer.assign([TopicPartition(topic, partition, start)])
    records = nbytes = 0
    began = time.monotonic()
    with open(out, "wb", buffering=4 * 1024 * 1024) as fh:
        done = start >= end
        while not done:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        done = True
                        break
                    raise KafkaException(msg.error())
                value = msg.value()
                fh.write(value)
                records += 1
                nbytes += len(value)
                if msg.offset() >= end - 1:
                    done = True
                    break
        fh.flush()
        os.fsync(fh.fileno())
    consumer.close()
    return {"partition": partition, "records": records, "bytes": nbytes, "seconds": time.monotonic() - began}


def pyconsumer(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]], out: Path) -> dict:
    """One process reads every partition, reassembles in a dict, verifies sha256, writes Parquet."""
    from wavepipe.contracts.protocol import checksum, parse_chunk

    consumer = _consumer(bootstrap)
    todo = {p for p, (s, e) in ranges.items() if e > s}
    consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in sorted(todo)])
    pending: dict[str, dict] = {}
    rows: dict[str, list] = {name: [] for name in OUTPUT_SCHEMA.names}
    buffered = 0
    counts = {"records": 0, "waveforms": 0, "bad_checksum": 0, "bytes": 0}
    tmp = out.with_name(f".{out.name}.tmp")
    writer = pq.ParquetWriter(tmp, OUTPUT_SCHEMA, compression="zstd")

    def flush():
        nonlocal rows, buffered
        if rows["waveform_id"]:
            writer.write_table(pa.Table.from_pydict(rows, schema=OUTPUT_SCHEMA))
            rows = {name: [] for name in OUTPUT_SCHEMA.names}
            buffered = 0

    while todo:
        for msg in consumer.consume(num_messages=1000, timeout=1.0):
            p = msg.partition()
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(p)
                    continue
                raise KafkaException(msg.error())
            if p not in todo:
                continue
            offset = msg.offset()
            if offset >= ranges[p][1]:
                todo.discard(p)
                consumer.pause([TopicPartition(topic, p)])
                continue
            chunk = parse_chunk(msg.headers(), msg.value())
            counts["records"] += 1
            meta = chunk.meta
            w = pending.get(meta.waveform_id)
            if w is None:
                w = pending[meta.waveform_id] = {"parts": {}, "chunk": chunk, "p": p, "first": offset}
            w["parts"][chunk.seq] = chunk.payload
            w["last"] = offset
            if len(w["parts"]) == chunk.count:
                del pending[meta.waveform_id]
                payload = b"".join(w["parts"][i] for i in range(chunk.count))
                first = w["chunk"]
                if checksum(payload) != first.checksum:
                    counts["bad_checksum"] += 1
                    continue
                for name, value in (
                    ("waveform_id", meta.waveform_id),
                    ("source", meta.source),
                    ("start_time", meta.start_ns // 1000),
                    ("dtype", meta.dtype),
                    ("channels", meta.channels),
                    ("sample_rate", meta.sample_rate),
                    ("size_bytes", len(payload)),
                    ("n_chunks", chunk.count),
                    ("checksum", first.checksum),
                    ("payload", payload),
                    ("topic", topic),
                    ("partition", w["p"]),
                    ("first_offset", w["first"]),
                    ("last_offset", offset),
                ):
                    rows[name].append(value)
                counts["waveforms"] += 1
                counts["bytes"] += len(payload)
                buffered += len(payload)
                if buffered >= 64 * 1024 * 1024:
                    flush()
            if offset >= ranges[p][1] - 1:
                todo.discard(p)
                consumer.pause([TopicPartition(topic, p)])
    flush()
    writer.close()
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    consumer.close()
    counts["incomplete"] = len(pending)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("ceiling")
    c.add_argument("--bootstrap", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--partition", type=int, required=True)
    c.add_argument("--start", type=int, required=True)
    c.add_argument("--end", type=int, required=True)
    c.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("pyconsumer")
    a.add_argument("--bootstrap", required=True)
    a.add_argument("--topic", required=True)
    a.add_argument("--ranges", required=True, help='JSON {"partition": [start, end], ...}')
    a.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.mode == "ceiling":
        result = ceiling(args.bootstrap, args.topic, args.partition, args.start, args.end, args.out)
    else:
        ranges = {int(p): tuple(r) for p, r in json.loads(args.ranges).items()}
        result = pyconsumer(args.bootstrap, args.topic, ranges, args.out)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
