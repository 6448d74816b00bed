"""Waveform boundaries around an offset: where a reader must start (and read to) so that it never
sees a waveform without its beginning (or, for a window, without its end).

Used by rewinds (move a target back to the first chunk of the waveform it falls into) and by
time-window backfills (where a window's start and end must be widened to whole waveforms).

The rule, for a partition and an ``offset``, over the chunks scanned around it:

- a waveform is *open* at an offset ``s`` when it has a chunk before ``s`` and a chunk at or
  after ``s``; at the partition's end (the forward scan reached it) a waveform with a chunk
  before ``s`` that is still missing chunks is open too: its remaining chunks are still to
  come, exactly as a run's safe offset treats it;
- ``first_offset`` is the smallest ``s <= offset`` at which no waveform is open: starting from
  ``offset``, move to the smallest offset of every open waveform (once its ``wp-seq`` 0 chunk
  is found) and repeat, because the new offset may fall inside another waveform (interleaved
  producers). It is ``offset`` itself when nothing is open there;
- ``close_offset`` is the offset just after the last chunk of every waveform whose ``wp-seq`` 0
  chunk is before ``offset`` and that still has chunks at or after ``offset``: a reader that
  starts at a window's start must read up to there to complete the waveforms that began before
  it. It is ``offset`` when there is none.

An open waveform whose seq-0 chunk is not found (deleted by retention, or further back than the
scan may go) cannot be completed from any offset; it does not move ``first_offset`` and is listed
in ``unresolved``. Records without valid protocol headers (``wp-id``, ``wp-seq``, ``wp-count``) are
ignored: they are dead letters to a run, not parts of a waveform.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from wavepipe.consumers.kafka_admin import group_consumer
from wavepipe.contracts.config import Settings
from wavepipe.contracts.protocol import H_COUNT, H_ID, H_SEQ

log = logging.getLogger(__name__)
#: Records read on each side in the first scan window; the window doubles until it suffices.
INITIAL_WINDOW = 256
#: Seconds one scan window may take before the scan fails (the broker stopped answering).
READ_TIMEOUT_S = 60.0


class ChunkPosition(NamedTuple):
    """Where one chunk of one waveform sits in the partition (the headers are all a scan reads)."""

    offset: int
    waveform_id: str
    seq: int
    count: int


@dataclass(frozen=True)
class Boundaries:
    """The waveform boundaries around ``offset`` (see the module docstring for the rule)."""

    offset: int
    #: Where a reader must start so that no waveform is seen without its beginning (<= offset).
    first_offset: int
    #: Where a reader starting before ``offset`` must read to, to complete the waveforms that
    #: began before ``offset`` (>= offset).
    close_offset: int
    #: Waveforms ``first_offset`` was moved back for (open at ``offset`` or at a step on the way).
    snapped_for: tuple[str, ...] = ()
    #: Open waveforms whose seq-0 chunk was not found: they cannot be completed from here.
    unresolved: tuple[str, ...] = ()
    #: Waveforms with a chunk before ``offset`` (and their seq-0 chunk found) still missing chunks
    #: in what was scanned: the forward scan goes on while there are any.
    incomplete: tuple[str, ...] = ()
    #: Waveforms with chunks at or after ``first_offset`` but no seq-0 chunk among the chunks given:
    #: they began before the scanned range (or lost their beginning), so the backward scan goes on.
    headless: tuple[str, ...] = ()
    #: Offsets scanned: ``[scanned_from, scanned_to)`` (equal to ``offset`` for the pure function).
    scanned_from: int = 0
    scanned_to: int = 0
    records_scanned: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class _Waveform:
    offsets: list[int] = field(default_factory=list)
    seqs: set[int] = field(default_factory=set)
    count: int = 0
    first_seq0: int | None = None

    @property
    def complete(self) -> bool:
        return self.count > 0 and len(self.seqs) >= self.count


def _group(chunks: Iterable[ChunkPosition | tuple[int, str, int, int]]) -> dict[str, _Waveform]:
    waveforms: dict[str, _Waveform] = {}
    for offset, waveform_id, seq, count in chunks:
        w = waveforms.setdefault(waveform_id, _Waveform())
        w.offsets.append(offset)
        if 0 <= seq < count:
            w.seqs.add(seq)
        w.count = max(w.count, count)
        if seq == 0 and (w.first_seq0 is None or offset < w.first_seq0):
            w.first_seq0 = offset
    for w in waveforms.values():
        w.offsets.sort()
    return waveforms


def decide_boundaries(
    chunks: Iterable[ChunkPosition | tuple[int, str, int, int]], offset: int, *, end_reached: bool = False
) -> Boundaries:
    """``first_offset`` / ``close_offset`` around ``offset`` from ``(offset, id, seq, count)`` chunk
    positions (pure). ``end_reached``: the chunks run up to the partition's end, so a waveform
    still missing chunks there is open (its rest is still to come)."""
    waveforms = _group(chunks)

    def is_open(w: _Waveform, s: int) -> bool:
        if not w.offsets or w.offsets[0] >= s:
            return False
        return w.offsets[-1] >= s or (end_reached and not w.complete)

    start, snapped, unresolved = offset, [], []
    while True:
        opened = [(wid, w) for wid, w in waveforms.items() if is_open(w, start)]
        movable = [(wid, w) for wid, w in opened if w.first_seq0 is not None]
        unresolved += [wid for wid, w in opened if w.first_seq0 is None and wid not in unresolved]
        target = min((w.offsets[0] for _, w in movable), default=start)
        if target >= start:
            break
        snapped += [wid for wid, w in movable if w.offsets[0] < start and wid not in snapped]
        start = target
    closing = [
        w.offsets[-1] + 1
        for w in waveforms.values()
        if w.first_seq0 is not None and w.first_seq0 < offset and w.offsets[-1] >= offset
    ]
    incomplete = [
        wid for wid, w in waveforms.items() if w.first_seq0 is not None and w.offsets[0] < offset and not w.complete
    ]
    headless = [
        wid for wid, w in waveforms.items() if w.first_seq0 is None and w.offsets[-1] >= start and wid not in unresolved
    ]
    return Boundaries(
        offset=offset,
        first_offset=start,
        close_offset=max(closing, default=offset),
        snapped_for=tuple(sorted(snapped)),
        unresolved=tuple(sorted(unresolved)),
        incomplete=tuple(sorted(incomplete)),
        headless=tuple(sorted(headless)),
        scanned_from=offset,
        scanned_to=offset,
    )


def chunk_position(offset: int, headers) -> ChunkPosition | None:
    """The chunk position a record's headers state, or None when they are not valid protocol
    headers (such a record is not part of any waveform)."""
    h: dict[str, bytes] = {}
    for name, value in headers or ():
        if name in (H_ID, H_SEQ, H_COUNT) and value is not None:
            if name in h and h[name] != value:
                return None
            h[name] = value
    try:
        waveform_id = h[H_ID].decode()
        seq, count = int(h[H_SEQ]), int(h[H_COUNT])
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
    if not waveform_id or count < 1 or not 0 <= seq < count:
        return None
    return ChunkPosition(offset, waveform_id, seq, count)


def read_positions(consumer, topic: str, partition: int, start: int, stop: int) -> tuple[list[ChunkPosition], int]:
    """Chunk positions of the committed records in ``[start, stop)`` (``stop`` at most the last
    stable offset) and how many records were read. Offsets without a record (transaction
    markers, aborted records) are skipped."""
    if stop <= start:
        return [], 0
    tp = TopicPartition(topic, partition, start)
    consumer.assign([tp])
    out: list[ChunkPosition] = []
    read, expected = 0, start
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"scanning {topic}[{partition}] [{start}, {stop}) made no progress for "
                    f"{READ_TIMEOUT_S:.0f}s; is the broker up?"
                )
            # ask for exactly what is left, so the call returns as soon as it is there (a short
            # batch waits the whole timeout: only when markers sit in the range)
            msgs = consumer.consume(max(1, min(1000, stop - expected)), timeout=1.0)
            done = False
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done = True
                        continue
                    raise KafkaException(err)
                if msg.offset() >= stop:
                    done = True
                    continue
                read += 1
                expected = msg.offset() + 1
                deadline = time.monotonic() + READ_TIMEOUT_S
                pos = chunk_position(msg.offset(), msg.headers())
                if pos is not None:
                    out.append(pos)
                if msg.offset() >= stop - 1:
                    done = True
            if done:
                break
            [position] = consumer.position([TopicPartition(topic, partition)])
            if position.offset >= stop:
                break
    finally:
        consumer.unassign()
    return out, read


def scan_boundaries(
    settings: Settings, topic: str, partition: int, offset: int, *, low: int, high: int, max_scan: int | None = None
) -> Boundaries:
    """Read the partition's records around ``offset`` and apply the rule of this module.

    ``low``/``high`` are the earliest retained and the last stable offset; ``max_scan`` (default
    ``settings.incomplete_after_offsets``) bounds how far from ``offset`` the scan goes on each
    side: a waveform spread over more offsets is quarantined as incomplete by a run anyway.
    The scan starts with ``INITIAL_WINDOW`` records on each side and doubles while an open
    waveform's seq-0 chunk is still missing, or a waveform seen after the start has no seq-0
    chunk in the window (backwards) or a waveform that began before
    ``offset`` is still missing chunks (forwards). Reads with a throwaway, assign-only,
    read_committed consumer: it never joins or commits for any group.
    """
    max_scan = settings.incomplete_after_offsets if max_scan is None else max_scan
    max_scan = max_scan if max_scan > 0 else max(high - low, 1)
    offset = min(max(offset, low), high)
    floor, ceiling = max(low, offset - max_scan), min(high, offset + max_scan)
    consumer = group_consumer(
        settings,
        f"wavepipe-scan-{uuid.uuid4().hex[:12]}",
        **{
            "enable.partition.eof": True,
            "fetch.max.bytes": 16 * 1024 * 1024,
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
        },
    )
    try:
        found = _widening_scan(consumer, topic, partition, offset, (floor, ceiling), end=high)
    finally:
        consumer.close()
    notes = []
    if found.unresolved:
        limit = "the earliest retained" if found.scanned_from <= low else "the scan limit"
        notes.append(
            f"waveform(s) {', '.join(found.unresolved[:5])} started before offset {found.scanned_from} "
            f"({limit}) and cannot be completed"
        )
    log.info(
        "%s[%d] around %d: first %d, close %d (scanned [%d, %d), %d records)",
        topic,
        partition,
        offset,
        found.first_offset,
        found.close_offset,
        found.scanned_from,
        found.scanned_to,
        found.records_scanned,
    )
    return replace(found, notes=notes)


def _widening_scan(consumer, topic: str, partition: int, offset: int, limits: tuple[int, int], end: int) -> Boundaries:
    """``decide_boundaries`` on the records read around ``offset``, from ``INITIAL_WINDOW`` on
    each side, doubling while a side still needs more (see ``scan_boundaries``) and within
    ``limits`` (floor, ceiling); ``end``: the partition's last stable offset."""
    floor, ceiling = limits
    chunks: list[ChunkPosition] = []
    back = fwd = offset
    records = 0
    window = INITIAL_WINDOW
    need_back = need_fwd = True
    while True:
        if need_back and back > floor:
            new_back = max(floor, offset - window)
            got, n = read_positions(consumer, topic, partition, new_back, back)
            chunks, back, records = got + chunks, new_back, records + n
        if need_fwd and fwd < ceiling:
            new_fwd = min(ceiling, offset + window)
            got, n = read_positions(consumer, topic, partition, fwd, new_fwd)
            chunks, fwd, records = chunks + got, new_fwd, records + n
        result = decide_boundaries(chunks, offset, end_reached=fwd >= end)
        need_back = bool(result.unresolved or result.headless) and back > floor
        need_fwd = bool(result.incomplete) and fwd < ceiling
        if not (need_back or need_fwd):
            return replace(result, scanned_from=back, scanned_to=fwd, records_scanned=records)
        window *= 2
