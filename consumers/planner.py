"""Planning: decide a run's offset ranges once, store them, and hand the same plan to retries."""

from __future__ import annotations

import logging

from confluent_kafka.admin import OffsetSpec

from wavepipe.consumers.kafka_admin import committed_offsets, list_offsets, partitions_of
from wavepipe.config import Settings
from wavepipe.plan import OffsetRange, RunPlan, RunStore, utc_now

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
