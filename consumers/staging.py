"""Staged chunk records: columnar files named by topic/partition/range, written atomically.

A retry of the same range writes the same file name, so it replaces the earlier attempt instead
of adding to it. Files appear under their final name only once complete (write, fsync, rename).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from wavepipe.protocol import Chunk

CHUNK_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("waveform_id", pa.string()),
    ("seq", pa.int32()),
    ("chunk_count", pa.int32()),
    ("total_size", pa.int64()),
    ("checksum", pa.string()),
    ("dtype", pa.string()),
    ("channels", pa.int32()),
    ("sample_rate", pa.float64()),
    ("start_ns", pa.int64()),
    ("source", pa.string()),
    ("chunk_len", pa.int32()),
    ("payload", pa.binary()),
])

DEAD_LETTER_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp_ms", pa.int64()),
    ("key", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("headers_json", pa.string()),
    ("value", pa.binary()),
    ("reason", pa.string()),
    ("detail", pa.string()),
])


def chunk_row(topic: str, partition: int, offset: int, timestamp_ms: int, chunk: Chunk) -> dict:
    m = chunk.meta
    return {
        "topic": topic, "partition": partition, "offset": offset, "timestamp_ms": timestamp_ms,
        "waveform_id": m.waveform_id, "seq": chunk.seq, "chunk_count": chunk.count,
        "total_size": chunk.size, "checksum": chunk.checksum, "dtype": m.dtype,
        "channels": m.channels, "sample_rate": m.sample_rate, "start_ns": m.start_ns,
        "source": m.source, "chunk_len": len(chunk.payload), "payload": chunk.payload,
    }


def dead_letter_row(topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
                    headers, value: bytes | None, reason: str, detail: str) -> dict:
    printable = [[k, v.decode("utf-8", "backslashreplace") if v is not None else None] for k, v in headers or ()]
    return {
        "topic": topic, "partition": partition, "offset": offset, "timestamp_ms": timestamp_ms,
        "key": key, "headers": [{"key": k, "value": v} for k, v in headers or ()],
        "headers_json": json.dumps(printable), "value": value, "reason": reason, "detail": detail,
    }


class StagedFile:
    """Rows buffered in memory up to ``flush_bytes``, then written as one Parquet row group."""

    def __init__(self, path: Path, schema: pa.Schema, flush_bytes: int):
        self.path = path
        self.schema = schema
        self.flush_bytes = flush_bytes
        self.rows = 0
        self.bytes = 0
        self._tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._buffer: dict[str, list] = {name: [] for name in schema.names}
        self._buffered_bytes = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(self._tmp, schema, compression="none", use_dictionary=False,
                                        write_statistics=["partition", "offset", "waveform_id"])

    def add(self, row: dict, payload_bytes: int) -> None:
        for name, column in self._buffer.items():
            column.append(row[name])
        self.rows += 1
        self.bytes += payload_bytes
        self._buffered_bytes += payload_bytes
        if self._buffered_bytes >= self.flush_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer[self.schema.names[0]]:
            return
        table = pa.Table.from_pydict(self._buffer, schema=self.schema)
        self._writer.write_table(table)
        self._buffer = {name: [] for name in self.schema.names}
        self._buffered_bytes = 0

    def commit(self) -> None:
        """Flush, fsync and move into place under the final name."""
        self._flush()
        self._writer.close()
        with open(self._tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)
