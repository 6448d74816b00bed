"""Planning: decide a run's offset ranges once, store them, and hand the same plan to retries."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from confluent_kafka.admin import OffsetSpec

from wavepipe.consumers.kafka_admin import committed_offsets, list_offsets, partitions_of
from wavepipe.config import Settings
from wavepipe.plan import OffsetRange, RunPlan, RunStore, as_utc, utc_now

log = logging.getLogger(__name__)
#: A claim without a stored plan is taken over only after this long (its planner may be mid-way).
PLANNING_GRACE_S = 300.0


class RetentionGapError(RuntimeError):
    """The group's committed offset points at data the topic no longer retains."""


def record_cap(settings: Settings, max_records: int | None, max_bytes: int | None) -> int:
    """Records per partition per run (0 = no cap); a byte cap counts chunk_size bytes a record."""
    records = settings.max_records_per_partition if max_records is None else max_records
    byts = settings.max_bytes_per_partition if max_bytes is None else max_bytes
    caps = [c for c in (records, max(1, byts // settings.chunk_size) if byts else 0) if c > 0]
    return min(caps) if caps else 0


def plan_run(settings: Settings, run_id: str, *, topic: str | None = None, group: str | None = None,
             max_records: int | None = None, max_bytes: int | None = None,
             skip_lost_offsets: bool = False) -> RunPlan:
    """The frozen plan of ``run_id``: loaded if it exists, else planned now and stored first.

    Per partition, ``start`` is the group's committed offset (the earliest retained offset when it
    has none) and ``end`` is the last stable offset now (what a read_committed reader can reach),
    capped per partition. Claims the group, so a second run of the group is refused meanwhile.

    A committed offset the topic no longer retains raises ``RetentionGapError`` naming the lost
    range, unless ``skip_lost_offsets``: then the range starts at the earliest retained offset and
    the plan (and so the report) records what was skipped.
    """
    store = RunStore(settings)
    existing = store.load_plan(run_id)
    if existing is not None:
        store.claim_group(existing.group, run_id)
        log.info("run %s: reusing its frozen plan (%d offsets)", run_id, existing.total_offsets)
        return existing
    topic = topic or settings.topic
    group = group or settings.group
    holder = store.active_run(group)
    if holder is not None and holder != run_id and store.load_plan(holder) is None \
            and store.claim_age_s(group) > PLANNING_GRACE_S:
        store.release_group(group, holder)  # claimed long ago but never planned: nothing was read
    store.claim_group(group, run_id)
    try:
        cap = record_cap(settings, max_records, max_bytes)
        previous = store.previous_ranges(group, topic)
        partitions = partitions_of(settings, topic)
        committed = committed_offsets(settings, group, topic, partitions)
        earliest = list_offsets(settings, topic, partitions, OffsetSpec.earliest())
        stable = list_offsets(settings, topic, partitions, OffsetSpec.latest())
        ranges, lost, gaps = [], {}, []
        for p in partitions:
            start = committed[p] if committed[p] is not None else earliest[p]
            if start < earliest[p]:
                gaps.append(f"{topic}[{p}] [{start}, {earliest[p]})")
                lost[p] = [start, earliest[p]]
                start = earliest[p]
            end = max(start, stable[p])
            if cap:
                # The cap bounds the records new to this run. When the last run ended with the
                # same safe offset (a waveform longer than the cap is still pending there), the
                # range grows past that run's end instead of repeating it.
                seen_end = previous.get(p, [None, None])[1] if previous.get(p, [None])[0] == start else None
                end = min(end, max(start, seen_end or start) + cap)
            ranges.append(OffsetRange(topic, p, start, end))
        if gaps and not skip_lost_offsets:
            raise RetentionGapError(
                f"group {group!r} is behind what {topic} still retains: offsets {', '.join(gaps)} were "
                f"deleted before they were read. Nothing was read. To accept the loss and go on from the "
                f"earliest retained offsets, run with --skip-lost-offsets (DAG param skip_lost_offsets); "
                f"the run's report records the skipped ranges."
            )
        if gaps:
            log.warning("run %s: skipping offsets the topic no longer retains: %s", run_id, ", ".join(gaps))
        plan = RunPlan(
            run_id=run_id, topic=topic, group=group, created_at=utc_now(), ranges=tuple(ranges),
            previous=previous, caps={"records_per_partition": cap}, committed=committed, lost=lost,
            latest={p: stable[p] for p in partitions},
        )
        store.save_plan(plan)
    except BaseException:
        store.release_group(group, run_id)
        raise
    log.info("run %s: planned %d offsets over %d partitions", run_id, plan.total_offsets, len(ranges))
    return plan


class WindowError(ValueError):
    """A time window that cannot be planned (empty, or not closed yet)."""


def backfill_lane(group: str) -> str:
    """The claim (and report group) of ``group``'s window runs: one at a time, and never the
    incremental group itself, whose committed offsets a backfill must not move."""
    return f"{group}.backfill"


def offsets_for_time(settings: Settings, topic: str, partitions: list[int], when: datetime,
                     ends: dict[int, int]) -> dict[int, int]:
    """Per partition, the first offset whose record timestamp is at or after ``when`` (Kafka's
    offsets-for-times lookup); ``ends[p]`` where no record is that late yet."""
    ms = int(when.timestamp() * 1000)
    found = list_offsets(settings, topic, partitions, OffsetSpec.for_timestamp(ms))
    return {p: ends[p] if found[p] < 0 else min(found[p], ends[p]) for p in partitions}


def plan_window_run(settings: Settings, run_id: str, *, start: datetime, end: datetime,
                    topic: str | None = None, group: str | None = None) -> RunPlan:
    """The frozen plan of a time-window run (a backfill of ``[start, end)``).

    Per partition the window is ``[offsets_for_time(start), offsets_for_time(end))``: adjacent
    windows tile the partition, so every record belongs to exactly one. A waveform belongs to the
    window holding its first chunk (``wp-seq`` 0). The range read starts at the window's first
    offset (chunks there of a waveform begun earlier belong to the previous window and are set
    aside) and ends past the window's end offset, where the waveforms begun inside the window
    have all their chunks (``scan_boundaries``; at most ``incomplete_after_offsets`` further).

    Claims ``backfill_lane(group)``, not the group: the incremental runs go on meanwhile, and the
    window run never commits offsets.
    """
    from wavepipe.consumers.boundaries import scan_boundaries

    store = RunStore(settings)
    start, end = as_utc(start), as_utc(end)
    existing = store.load_plan(run_id)
    if existing is not None:
        if existing.window is None or [existing.window["start"], existing.window["end"]] != [start.isoformat(), end.isoformat()]:
            raise WindowError(f"run {run_id} was planned {'as an incremental run' if existing.window is None else 'for the window [' + existing.window['start'] + ', ' + existing.window['end'] + ')'}; "
                              "start a new run id for this window")
        store.claim_group(existing.group, run_id)
        log.info("run %s: reusing its frozen window plan", run_id)
        return existing
    if not start < end:
        raise WindowError(f"window [{start.isoformat()}, {end.isoformat()}) is empty")
    if end > datetime.now(timezone.utc):
        raise WindowError(f"window [{start.isoformat()}, {end.isoformat()}) has not closed yet; "
                          "backfill windows that ended (the incremental runs cover the present)")
    topic = topic or settings.topic
    lane = backfill_lane(group or settings.group)
    store.claim_group(lane, run_id)
    try:
        partitions = partitions_of(settings, topic)
        earliest = list_offsets(settings, topic, partitions, OffsetSpec.earliest())
        stable = list_offsets(settings, topic, partitions, OffsetSpec.latest())
        first = offsets_for_time(settings, topic, partitions, start, stable)
        last = offsets_for_time(settings, topic, partitions, end, stable)
        ranges, offsets, notes = [], {}, []
        for p in partitions:
            a, b = first[p], max(first[p], last[p])
            if 0 < earliest[p] == a < b:
                notes.append(f"{topic}[{p}]: the window starts at the earliest retained offset {a}; records "
                             "before it were deleted by retention, so any of them in the window cannot be reprocessed")
            read_end = b
            if a < b < stable[p]:  # waveforms begun in the window may go on after it
                read_end = max(b, scan_boundaries(settings, topic, p, b, low=earliest[p], high=stable[p],
                                                  max_scan=settings.incomplete_after_offsets).close_offset)
            offsets[str(p)] = [a, b]
            ranges.append(OffsetRange(topic, p, a, read_end))
        plan = RunPlan(
            run_id=run_id, topic=topic, group=lane, created_at=utc_now(), ranges=tuple(ranges),
            caps={}, committed={}, latest={p: stable[p] for p in partitions},
            window={"start": start.isoformat(), "end": end.isoformat(), "offsets": offsets, "notes": notes},
        )
        for note in notes:
            log.warning("run %s: %s", run_id, note)
        store.save_plan(plan)
    except BaseException:
        store.release_group(lane, run_id)
        raise
    log.info("run %s: window [%s, %s) is offsets %s; reading %s", run_id, start.isoformat(), end.isoformat(),
             offsets, {r.partition: [r.start, r.end] for r in plan.ranges})
    return plan
