"""Committing a run's safe offsets to the consumer group, with the run id in the metadata.

Compare-and-set per partition: the group must still be where it was when the run was planned
(or already at the safe offset, when a retry repeats a commit that went through). Anything else
means someone moved the group during the run (a rewind, another consumer), and the commit is
refused.

With a dead-letter topic configured, the run's dead letters are produced and the offsets are
committed in one Kafka transaction (``send_offsets_to_transaction``): both happen or neither,
and a retry after a commit that went through publishes nothing twice.
"""

from __future__ import annotations

import json
import logging
from typing import Iterable

from confluent_kafka import Producer, TopicPartition

from wavepipe.config import Settings
from wavepipe.consumers.kafka_admin import committed_positions, group_consumer
from wavepipe.plan import RunPlan

log = logging.getLogger(__name__)
TIMEOUT_S = 60.0


class OffsetsMovedError(RuntimeError):
    """The group is not where this run can commit from: the run can never commit."""


class DeadLetterPublishError(RuntimeError):
    """Dead letters could not be published; nothing was committed and a retry may succeed."""


def commit_metadata(plan: RunPlan, partition: int) -> str:
    return json.dumps({"run_id": plan.run_id, "planned_end": plan.range_for(partition).end}, separators=(",", ":"))


def committed_run_id(metadata: str | None) -> str | None:
    """The run id in a committed offset's metadata (None if another tool committed it)."""
    try:
        return json.loads(metadata).get("run_id") if metadata else None
    except (ValueError, AttributeError):
        return None


def commit_safe_offsets(settings: Settings, plan: RunPlan, safe: dict[int, int],
                        dead_letters: Iterable[dict] = ()) -> dict[int, dict]:
    """Commit ``safe[partition]`` for every planned partition; return before/after per partition.

    ``dead_letters`` (staged dead-letter rows) are published to ``settings.dead_letter_topic`` in
    the same transaction when that topic is set.
    """
    partitions = [r.partition for r in plan.ranges]
    current = committed_positions(settings, plan.group, plan.topic, partitions)
    before = {p: offset for p, (offset, _) in current.items()}
    if all(current[p] == (safe[p], commit_metadata(plan, p)) for p in partitions):
        log.info("run %s: its offsets are already committed (a retry); nothing to do", plan.run_id)
        return {p: {"before": plan.expected_committed(p), "after": safe[p]} for p in partitions}
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
    to_commit = [TopicPartition(plan.topic, p, safe[p], metadata=commit_metadata(plan, p)) for p in partitions]
    if settings.dead_letter_topic:
        published = _commit_in_transaction(settings, plan, to_commit, dead_letters)
        log.info("run %s: %d dead letters published to %s with the offsets", plan.run_id, published,
                 settings.dead_letter_topic)
    else:
        consumer = group_consumer(settings, plan.group)
        try:
            result = consumer.commit(offsets=to_commit, asynchronous=False)
        finally:
            consumer.close()
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result or [] if tp.error is not None]
        if failed:
            raise OffsetsMovedError(f"commit of run {plan.run_id} failed for {', '.join(failed)}")
    after = {p: offset for p, (offset, _) in committed_positions(settings, plan.group, plan.topic, partitions).items()}
    for p in partitions:
        if after[p] != safe[p]:
            raise OffsetsMovedError(f"{plan.topic}[{p}]: committed {after[p]} but wanted {safe[p]}")
    log.info("run %s committed %s", plan.run_id, after)
    return {p: {"before": before[p], "after": after[p]} for p in partitions}


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


def _commit_in_transaction(settings: Settings, plan: RunPlan, offsets: list[TopicPartition],
                           dead_letters: Iterable[dict]) -> int:
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(str(err))

    # One transactional id per group: a second committer of the same group fences the first.
    # Dead letters can be as large as anything the readers fetch (16 MiB a partition).
    producer = Producer(settings.kafka_config(**{"transactional.id": f"wavepipe-commit-{plan.group}",
                                                 "message.max.bytes": 20 * 1024 * 1024}))
    consumer = group_consumer(settings, plan.group)
    try:
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()
        count = 0
        for row in dead_letters:
            key, value, headers = dead_letter_record(row)
            while True:
                try:
                    producer.produce(settings.dead_letter_topic, value=value, key=key, headers=headers,
                                     on_delivery=delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    producer.poll(1)
            producer.poll(0)
            count += 1
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
        return count
    finally:
        consumer.close()
