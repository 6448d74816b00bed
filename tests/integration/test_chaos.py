"""Chaos: rounds of a mixed workload, each run hit by a random real fault, then retried.

At the end every good waveform is in the output once and bit-exact, every bad one is in
quarantine or the dead letters with the right reason, every run's counts add up, and the group's
committed offsets are the partitions' ends. ``WAVEPIPE_CHAOS_SEED`` replays a sequence of faults;
``WAVEPIPE_CHAOS_ROUNDS`` sets how many rounds (default 3, plus a last run without faults).
"""

from __future__ import annotations

import json
import os
import random
import re
import time

import pytest
from confluent_kafka.admin import OffsetSpec
from pyspark.sql import functions as F

from tests.helpers import (
    assert_accounted,
    output_rows,
    produce_in_order,
    quarantine_reasons,
    read_topic,
    run_cli,
    waveform_records,
    with_headers,
)
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, list_offsets

pytestmark = pytest.mark.integration

#: Each is a real failure of one step; ``{k}`` is a random record number.
FAULTS = [
    "consume.record@{k}=kill",  # a reader SIGKILLed mid-range
    "assemble.batch=kill-app",  # the Spark engine SIGKILLed while it writes the output
    "publish.before_commit=kill",  # the output's files written by the engine, not yet committed
    "publish.after_write=kill-app",  # ... after the output is published, before that is recorded
    "commit.before_offsets=kill",  # the output is durable, the offsets not yet committed
    "commit.after_offsets=kill",  # the offsets are committed, the report is not written
    "consume.record@{k}=raise",  # a clean failure of a reader
]


class Expected:
    def __init__(self):
        self.output: dict[str, str] = {}
        self.quarantine: dict[str, str] = {}
        self.dead: dict[str, int] = {}

    def dead_letter(self, reason: str) -> None:
        self.dead[reason] = self.dead.get(reason, 0) + 1


def produce_round(settings, tag: str, rng: random.Random, expected: Expected) -> None:
    """One round's mix over partitions 0 and 1: good, duplicated, reordered, interleaved,
    cross-partition, incomplete, corrupt, mismatched, junk; interleaved at random per partition."""
    p: dict[int, list] = {0: [], 1: []}

    def wave(name: str, chunks: int):
        records, digest = waveform_records(f"{tag}-{name}", chunks, seed=rng.randrange(2**31))
        return records, digest

    for i in range(4):
        records, digest = wave(f"good{i}", rng.randint(1, 5))
        p[i % 2].append(records)
        expected.output[f"{tag}-good{i}"] = digest
    dup, digest = wave("dup", 3)
    p[0].append([dup[0], dup[1], dup[1], dup[2], dup[0]])
    expected.output[f"{tag}-dup"] = digest
    rev, digest = wave("reordered", 4)
    p[1].append(rev[::-1])
    expected.output[f"{tag}-reordered"] = digest
    (a, a_sum), (b, b_sum) = wave("inter-a", 3), wave("inter-b", 3)
    p[0].append([a[0], b[0], b[1], a[1], a[2], b[2]])
    expected.output.update({f"{tag}-inter-a": a_sum, f"{tag}-inter-b": b_sum})
    spread, digest = wave("spread", 4)
    p[0].append(spread[:2])
    p[1].append(spread[2:])
    expected.output[f"{tag}-spread"] = digest
    never, _ = wave("incomplete", 4)
    p[rng.randrange(2)].append(never[:3])
    expected.quarantine[f"{tag}-incomplete"] = "incomplete"
    corrupt, _ = wave("corrupt", 3)
    corrupt[1] = (corrupt[1][0], corrupt[1][1], bytes(reversed(corrupt[1][2])))
    p[1].append(corrupt)
    expected.quarantine[f"{tag}-corrupt"] = "checksum_mismatch"
    short, _ = wave("short", 2)
    short[0] = (short[0][0], short[0][1], short[0][2][:-4])
    p[0].append(short)
    expected.quarantine[f"{tag}-short"] = "size_mismatch"
    meta, _ = wave("meta", 3)
    meta[2] = with_headers(meta, 2, **{"wp-source": b"elsewhere"})
    p[1].append(meta)
    expected.quarantine[f"{tag}-meta"] = "metadata_mismatch"
    p[0].append([(b"junk", None, f"{tag} not a chunk".encode())])
    expected.dead_letter("missing_header")
    p[1].append([with_headers(rev, 0, **{"wp-version": b"2"})])
    expected.dead_letter("unknown_version")
    for partition, groups in p.items():
        rng.shuffle(groups)
        produce_in_order(settings, [r for group in groups for r in group], partition=partition)


def _run_until_done(settings, failpoints: str | None, log: list[str], faulted=None) -> tuple[dict, int]:
    """``wavepipe run`` with the fault (with ``faulted``: these settings, e.g. another engine),
    then plain retries (as Airflow's task retries would): the report of the run, and the exit
    code of its first attempt."""
    code, out = run_cli(faulted or settings, "run", failpoints=failpoints)
    first = code
    log.append(f"{failpoints}: exit {code}")
    for attempt in range(3):
        if code == 0:
            break
        code, out = run_cli(settings, "run")
        log.append(f"retry {attempt + 1}: exit {code}")
    assert code == 0, "\n".join(log) + "\n" + out[-4000:]
    path = re.search(r"^report: (\S+)$", out, re.M).group(1)
    return json.loads(open(path).read()), first


def test_chaos_rounds_end_exactly_once(settings, own_engine, spark):
    seed = int(os.environ.get("WAVEPIPE_CHAOS_SEED", time.time_ns() % 2**32))
    rounds = int(os.environ.get("WAVEPIPE_CHAOS_ROUNDS", "3"))
    rng = random.Random(seed)
    # reader processes even for these small rounds: a fault kills one reader, not the whole run
    changes = {
        "incomplete_after_offsets": 30,
        "incomplete_after_s": 0,
        "dead_letter_topic": f"{settings.topic}-dlq",
        "consume_in_process_max_records": 0,
    }
    settings = settings.replace(**changes)
    # a kill-app fault kills the Spark engine of the run it hits: this test's own (started by that
    # run); every other attempt runs on the shared engine (a run's state is in its home)
    killable = own_engine.replace(**changes)
    ensure_topic(settings)
    ensure_topic(settings, settings.dead_letter_topic, partitions=1)
    expected = Expected()
    faults = rng.sample(FAULTS, len(FAULTS))
    log = [f"WAVEPIPE_CHAOS_SEED={seed}"]
    for r in range(rounds):
        produce_round(settings, f"r{r}", rng, expected)
        fault = faults[r % len(faults)].format(k=rng.randint(1, 15))  # a partition gets ~20 records a round
        report, first_exit = _run_until_done(settings, fault, log, killable if "kill-app" in fault else None)
        assert first_exit != 0, "the fault did not fire:\n" + "\n".join(log)
        assert_accounted(spark, settings, report)
    # last: enough good records after the last round's incomplete waveforms to expire them
    for i in range(16):
        records, digest = waveform_records(f"flush-{i}", 4, seed=10_000 + i)
        produce_in_order(settings, records, partition=i % 2)
        expected.output[f"flush-{i}"] = digest
    report, _ = _run_until_done(settings, None, log)
    assert_accounted(spark, settings, report)

    context = "\n".join(log)
    print(context)
    rows = output_rows(spark, settings)
    assert len(rows) == len({r[0] for r in rows}), context
    assert {r[0]: r[1] for r in rows} == expected.output, context
    assert all(r[1] == r[2] for r in rows), f"payloads must be bit-exact\n{context}"
    assert quarantine_reasons(spark, settings) == expected.quarantine, context
    dead = spark.read.format("delta").load(str(settings.dead_letter_table))
    assert {r["reason"]: r["count"] for r in dead.groupBy("reason").count().collect()} == expected.dead, context
    assert dead.select("partition", "offset").distinct().count() == dead.count(), context
    assert dead.where(F.col("value").isNull()).count() == 0, context
    # the dead-letter topic holds the same records, each once, although runs re-read some of them
    published = sorted(h["wp-dlq-origin"].decode() for _, h in read_topic(settings, settings.dead_letter_topic))
    assert published == sorted(f"{r['topic']}/{r['partition']}/{r['offset']}" for r in dead.collect()), context
    ends = list_offsets(settings, settings.topic, [0, 1], OffsetSpec.latest())
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == ends, context
