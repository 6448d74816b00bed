"""How reading scales out over partitions: the consume step on 1, 2 and 4 partitions.

The same backlog (1 MiB waveforms in 64 KiB chunks) is produced to a topic of 1, 2 and 4
partitions. Each topic is then read by wavepipe's consume step, a warm-up and then three times
(the median counts), in two ways: one reader for all partitions, one after the other (one consume
task holding every partition: ``consume_tasks=1``, ``consume_parallelism=1``), and one reader
process per partition at once (one mapped consume task per partition, each on its own Airflow
worker slot). Airflow's own cost of starting a task (a few seconds) is not in these figures; the
reader processes' start-up is, in the step column. The broker runs on the same machine.
"""

from __future__ import annotations

import json
import logging
import platform
import shutil
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from wavepipe.bench.workloads import KiB, MiB, SignalPool, Workload, produce_backlog
from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import new_run_id

log = logging.getLogger("wavepipe.bench")

PARTITION_COUNTS = (1, 2, 4)


def measure_consume_scaling(
    settings: Settings,
    workdir: Path,
    *,
    total_bytes: int = 1024 * MiB,
    partition_counts: tuple[int, ...] = PARTITION_COUNTS,
    repeats: int = 3,
) -> dict:
    """Produce the backlog once per partition count, then time the consume step with one reader and
    with one reader per partition, ``repeats`` times each after a warm-up; return the medians (MB/s
    of chunk payload)."""
    from wavepipe.consumers.kafka_admin import admin_client, ensure_topic

    workload = Workload("consume", 1 * MiB, 64 * KiB, total_bytes)
    pool = SignalPool()
    rows = []
    for n in partition_counts:
        topic = f"bench-consume-{n}p-{uuid.uuid4().hex[:8]}"
        ensure_topic(settings.replace(topic=topic, partitions=n))
        try:
            rows += _measure_topic(settings, workdir, topic, n, workload, pool, repeats)
        finally:  # the backlog is deleted also when a measurement fails
            admin = admin_client(settings)  # referenced until the result: a destroyed client fails its futures
            admin.delete_topics([topic])[topic].result(timeout=30)
    base = next(r["mb_s"] for r in rows if r["partitions"] == partition_counts[0] and r["readers"] == 1)
    for row in rows:
        row["vs_1_partition"] = round(row["mb_s"] / base, 2)
        one = next(r["mb_s"] for r in rows if r["partitions"] == row["partitions"] and r["readers"] == 1)
        row["vs_one_reader"] = round(row["mb_s"] / one, 2)
    return {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": _cpus(), "python": platform.python_version()},
        "workload": workload.describe(),
        "rows": rows,
    }


def _measure_topic(
    settings: Settings, workdir: Path, topic: str, n: int, workload: Workload, pool: SignalPool, repeats: int
) -> list[dict]:
    """Produce the backlog to ``topic`` (``n`` partitions), then read it with one reader and with
    one reader per partition: a warm-up (imports, page cache), then the median of ``repeats``."""
    log.info("%d partition(s): producing %s", n, workload.describe())
    produce_backlog(settings, topic, workload, first_index=0, count=workload.waveforms, pool=pool)
    rows = []
    for readers in sorted({1, n}):
        trials = [_consume_once(settings, workdir, topic, readers, workload.payload_bytes) for _ in range(repeats + 1)][
            1:
        ]
        trials.sort(key=lambda t: t["read_s"])
        row = {
            "partitions": n,
            "readers": readers,
            **trials[len(trials) // 2],
            "read_s_all": [t["read_s"] for t in trials],
        }
        row["mb_s"] = round(row["bytes"] / 1e6 / row["read_s"], 1)
        log.info(
            "%d partition(s), %d reader(s): %.0f MB read in %.2fs = %.1f MB/s (median of %d; step %.2fs "
            "with process start-up)",
            n,
            readers,
            row["bytes"] / 1e6,
            row["read_s"],
            row["mb_s"],
            repeats,
            row["wall_s"],
        )
        rows.append(row)
    return rows


def _consume_once(settings: Settings, workdir: Path, topic: str, readers: int, expected_bytes: int) -> dict:
    """One consume step over the whole topic, as a new group's first run."""
    from wavepipe.pipeline import consume_all, partitions_to_read, plan_step

    home = workdir / f"{topic}-{readers}r"
    s = settings.replace(
        home=home,
        topic=topic,
        group=f"bench-{uuid.uuid4().hex[:10]}",
        max_records_per_partition=0,
        max_bytes_per_partition=0,
        consume_parallelism=readers,
        consume_in_process_max_records=0,
    )  # reader processes, whatever the backlog's size
    plan = plan_step(s, new_run_id(), topic=topic, group=s.group, new_group_start="earliest")
    began = time.monotonic()
    results = consume_all(s, plan.run_id, partitions_to_read(plan))
    wall = time.monotonic() - began
    shutil.rmtree(home, ignore_errors=True)
    nbytes = sum(r["bytes"] for r in results)
    if nbytes != expected_bytes:
        raise RuntimeError(f"{topic}, {readers} readers: staged {nbytes} bytes, produced {expected_bytes}")
    # reading: from the first reader's start to the last one's end (readers start one after another,
    # so their reading overlaps only in part); starting the reader processes is in wall_s only
    reading = max(r["ended"] for r in results) - min(r["began"] for r in results)
    return {
        "bytes": nbytes,
        "wall_s": round(wall, 2),
        "read_s": round(reading, 2),
        "chunks_per_partition": {r["partition"]: r["chunks"] for r in results},
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def to_markdown(result: dict) -> str:
    lines = [
        "# Consume scale-out over partitions",
        "",
        f"Measured {result['measured_at']} on {result['machine']['cpus']} CPUs; {result['workload']}, the "
        "same backlog on topics of 1, 2 and 4 partitions. One reader = one consume task holding every "
        "partition (`consume_tasks=1`); one reader per partition = one mapped consume task per partition, "
        "each on its own worker slot. Ratios are against 1 partition, measured in the same run.",
        "",
        "MB/s is the bytes over the time from the first reader's start to the last one's end (the reader "
        "processes start one after another); the step column adds starting those processes. Two ratios: "
        "against one partition, and against one reader on the same topic (what the parallel readers add).",
        "",
        "| partitions | readers | MB/s | read s | step s | vs 1 partition | vs one reader | chunks per partition |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['partitions']} | {r['readers']} | {r['mb_s']} | {r['read_s']} | {r['wall_s']} | "
            f"{r['vs_1_partition']}x | {r['vs_one_reader']}x | "
            f"{', '.join(str(v) for _, v in sorted(r['chunks_per_partition'].items()))} |"
        )
    return "\n".join(lines) + "\n"


def save(result: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "consume-scaling.json", out_dir / "consume-scaling.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(to_markdown(result))
    return paths
