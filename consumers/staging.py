"""Staged chunk records: columnar files named by topic/partition/range, written atomically.

A retry of the same range writes the same file name, so it replaces the earlier attempt instead
of adding to it. Files appear under their final name only once complete (write, fsync, rename;
on an object store: one put of the whole file).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from wavepipe import storage
from wavepipe.contracts.protocol import CHECKSUM_PREFIX, Chunk, output_facts
from wavepipe.contracts.rows import ROW_FACTS
from wavepipe.faults import failpoint

CHUNK_SCHEMA = pa.schema(
    [
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
        ("extension", pa.string()),  # protocol.Extension.as_json: null for a 1.0 waveform
    ]
)

#: A whole waveform the reader hashed while staging its chunks: its output row without the payload
#: (``protocol.output_facts``) and ``digest``, the sha256 of its chunks joined in sequence order.
DIGEST_SCHEMA = ROW_FACTS.append(pa.field("digest", pa.string()))


class InOrderDigests:
    """The sha256 of each waveform whose chunks one partition delivers in order: ``wp-seq`` 0, 1,
    ..., ``wp-count`` - 1, one content (the same ``wp-checksum`` and ``wp-count`` throughout).
    With keyed producers that is nearly every waveform, so its bytes are hashed once, by the
    reader that already holds them, and Spark verifies it from this row alone.

    Anything else (a gap, a repeat, a chunk of another content) drops the waveform's running hash;
    such a waveform gets no row, or a row the Spark side does not use (it uses one only when the
    waveform's chunks are all in this partition, each once), and is verified from its chunks. At
    most ``max_open`` waveforms are hashed at once; beyond that the oldest is dropped the same way.
    """

    def __init__(self, topic: str, partition: int, max_open: int = 10_000):
        self.topic = topic
        self.partition = partition
        self.max_open = max_open
        self._open: dict[str, dict] = {}  # insertion order: the oldest first

    def add(self, chunk: Chunk, offset: int) -> dict | None:
        """Take the next staged chunk; returns a ``DIGEST_SCHEMA`` row when it completes a waveform."""
        wid = chunk.meta.waveform_id
        w = self._open.pop(wid, None)
        if chunk.seq == 0:
            m = chunk.meta
            w = {
                "facts": {
                    "waveform_id": wid,
                    "source": m.source,
                    "dtype": m.dtype,
                    "channels": m.channels,
                    "sample_rate": m.sample_rate,
                    "start_ns": m.start_ns,
                    "checksum": chunk.checksum,
                    "topic": self.topic,
                    "extension": m.extension,
                },
                "count": chunk.count,
                "next": 0,
                "size": 0,
                "first": offset,
                "hash": hashlib.sha256(),
            }
        elif (
            w is None or chunk.seq != w["next"] or chunk.checksum != w["facts"]["checksum"] or chunk.count != w["count"]
        ):
            return None  # out of order or another content: verified from its chunks instead
        w["hash"].update(chunk.payload)
        w["size"] += len(chunk.payload)
        w["next"] += 1
        if w["next"] == w["count"]:
            row = output_facts(w["facts"], w["size"], w["count"], self.partition, w["first"], offset)
            return {**row, "digest": CHECKSUM_PREFIX + w["hash"].hexdigest()}
        self._open[wid] = w
        if len(self._open) > self.max_open:
            del self._open[next(iter(self._open))]
        return None


def chunk_row(topic: str, partition: int, offset: int, timestamp_ms: int, chunk: Chunk) -> dict:
    m = chunk.meta
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "waveform_id": m.waveform_id,
        "seq": chunk.seq,
        "chunk_count": chunk.count,
        "total_size": chunk.size,
        "checksum": chunk.checksum,
        "dtype": m.dtype,
        "channels": m.channels,
        "sample_rate": m.sample_rate,
        "start_ns": m.start_ns,
        "source": m.source,
        "chunk_len": len(chunk.payload),
        "payload": chunk.payload,
        "extension": m.extension,
    }


def dead_letter_row(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    headers,
    value: bytes | None,
    reason: str,
    detail: str,
) -> dict:
    printable = [[k, v.decode("utf-8", "backslashreplace") if v is not None else None] for k, v in headers or ()]
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "key": key,
        "headers": [{"key": k, "value": v} for k, v in headers or ()],
        "headers_json": json.dumps(printable),
        "value": value,
        "reason": reason,
        "detail": detail,
    }


class StagedFile:
    """Rows buffered in memory up to ``flush_bytes``, then written as one Parquet row group.

    ``path``: where the file goes, a local path or an object store's location. A local file is
    written beside it and renamed into place; an object is written in ``spool`` (a local folder)
    and put whole on ``commit``. Either way it appears only complete, under the name a retry of
    the range reproduces, which replaces it."""

    def __init__(self, path: str, schema: pa.Schema, flush_bytes: int, spool: Path):
        self.path = path
        self.schema = schema
        self.flush_bytes = flush_bytes
        self.rows = 0
        self.bytes = 0
        self._remote = storage.is_remote(path)
        folder = spool if self._remote else Path(path).parent
        folder.mkdir(parents=True, exist_ok=True)
        self._tmp = folder / f".{path.rpartition('/')[2]}.{os.getpid()}.{id(self):x}.tmp"
        self._buffer: dict[str, list] = {name: [] for name in schema.names}
        self._buffered_bytes = 0
        self._writer = pq.ParquetWriter(
            self._tmp,
            schema,
            compression="none",
            use_dictionary=False,
            write_statistics=["partition", "offset", "waveform_id"],
        )

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
        """Flush, then put in place under the final name: fsync and rename, or an upload."""
        self._flush()
        self._writer.close()
        if self._remote:
            try:
                storage.upload(self._parts(), self.path)
            finally:
                self._tmp.unlink(missing_ok=True)
            return
        with open(self._tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self._tmp, self.path)

    def _parts(self) -> Iterator[bytes]:
        """The written file in upload parts (``stage.upload``: a failpoint after each)."""
        with open(self._tmp, "rb") as fh:
            while part := fh.read(storage.PART_BYTES):
                yield part
                failpoint("stage.upload")

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._tmp.unlink(missing_ok=True)
