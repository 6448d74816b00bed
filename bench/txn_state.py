"""A table's transaction state over many micro-batch commits: a stable id against an id per run.

Every publish carries a Delta transaction (``wavepipe.delta_txn``). Delta keeps the newest
version of every transaction id in the table's state, in every checkpoint, forever. wavepipe up to
this version used a new id per run and table (``wavepipe-publish-<run>-<table>-<attempt>``,
version 1), so the state grew by one entry a run; now a group has one id whose version grows.

This benchmark makes ``commits`` micro-batch commits (a checkpoint every 100 commits, Delta's
default) to two tables, one per scheme, in turn, and records as they grow: the transaction
entries in the newest checkpoint, its size, and the time of the commits since the previous
sample. Each commit replaces the table's one small file (and removed files leave the state at
once), so both tables hold the same files at every commit and what differs is only the
transaction state: a real table's files are kept few by ``wavepipe table optimize`` and VACUUM,
whichever scheme it uses. The commits are made by delta-rs: the state is the Delta protocol's, whoever
writes, and 2 x 10,000 commits through Spark would take hours. Then it times wavepipe's own
writer (``append_new`` on the Spark engine, the publish's code) appending to each grown table,
which is what a run pays for the state it must read first.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from wavepipe.contracts.config import Settings
from wavepipe.delta_txn import Txn

log = logging.getLogger("wavepipe.bench")

SCHEMES = ("id_per_run", "stable_id")
#: Commits between two samples of the state.
SAMPLE_EVERY = 500
#: Delta's default checkpoint interval, in commits: samples fall on checkpoints.
CHECKPOINT_EVERY = 100
#: That interval; removed files out of the state at once (see above).
TABLE_PROPERTIES = {
    "delta.checkpointInterval": str(CHECKPOINT_EVERY),
    "delta.deletedFileRetentionDuration": "interval 0 seconds",
}
#: Appends through Spark to each grown table, timed (the median is reported).
SPARK_APPENDS = 5


@dataclass(frozen=True)
class TxnStateSize:
    """How much ``wavepipe bench --txn-state`` does: the commits to each table, the commits between
    two samples of the state (a multiple of ``CHECKPOINT_EVERY``), the Spark appends timed."""

    commits: int = 10_000
    sample_every: int = SAMPLE_EVERY
    spark_appends: int = SPARK_APPENDS

    @classmethod
    def quick(cls, **changes) -> TxnStateSize:
        """``--quick``: 500 commits, a sample at every checkpoint (five, so first and last differ)."""
        return cls(**{"commits": 500, "sample_every": CHECKPOINT_EVERY, **changes})

    def __post_init__(self) -> None:
        if self.sample_every % CHECKPOINT_EVERY or self.commits < 2 * self.sample_every or self.spark_appends < 1:
            raise ValueError(
                f"{self}: samples every multiple of {CHECKPOINT_EVERY} commits, at least two of them, "
                "and at least one Spark append"
            )


def _txn(scheme: str, i: int) -> tuple[str, int]:
    if scheme == "id_per_run":
        return f"wavepipe-publish-run_{i:08d}-waveforms-0123456789ab", 1
    return "wavepipe:bench-group:bench-topic", i


def _checkpoint_state(path: Path) -> tuple[int, int, int] | None:
    """(version, bytes, transaction entries) of the table's newest checkpoint, read from its log."""
    import pyarrow.parquet as pq

    checkpoints = sorted((path / "_delta_log").glob("*.checkpoint*.parquet"))
    if not checkpoints:
        return None
    newest = int(checkpoints[-1].name.split(".")[0])
    parts = [c for c in checkpoints if int(c.name.split(".")[0]) == newest]
    txns = sum(sum(1 for t in pq.read_table(c, columns=["txn"])["txn"].to_pylist() if t) for c in parts)
    return newest, sum(c.stat().st_size for c in parts), txns


def grow(path: Path, scheme: str, commits: int, sample_every: int = SAMPLE_EVERY) -> list[dict]:
    """``commits`` one-row commits to a new table at ``path`` under ``scheme``; a sample every
    ``sample_every`` commits: the checkpoint's state and the commits' times since the last."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    samples, times, began = [], [], time.monotonic()
    for i in range(1, commits + 1):
        app, version = _txn(scheme, i)
        row = pa.table({"run": [i], "payload": [b"x" * 64]})
        t = time.perf_counter()
        write_deltalake(
            str(path),
            row,
            mode="overwrite",
            configuration=TABLE_PROPERTIES if i == 1 else None,
            commit_properties=CommitProperties(app_transactions=[Transaction(app, version)]),
        )
        times.append(time.perf_counter() - t)
        if i % sample_every == 0 or i == commits:
            version, size, txns = _checkpoint_state(path) or (None, 0, 0)
            samples.append(
                {
                    "commits": i,
                    "checkpoint_version": version,
                    "checkpoint_bytes": size,
                    "txn_entries": txns,
                    "commit_ms_median": round(statistics.median(times) * 1000, 2),
                    "commit_ms_p95": round(sorted(times)[int(0.95 * (len(times) - 1))] * 1000, 2),
                }
            )
            rate = i / (time.monotonic() - began)
            log.info("%s: %d/%d commits (%.0f/s), state %s", scheme, i, commits, rate, samples[-1])
            times = []
    return samples


def spark_appends(spark, path: Path, scheme: str, start: int, appends: int = SPARK_APPENDS) -> list[float]:
    """Seconds of ``appends`` appends through wavepipe's publish writer to the grown table."""
    from wavepipe.spark_apps.tables import append_new

    seconds = []
    for i in range(start, start + appends):
        app, version = _txn(scheme, i)
        rows = spark.createDataFrame([(i, b"x" * 64)], "run long, payload binary")
        t = time.perf_counter()
        append_new(rows, path, ["run"], txn=Txn(app, version, "bench"))
        seconds.append(round(time.perf_counter() - t, 3))
    return seconds


def measure(settings: Settings, size: TxnStateSize) -> dict:
    """Both schemes grown side by side, then appended to through Spark (an engine of its own)."""
    from wavepipe import engine_client
    from wavepipe.local.engine_server import LocalEngine

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    s = settings.replace(home=settings.home / "bench" / f"txn-state-{stamp}", spark_remote="", spark_engine="connect")
    s = s.replace(spark_connect_port=0)
    commits = size.commits
    result = {
        "commits": commits,
        "sample_every": size.sample_every,
        "spark_appends": size.spark_appends,
        "started": stamp,
        "schemes": {},
    }
    for scheme in SCHEMES:
        result["schemes"][scheme] = {"samples": grow(s.tables_dir / scheme, scheme, commits, size.sample_every)}
    log.info("txn state: starting a Spark engine for %s", s.home)
    try:  # started inside: stopped also when a signal comes while it starts
        LocalEngine(s).up()
        with engine_client.attached(s) as spark:
            for scheme in SCHEMES:
                timed = spark_appends(spark, s.tables_dir / scheme, scheme, commits + 1, size.spark_appends)
                result["schemes"][scheme]["spark_append_s"] = timed
                result["schemes"][scheme]["spark_append_s_median"] = statistics.median(timed)
    finally:
        LocalEngine(s).down()
    return result


def goals(result: dict) -> list[tuple[str, bool, str]]:
    """The stable id's state, checkpoint and commit time stay flat: the last sample within 10%
    (plus a small constant) of the first, where the id per run's grow."""
    stable = result["schemes"]["stable_id"]["samples"]
    first, last = stable[0], stable[-1]
    flat_state = last["txn_entries"] == first["txn_entries"] == 1
    flat_size = last["checkpoint_bytes"] <= first["checkpoint_bytes"] * 1.1 + 4096
    flat_time = last["commit_ms_median"] <= first["commit_ms_median"] * 1.1 + 2
    return [
        ("one transaction entry", flat_state, f"{first['txn_entries']} -> {last['txn_entries']}"),
        ("checkpoint size flat", flat_size, f"{first['checkpoint_bytes']} -> {last['checkpoint_bytes']} bytes"),
        ("commit time flat", flat_time, f"{first['commit_ms_median']} -> {last['commit_ms_median']} ms (median)"),
    ]


def state_kept(result: dict) -> bool:
    """The goals ``wavepipe bench --txn-state`` exits 1 on: the transaction state's (one entry, a
    flat checkpoint). The commit time is measured, not held to: delta-rs's grows with the number of
    commit files in the log, whatever the scheme (docs/benchmarks/README.md)."""
    return all(met for _, met, _ in goals(result)[:2])


def to_markdown(result: dict) -> str:
    lines = [
        f"# Transaction state over {result['commits']:,} micro-batch commits",
        "",
        "One small file replaced a commit, a checkpoint every 100 commits, both schemes in one run "
        f"({result['started']}, `wavepipe bench --txn-state`). `id_per_run`: wavepipe before, a new "
        "transaction id per run; `stable_id`: one id per group, its version growing. State and "
        "checkpoints from the tables' own logs; commit times of delta-rs writes; the last column times "
        "wavepipe's Spark writer appending to the grown table.",
        "",
        "| scheme | commits | txn entries in the checkpoint | checkpoint bytes | commit ms (median) | commit ms (p95) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for scheme, data in result["schemes"].items():
        for sample in data["samples"]:
            lines.append(
                f"| {scheme} | {sample['commits']:,} | {sample['txn_entries']:,} | {sample['checkpoint_bytes']:,} | "
                f"{sample['commit_ms_median']} | {sample['commit_ms_p95']} |"
            )
    appends = result.get("spark_appends", SPARK_APPENDS)
    lines += ["", f"| scheme | Spark append to the grown table, s (median of {appends}) |", "|---|---:|"]
    for scheme, data in result["schemes"].items():
        lines.append(f"| {scheme} | {data.get('spark_append_s_median')} |")
    lines += ["", "Goals:"]
    lines += [f"- {'met' if met else 'MISSED'}: {name} ({numbers})" for name, met, numbers in goals(result)]
    return "\n".join(lines) + "\n"


def chart(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.2))
    axes = fig.subplots(1, 3)
    for scheme, data in result["schemes"].items():
        xs = [s["commits"] for s in data["samples"]]
        axes[0].plot(xs, [s["txn_entries"] for s in data["samples"]], label=scheme)
        axes[1].plot(xs, [s["checkpoint_bytes"] / 1024 for s in data["samples"]], label=scheme)
        axes[2].plot(xs, [s["commit_ms_median"] for s in data["samples"]], label=scheme)
    for ax, title in zip(axes, ("txn entries", "checkpoint KiB", "commit ms (median)"), strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("commits", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def save(result: dict, out_dir: Path) -> list[Path]:
    """txn-state.json, .png and .md in ``out_dir`` (a chart that fails to draw loses nothing)."""
    from wavepipe.bench.results import save_page

    return save_page(result, out_dir, "txn-state", to_markdown, chart)
