"""Committing a run's safe offsets to the consumer group, with the run id in the metadata.

Checked, then committed, per partition: the group must still be where it was when the run was
planned (or already at the safe offset, when a retry repeats a commit that went through), as read
just before the commit. Anything else means someone moved the group during the run (a rewind,
another consumer), and the commit is refused. Kafka offers no compare-and-set for offsets: a move
between that read and the commit is not seen. The run's claim on the group keeps other wavepipe
runs and rewinds out; Kafka's own tools refuse to reset a group with active members, not one
that commits without joining it.

With a dead-letter topic configured, the run's dead letters are produced and the offsets are
committed in one Kafka transaction (``send_offsets_to_transaction``): both happen or neither,
and a retry after a commit that went through publishes nothing twice. A record's origin (topic,
partition, offset) is dead-lettered on the topic once, whatever rewinds and re-reads happen: per
partition, the origin offsets whose dead letters are on the topic already are kept as intervals,
in the committed offset's metadata (written in the same transaction as the dead letters) and in a
ledger in the run state (``home`` or ``state_uri``), which survives a rewind or a Kafka tool's reset that drops the metadata;
only dead letters outside them are produced.
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import TopicPartition

from wavepipe.consumers.kafka_admin import answering, committed_positions, group_consumer, new_producer, offsets_client
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import ConflictError, StepFailedError, UnavailableError
from wavepipe.contracts.plan import RunPlan
from wavepipe.run_store import RunStore

log = logging.getLogger(__name__)
TIMEOUT_S = 60.0
#: Kafka keeps at most ``offset.metadata.max.bytes`` (default 4096) of metadata per committed
#: offset; wavepipe's stays under this, keeping the newest published intervals (the ledger has all).
METADATA_MAX_CHARS = 1024
#: Origin offsets as sorted, disjoint, non-adjacent ``[start, end)`` intervals.
Intervals = list[list[int]]


class OffsetsMovedError(ConflictError):
    """The group is not where this run can commit from: the run can never commit."""


class DeadLetterPublishError(UnavailableError):
    """Dead letters could not be published; nothing was committed and a retry may succeed."""


def commit_metadata(
    plan: RunPlan, partition: int, tables: str, published: Intervals | None = None, dead_letter_topic: str = ""
) -> str:
    """The committed offset's metadata: the run id, planned end and where the run published
    (``tables``: the group's progress is tied to them, ``tables_committed_to``); with a
    dead-letter topic, also that topic and the origin offsets whose dead letters are on it
    (``dlq``, the newest intervals that fit in ``METADATA_MAX_CHARS``)."""
    data: dict = {"run_id": plan.run_id, "planned_end": plan.range_for(partition).end, "tables": tables}
    if dead_letter_topic:
        kept = list(published or [])
        data.update(dlq_topic=dead_letter_topic, dlq=kept)
        while kept and len(json.dumps(data, separators=(",", ":"))) > METADATA_MAX_CHARS:
            kept.pop(0)
    return json.dumps(data, separators=(",", ":"))


def merge_intervals(intervals: Iterable[Sequence[int]]) -> Intervals:
    """The union of ``[start, end)`` intervals as sorted, disjoint intervals (touching ones joined,
    empty ones dropped)."""
    merged: Intervals = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def covers(intervals: Intervals, offset: int) -> bool:
    """Whether ``offset`` is inside one of the (merged) ``intervals``."""
    i = bisect.bisect_right(intervals, [offset, float("inf")]) - 1
    return i >= 0 and offset < intervals[i][1]


def published_in_metadata(metadata: str | None, dead_letter_topic: str) -> Intervals:
    """The origin offsets whose dead letters a wavepipe commit recorded as published to
    ``dead_letter_topic`` (none for metadata of another tool, or of another dead-letter topic)."""
    try:
        data = json.loads(metadata) if metadata else {}
        if not isinstance(data, dict) or data.get("dlq_topic") != dead_letter_topic:
            return []
        return merge_intervals(data.get("dlq") or [])
    except (ValueError, TypeError):
        return []


def ledger_published(settings: Settings, topic: str) -> dict[int, Intervals]:
    """Per partition, the origin offsets of ``topic`` whose dead letters the ledger records as
    published to ``settings.dead_letter_topic``. The ledger (``RunStore.ledger``) is, per
    dead-letter topic and partition, ``{dead_letter_topic: {partition: [[start, end), ...]}}``."""
    store = RunStore(settings)
    try:
        mine = store.ledger(topic).get(settings.dead_letter_topic, {})
        return {int(p): merge_intervals(v) for p, v in mine.items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise StepFailedError(
            f"the dead-letter ledger {store.state.where(f'dead-letters/{topic}.json')} cannot be read ({exc}); "
            "nothing was published or committed. It lists the offsets whose dead letters are on the dead-letter "
            "topic already: repair it, or delete it to rely on the committed offsets' metadata alone (after a "
            "rewind, dead letters may then go out again)."
        ) from None


def record_published(settings: Settings, topic: str, published: dict[int, Intervals]) -> None:
    """Add ``published`` (per partition) to the ledger of ``topic`` (a whole replace)."""
    store = RunStore(settings)
    data = store.ledger(topic)
    mine = data.setdefault(settings.dead_letter_topic, {})
    for p, intervals in published.items():
        mine[str(p)] = merge_intervals(mine.get(str(p), []) + list(intervals))
    store.save_ledger(topic, data)


def tables_committed_to(metadata: str | None) -> str | None:
    """Where the run that committed this offset published (None: another tool or a rewind
    committed it, or a wavepipe before the tie)."""
    return _metadata_text(metadata, "tables")


def committed_run_id(metadata: str | None) -> str | None:
    """The run id in a committed offset's metadata (None if another tool committed it)."""
    return _metadata_text(metadata, "run_id")


def _metadata_text(metadata: str | None, key: str) -> str | None:
    try:
        found = json.loads(metadata).get(key) if metadata else None
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def commit_safe_offsets(
    settings: Settings,
    plan: RunPlan,
    safe: dict[int, int],
    dead_letters: Callable[[dict[int, Intervals]], Iterable[dict]] | None = None,
) -> dict[int, dict]:
    """Commit ``safe[partition]`` for every planned partition; return before/after per partition
    (and, with a dead-letter topic, ``dead_letters_published``).

    With ``settings.dead_letter_topic`` set, ``dead_letters(published)`` gives the staged
    dead-letter rows of the plan's ranges whose origin offset is not in ``published[partition]``
    (the origin offsets whose dead letters are on the topic already); only those are produced, in
    the same transaction as the offsets, and then the plan's ranges count as published. So each
    origin is on the topic once, whatever rewinds, re-reads and retries happen; a retry of a commit
    that went through publishes nothing.
    """
    if not settings.dead_letter_topic:
        return _commit_offsets(settings, plan, safe, None)
    with RunStore(settings).lock(
        f"dead-letters/.{plan.topic}.json.lock", f"the dead-letter ledger of {plan.topic}", wait_s=300
    ):
        return _commit_offsets(settings, plan, safe, dead_letters)


def _commit_offsets(
    settings: Settings,
    plan: RunPlan,
    safe: dict[int, int],
    dead_letters: Callable[[dict[int, Intervals]], Iterable[dict]] | None,
) -> dict[int, dict]:
    partitions = [r.partition for r in plan.ranges]
    dlq = settings.dead_letter_topic
    current = committed_positions(settings, plan.group, plan.topic, partitions)
    before = {p: offset for p, (offset, _) in current.items()}
    if all(current[p][0] == safe[p] and committed_run_id(current[p][1]) == plan.run_id for p in partitions):
        log.info("run %s: its offsets are already committed (a retry); nothing to do", plan.run_id)
        if dlq:  # its dead letters went out with that commit: the ledger may not say so yet
            record_published(settings, plan.topic, _published_by_commit(plan, current, dlq))
        return {p: {"before": plan.expected_committed(p), "after": safe[p]} for p in partitions}
    _refuse_if_moved(plan, before, safe)
    counts = {}
    if dlq:
        counts = _commit_with_dead_letters(settings, plan, safe, current, dead_letters)
    else:
        _commit_plain(
            settings,
            plan,
            [
                TopicPartition(plan.topic, p, safe[p], metadata=commit_metadata(plan, p, settings.tables_location))
                for p in partitions
            ],
        )
    after = {p: offset for p, (offset, _) in committed_positions(settings, plan.group, plan.topic, partitions).items()}
    for p in partitions:
        if after[p] != safe[p]:
            raise OffsetsMovedError(f"{plan.topic}[{p}]: committed {after[p]} but wanted {safe[p]}")
    log.info("run %s committed %s", plan.run_id, after)
    extra = (lambda p: {"dead_letters_published": counts.get(p, 0)}) if dlq else (lambda p: {})
    return {p: {"before": before[p], "after": after[p], **extra(p)} for p in partitions}


def _refuse_if_moved(plan: RunPlan, before: dict[int, int | None], safe: dict[int, int]) -> None:
    """``OffsetsMovedError`` when a partition's committed offset is neither where the plan found
    it nor the run's own safe offset: someone else moved the group during the run."""
    moved = []
    for r in plan.ranges:
        now, expected = before[r.partition], plan.expected_committed(r.partition)
        if now != expected and now != safe[r.partition]:
            was = "no committed offset" if expected is None else expected
            moved.append(f"{r.topic}[{r.partition}] is at {now}, but was at {was} when the run was planned")
    if moved:
        raise OffsetsMovedError(
            f"group {plan.group!r} moved during run {plan.run_id}: {'; '.join(moved)}. Nothing was committed; "
            "the group is released and the output is idempotent, so start a new run to continue from the group's offsets."
        )


def _commit_plain(settings: Settings, plan: RunPlan, to_commit: list[TopicPartition]) -> None:
    with answering(settings.bootstrap_servers, f"commit of group {plan.group!r}"):
        result = offsets_client(settings, plan.group).commit(offsets=to_commit, asynchronous=False)
    failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result or [] if tp.error is not None]
    if failed:
        raise OffsetsMovedError(f"commit of run {plan.run_id} failed for {', '.join(failed)}")


def _commit_with_dead_letters(
    settings: Settings,
    plan: RunPlan,
    safe: dict[int, int],
    current: dict[int, tuple[int | None, str | None]],
    dead_letters: Callable[[dict[int, Intervals]], Iterable[dict]] | None,
) -> dict[int, int]:
    """The offsets and the run's dead letters not published before, in one Kafka transaction;
    the offsets' metadata and the ledger record what is published by then. Returns the dead
    letters published per partition."""
    dlq = settings.dead_letter_topic
    partitions = [r.partition for r in plan.ranges]
    ledger = ledger_published(settings, plan.topic)
    published = {p: merge_intervals(published_in_metadata(current[p][1], dlq) + ledger.get(p, [])) for p in partitions}
    lost = {int(p): r for p, r in ((plan.recovered or {}).get("ranges") or {}).items()}  # its dead letters too
    after_commit = {
        r.partition: merge_intervals(published[r.partition] + [[r.start, r.end]] + [lost.get(r.partition, [0, 0])])
        for r in plan.ranges
    }
    to_commit = [
        TopicPartition(
            plan.topic, p, safe[p], metadata=commit_metadata(plan, p, settings.tables_location, after_commit[p], dlq)
        )
        for p in partitions
    ]
    rows = (
        row
        for row in (dead_letters(published) if dead_letters else ())
        if not covers(published.get(row["partition"], []), row["offset"])
    )
    counts = _commit_in_transaction(settings, plan, to_commit, rows)
    record_published(settings, plan.topic, after_commit)
    log.info("run %s: %d dead letters published to %s with the offsets", plan.run_id, sum(counts.values()), dlq)
    return counts


def _published_by_commit(
    plan: RunPlan, current: dict[int, tuple[int | None, str | None]], dead_letter_topic: str
) -> dict[int, Intervals]:
    """What a commit of ``plan`` that went through published: its ranges (when it committed with
    this dead-letter topic) and what its metadata lists."""
    out = {}
    for r in plan.ranges:
        metadata = current[r.partition][1]
        if json.loads(metadata or "{}").get("dlq_topic") == dead_letter_topic:
            out[r.partition] = merge_intervals(published_in_metadata(metadata, dead_letter_topic) + [[r.start, r.end]])
    return out


def dead_letter_record(row: dict) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """(key, value, headers) of a dead letter on the topic: the original record, plus where it
    came from and why it was dead-lettered."""
    headers = [(h["key"], h["value"]) for h in row["headers"] or ()]
    headers += [
        ("wp-dlq-reason", row["reason"].encode()),
        ("wp-dlq-detail", row["detail"].encode()),
        ("wp-dlq-origin", f"{row['topic']}/{row['partition']}/{row['offset']}".encode()),
        ("wp-dlq-timestamp-ms", str(row["timestamp_ms"]).encode()),
    ]
    return row["key"], row["value"], headers


def _commit_in_transaction(
    settings: Settings, plan: RunPlan, offsets: list[TopicPartition], dead_letters: Iterable[dict]
) -> dict[int, int]:
    """Produce ``dead_letters`` and commit ``offsets`` in one transaction; per partition, the
    dead letters produced."""
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    # One transactional id per group: a second committer of the same group fences the first.
    # Dead letters can be as large as anything the readers fetch (16 MiB a partition).
    producer = new_producer(
        settings.kafka_config(
            **{"transactional.id": f"wavepipe-commit-{plan.group}", "message.max.bytes": 20 * 1024 * 1024}
        )
    )
    consumer = group_consumer(settings, plan.group)
    try:
        with answering(settings.bootstrap_servers, f"transactional commit of group {plan.group!r}"):
            producer.init_transactions(TIMEOUT_S)
            producer.begin_transaction()
            counts: dict[int, int] = {}
            for row in dead_letters:
                key, value, headers = dead_letter_record(row)
                while True:
                    try:
                        producer.produce(
                            settings.dead_letter_topic, value=value, key=key, headers=headers, on_delivery=delivered
                        )
                        break
                    except BufferError:  # the local queue is full: let deliveries drain
                        producer.poll(1)
                producer.poll(0)
                counts[row["partition"]] = counts.get(row["partition"], 0) + 1
            remaining = producer.flush(TIMEOUT_S)
            if errors or remaining:
                producer.abort_transaction(TIMEOUT_S)
                raise DeadLetterPublishError(
                    f"run {plan.run_id}: {len(errors) + remaining} dead letters were not delivered to "
                    f"{settings.dead_letter_topic} ({errors[0] if errors else 'timed out'}); nothing was committed. "
                    "Check the topic (does it exist? is its max.message.bytes large enough?) and retry the commit."
                )
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)
            return counts
    finally:
        consumer.close()
