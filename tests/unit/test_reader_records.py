"""The reader's verdict on one record: a record that breaks the chunk protocol is a dead letter
with its reason and the read goes on; an error of wavepipe's own parsing code stops the read, so a
bug is never staged (and committed past) as if the record were bad."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Message

from wavepipe.consumers import reader
from wavepipe.consumers.staging import CHUNK_SCHEMA, DIGEST_SCHEMA, InOrderDigests, StagedFile
from wavepipe.contracts import protocol
from wavepipe.contracts.plan import OffsetRange
from wavepipe.contracts.rows import DEAD_LETTER_SCHEMA
from wavepipe.contracts.steps import ReadStats

RANGE = OffsetRange("t", 0, 0, 10)


def _files(tmp_path):
    return [StagedFile(str(tmp_path / f"{n}.parquet"), s, 1 << 20, tmp_path) for n, s in
            (("chunks", CHUNK_SCHEMA), ("dead", DEAD_LETTER_SCHEMA), ("digests", DIGEST_SCHEMA))]  # fmt: skip


def _stage(msg, tmp_path):
    chunks, dead, digests = _files(tmp_path)
    stats = ReadStats("t", 0, 0, 10)
    reader._stage(msg, RANGE, stats, chunks, dead, digests, InOrderDigests("t", 0), "")
    for f in (chunks, dead, digests):
        f.commit()
    return stats, pq.read_table(tmp_path / "dead.parquet").to_pylist()


def _chunk_message(offset: int = 0) -> Message:
    _, headers, value = protocol.split_waveform(
        np.arange(8, dtype="<f4"), waveform_id="w", sample_rate=10.0, start_time=datetime(2026, 1, 1, tzinfo=UTC),
        source="s", chunk_size=1024,
    )[0]  # fmt: skip
    return Message(topic="t", partition=0, offset=offset, key=b"w", value=value, headers=headers, timestamp=(1, 1000))


def test_a_chunk_is_staged(tmp_path):
    stats, dead = _stage(_chunk_message(), tmp_path)
    assert (stats.chunks, stats.dead_letters, dead) == (1, 0, [])


def test_a_malformed_record_is_a_dead_letter_with_its_reason(tmp_path):
    msg = Message(topic="t", partition=0, offset=3, value=b"junk", headers=[("wp-version", b"1")], timestamp=(1, 5))
    stats, dead = _stage(msg, tmp_path)
    assert (stats.chunks, stats.dead_letters) == (0, 1)
    assert (dead[0]["offset"], dead[0]["reason"]) == (3, "missing_header")


def test_a_bug_while_parsing_stops_the_read(tmp_path, monkeypatch):
    def broken(headers, value):
        raise TypeError("a defect of wavepipe's parser")

    monkeypatch.setattr(reader, "parse_chunk", broken)
    with pytest.raises(TypeError, match="defect"):
        _stage(_chunk_message(), tmp_path)
