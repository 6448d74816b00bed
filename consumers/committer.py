"""Committing a run's safe offsets to the consumer group, with the run id in the metadata.

Compare-and-set per partition: the group must still be where the plan started (or already at
the safe offset, when a retry repeats a commit that went through). Anything else means someone
moved the group during the run (a rewind, another consumer), and the commit is refused.
"""

from __future__ import annotations

import json
import logging

from confluent_kafka import TopicPartition

from wavepipe.config import Settings
from wavepipe.consumers.kafka_admin import committed_offsets, group_consumer
from wavepipe.plan import RunPlan

log = logging.getLogger(__name__)


class OffsetsMovedError(RuntimeError):
    pass


def commit_safe_offsets(settings: Settings, plan: RunPlan, safe: dict[int, int]) -> dict[int, dict]:
    """Commit ``safe[partition]`` for every planned partition; return before/after per partition."""
    partitions = [r.partition for r in plan.ranges]
    current = committed_offsets(settings, plan.group, plan.topic, partitions)
    moved = []
    for r in plan.ranges:
        now = current[r.partition]
        if now is not None and now not in (r.start, safe[r.partition]):
            moved.append(f"{r.topic}[{r.partition}] is at {now}, plan started at {r.start}")
    if moved:
        raise OffsetsMovedError(
            f"group {plan.group!r} moved during run {plan.run_id}: {'; '.join(moved)}. Nothing was committed; "
            "the group is released and the output is idempotent, so start a new run to continue from the group's offsets."
        )
    to_commit = [
        TopicPartition(plan.topic, r.partition, safe[r.partition],
                       metadata=json.dumps({"run_id": plan.run_id, "planned_end": r.end}, separators=(",", ":")))
        for r in plan.ranges
    ]
    consumer = group_consumer(settings, plan.group)
    try:
        result = consumer.commit(offsets=to_commit, asynchronous=False)
    finally:
        consumer.close()
    failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result or [] if tp.error is not None]
    if failed:
        raise OffsetsMovedError(f"commit of run {plan.run_id} failed for {', '.join(failed)}")
    after = committed_offsets(settings, plan.group, plan.topic, partitions)
    for r in plan.ranges:
        if after[r.partition] != safe[r.partition]:
            raise OffsetsMovedError(
                f"{r.topic}[{r.partition}]: committed {after[r.partition]} but wanted {safe[r.partition]}"
            )
    log.info("run %s committed %s", plan.run_id, {p: after[p] for p in partitions})
    return {r.partition: {"before": current[r.partition], "after": after[r.partition]} for r in plan.ranges}
