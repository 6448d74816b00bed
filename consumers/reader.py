"""Bounded reading: exactly the planned ``[start, end)`` of one partition, staged to files.

The reader assigns the partition (no group membership, no rebalances), seeks to ``start``,
reads with ``read_committed`` and stops once its position reaches ``end``, also when the last
offsets before ``end`` are transaction markers or aborted records that Kafka never delivers.
Records that break the chunk protocol are staged as dead letters with their reason; an error of
wavepipe's own code while parsing one (anything but a ``ProtocolError``) fails the read, so a bug is
never committed past as if the record were bad.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from wavepipe.consumers.kafka_admin import group_consumer
from wavepipe.consumers.staging import (
    CHUNK_SCHEMA,
    DIGEST_SCHEMA,
    InOrderDigests,
    StagedFile,
    chunk_row,
    dead_letter_row,
)
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import StepFailedError
from wavepipe.contracts.plan import OffsetRange, RunPlan
from wavepipe.contracts.protocol import ProtocolError, parse_chunk
from wavepipe.contracts.rows import DEAD_LETTER_SCHEMA
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import ReadStats
from wavepipe.faults import armed, failpoint
from wavepipe.run_store import RunStore, digest_path, staged_paths

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 5.0


class ReaderError(StepFailedError):
    """A partition's range could not be read as planned; the message says why."""


def read_range(settings: Settings, run_id: str, partition: int, plan: RunPlan | None = None) -> ReadStats:
    """Read and stage the planned range of ``partition`` for run ``run_id`` (``plan``: its plan,
    when the caller has it; else it is read); return its counts."""
    store = RunStore(settings)
    plan = plan or store.load_plan(run_id)
    if plan is None:
        raise ReaderError(f"run {run_id} has no plan; plan it first")
    rng = plan.range_for(partition)
    stats = ReadStats(rng.topic, rng.partition, rng.start, rng.end)
    chunk_path, dead_path = staged_paths(store, run_id, rng)
    flush, spool = settings.staging_flush_bytes, settings.spool_dir / run_id
    chunks = StagedFile(chunk_path, CHUNK_SCHEMA, flush, spool)
    dead = StagedFile(dead_path, DEAD_LETTER_SCHEMA, flush, spool)
    digests = StagedFile(digest_path(store, run_id, rng), DIGEST_SCHEMA, flush, spool)
    staged = (digests, chunks, dead)  # the chunks after their digests: a range is staged once both are
    began = time.monotonic()
    try:
        if rng.size:
            _consume(settings, plan.group, rng, stats, chunks, dead, digests)
        for f in staged:
            f.commit()
    except BaseException:
        for f in staged:
            f.abort()
        raise
    stats.seconds = round(time.monotonic() - began, 3)
    store.save_result(run_id, Step.consume(rng), stats)
    log.info(
        "%s[%d] [%d, %d): %d chunks, %d dead letters, %d gap offsets, %.1f MB in %.1fs (%.1f MB/s)",
        rng.topic,
        rng.partition,
        rng.start,
        rng.end,
        stats.chunks,
        stats.dead_letters,
        stats.gap_offsets,
        stats.payload_bytes / 1e6,
        stats.seconds,
        stats.payload_bytes / 1e6 / max(stats.seconds, 1e-9),
    )
    return stats


def _consume(
    settings: Settings,
    group: str,
    rng: OffsetRange,
    stats: ReadStats,
    chunks: StagedFile,
    dead: StagedFile,
    digests: StagedFile,
) -> None:
    consumer = group_consumer(
        settings,
        group,
        **{
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "queued.max.messages.kbytes": 128 * 1024,
        },
    )
    tp = TopicPartition(rng.topic, rng.partition, rng.start)
    consumer.assign([tp])
    hashing = InOrderDigests(rng.topic, rng.partition)
    points = armed()  # read once: a lookup of the environment per record costs a tenth of the parsing
    last_progress = time.monotonic()
    last_report = began = time.monotonic()
    done = False
    try:
        while not done:
            # Ask for no more than the range still holds, so a short range does not wait out the
            # timeout for a full batch (EOF events count as messages too).
            want = max(1, min(1000, rng.end - (stats.last_offset + 1 if stats.last_offset is not None else rng.start)))
            messages = consumer.consume(num_messages=want, timeout=0.5)
            now = time.monotonic()
            if not messages:
                done = _idle_done(consumer, tp, rng, now - last_progress, settings.reader_stall_timeout_s)
                continue
            last_progress = now
            for msg in messages:
                done = _past_range(msg, rng)
                if done:
                    break
                _stage(msg, rng, stats, chunks, dead, digests, hashing, points)
                done = msg.offset() == rng.end - 1
                if done:
                    break
            if now - last_report >= PROGRESS_EVERY_S:
                last_report = now
                log.info("%s", progress_line(rng, stats, now - began))
    finally:
        consumer.close()


def _idle_done(consumer, tp: TopicPartition, rng: OffsetRange, idle_s: float, stall_timeout_s: float) -> bool:
    """After a poll that brought nothing: True when the range is read to its end; an error when
    nothing came for ``stall_timeout_s``."""
    if _position(consumer, tp) >= rng.end:
        return True
    if idle_s > stall_timeout_s:
        raise ReaderError(
            f"{rng.topic}[{rng.partition}]: no progress for {stall_timeout_s:.0f}s "
            f"at offset {_position(consumer, tp)}, planned end {rng.end}. Is the broker up "
            f"(wavepipe kafka status)? Retrying the task re-reads the same range."
        )
    return False


def _past_range(msg, rng: OffsetRange) -> bool:
    """True when ``msg`` ends the range (the partition's end, or an offset past the plan's); an
    error for a log truncated after planning, an offset deleted since, or any other Kafka error."""
    err = msg.error()
    if err is None:
        return msg.offset() >= rng.end
    if err.code() == KafkaError._PARTITION_EOF:
        if msg.offset() < rng.end:
            raise ReaderError(
                f"{rng.topic}[{rng.partition}] ends at {msg.offset()} but the plan reads to "
                f"{rng.end}: the log was truncated after planning. Re-plan the run."
            )
        return True
    if err.code() == KafkaError._AUTO_OFFSET_RESET:
        raise ReaderError(
            f"{rng.topic}[{rng.partition}]: offset {rng.start} was deleted (retention) after this "
            f"run was planned ({err.str()}); retries of this plan cannot succeed. Release it with "
            f"`wavepipe abandon` and start a new run: it names the lost range, and "
            f"--skip-lost-offsets goes on past it."
        )
    raise KafkaException(err)


def progress_line(rng: OffsetRange, stats: ReadStats, seconds: float) -> str:
    """One progress line of a partition being read: records of the range, MB and MB/s so far."""
    done = (stats.last_offset + 1 - rng.start) if stats.last_offset is not None else 0
    mb = stats.payload_bytes / 1e6
    return (
        f"consuming {rng.topic}[{rng.partition}]: {stats.records} records ({100 * done / max(rng.size, 1):.0f}% "
        f"of [{rng.start}, {rng.end})), {mb:.1f} MB, {mb / max(seconds, 1e-9):.1f} MB/s"
    )


def _position(consumer, tp: TopicPartition) -> int:
    pos = consumer.position([TopicPartition(tp.topic, tp.partition)])[0].offset
    return pos if pos >= 0 else tp.offset


def _stage(
    msg,
    rng: OffsetRange,
    stats: ReadStats,
    chunks: StagedFile,
    dead: StagedFile,
    digests: StagedFile,
    hashing: InOrderDigests,
    points: str,
) -> None:
    offset = msg.offset()
    _, timestamp_ms = msg.timestamp()
    value = msg.value()
    headers = msg.headers()
    stats.records += 1
    stats.first_offset = offset if stats.first_offset is None else stats.first_offset
    stats.last_offset = offset
    try:
        chunk = parse_chunk(headers, value)
    except ProtocolError as exc:  # a malformed record; any other error is a defect of wavepipe and stops the read
        dead.add(
            dead_letter_row(
                rng.topic, rng.partition, offset, timestamp_ms, msg.key(), headers, value, exc.reason, exc.detail
            ),
            len(value or b""),
        )
        stats.dead_letters += 1
        if points:
            failpoint("consume.record", points, rng.name)  # hits counted per reader
        return
    chunks.add(chunk_row(rng.topic, rng.partition, offset, timestamp_ms, chunk), len(chunk.payload))
    whole = hashing.add(chunk, offset)
    if whole is not None:
        digests.add(whole, 256)  # about a row's size: the rows are flushed like the chunks
    if timestamp_ms >= 0:  # chunks only: a junk record's timestamp must not age the waveforms
        stats.max_timestamp_ms = max(timestamp_ms, stats.max_timestamp_ms or timestamp_ms)
    stats.chunks += 1
    stats.payload_bytes += len(chunk.payload)
    if points:
        failpoint("consume.record", points, rng.name)
