"""A table under many small runs: 200 micro-batch appends against the same data in one batch.

Event-driven runs publish a few waveforms each, so every run adds a few small files to the
``date`` partition of the waveforms table (one per day it carries, however many sources). A second
case has 1,000 sources, every micro-batch carrying all of them (a station network at 15-second
runs), and also appends a few micro-batches in the earlier ``source``/``date`` layout, to compare
the files and the time each commit costs. This benchmark writes the same synthetic
waveforms twice on the Spark engine: once as ``batches`` appends through the publish step's own
writer (``append_new``, one Delta commit each, as ``batches`` runs would), once in one write. It
then times a typical read, one source over one hour (its rows' payloads summed, so the bytes are
read), on the one-batch table and on the micro-batch table before compaction, after
``wavepipe table optimize`` (compaction) and after ``optimize --zorder`` (clustered by source and
start time), and
times the maintenance itself and the VACUUM that frees the replaced files. Every read's row count
is checked against what was written (each waveform exactly once, in every state).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from wavepipe.contracts.config import Settings

log = logging.getLogger("wavepipe.bench")

#: The goal: a read on the compacted table within this multiple of the one-batch table's.
GOAL_RATIO = 1.2
#: The state after ``wavepipe table optimize --zorder``.
ZORDERED = "compacted, clustered by source and start_time"
T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@dataclass
class LayoutOptions:
    batches: int = 200
    sources: int = 4
    per_batch: int = 24  # waveforms per micro-batch, spread over the sources
    waveform_bytes: int = 64 * 1024
    hours: float = 24.0  # start times span this long (over two dates), in batch order
    reads: int = 7  # timed reads per table state, after one warm-up; the median counts
    legacy_batches: int = 0  # micro-batches also appended in the earlier source/date layout
    name: str = "table-layout"  # the results' file names
    command: str = ""

    @classmethod
    def quick(cls, **changes) -> LayoutOptions:
        return cls(**{"batches": 20, "per_batch": 8, "waveform_bytes": 8 * 1024, "reads": 3, **changes})

    @classmethod
    def many_sources(cls, quick: bool = False, **changes) -> LayoutOptions:
        """1,000 sources, each in every micro-batch (small waveforms, so the case stays ~160 MB)."""
        size = {"sources": 50, "per_batch": 50, "batches": 10, "reads": 3} if quick else {}
        return cls(
            **{
                "batches": 40,
                "sources": 1000,
                "per_batch": 1000,
                "waveform_bytes": 4096,
                "legacy_batches": 3,
                "name": "table-layout-1000-sources",
                **size,
                **changes,
            }
        )


def cases(quick: bool, command: str) -> list[LayoutOptions]:
    """What ``wavepipe bench --table-layout`` runs: a few sources, then 1,000."""
    few = LayoutOptions.quick(command=command) if quick else LayoutOptions(command=command)
    return [few, LayoutOptions.many_sources(quick, command=command)]


def _rows(options: LayoutOptions, batch: int) -> list[tuple]:
    """The waveforms of one micro-batch, as output rows (``OUTPUT_SCHEMA``'s order; the columns
    not named here null): deterministic noise payloads (they do not compress, as real sample noise
    hardly does), start times in arrival order."""
    import numpy as np

    from wavepipe.spark_apps.reassemble import OUTPUT_SCHEMA

    step = timedelta(hours=options.hours) / (options.batches * options.per_batch)
    rows = []
    for i in range(options.per_batch):
        n = batch * options.per_batch + i
        payload = np.random.default_rng(n).bytes(options.waveform_bytes)
        start = T0 + n * step
        samples = options.waveform_bytes // 4
        row = {
            "waveform_id": f"layout-{n:07d}",
            "source": f"station-{i % options.sources}",
            "start_time": start,
            "date": start.date(),
            "dtype": "float32",
            "channels": 1,
            "sample_rate": 100.0,
            "n_samples": samples,
            "duration_s": samples / 100.0,
            "size_bytes": len(payload),
            "n_chunks": max(1, len(payload) // 65536),
            "checksum": hashlib.sha256(payload).hexdigest(),
            "payload": payload,
            "topic": "layout",
            "partition": 0,
            "first_offset": n,
            "last_offset": n,
            "checksum_ok": True,
        }
        rows.append(tuple(row.get(name) for name in OUTPUT_SCHEMA.fieldNames()))
    return rows


def _queries(options: LayoutOptions, hours: float = 1.0) -> list[tuple[str, datetime, datetime, int]]:
    """``reads`` (source, start, end, rows expected) of ``hours`` each, across the span. An hour
    is the typical read; a day (from midnight) reads a whole ``source``/``date`` partition."""
    step = timedelta(hours=options.hours) / (options.batches * options.per_batch)
    total = options.batches * options.per_batch
    out = []
    for k in range(options.reads):
        source = f"station-{k % options.sources}"
        begin = T0 + timedelta(hours=int((k + 0.5) * options.hours / options.reads))
        if hours >= 24:
            begin = begin.replace(hour=0)
        end = begin + timedelta(hours=hours)
        expected = sum(
            1
            for n in range(total)
            if f"station-{(n % options.per_batch) % options.sources}" == source and begin <= T0 + n * step < end
        )
        out.append((source, begin, end, expected))
    return out


def _read(spark, path: Path, source: str, begin: datetime, end: datetime) -> tuple[int, int, float]:
    """One typical read of the table: the rows of ``source`` in [begin, end), payload bytes summed."""
    from pyspark.sql import functions as F

    from wavepipe.spark_apps.tables import read_delta

    # the bounds as instants in text: a datetime literal makes the client ask pyspark's global
    # active session for its timestamp type, which is an earlier case's, on an engine now stopped
    low, high = (F.lit(t.isoformat()).cast("timestamp") for t in (begin, end))
    began = time.perf_counter()
    row = (
        read_delta(spark, path)
        .where((F.col("source") == source) & (F.col("start_time") >= low) & (F.col("start_time") < high))
        .agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("bytes"))
        .collect()[0]
    )
    return int(row["n"]), int(row["bytes"] or 0), time.perf_counter() - began


def _measure(spark, states: list[tuple[str, Path]], options: LayoutOptions) -> list[dict]:
    """Time the reads on every state (name, table) side by side: each query is run on each
    table in turn, after one warm-up read of each, so a drift in the machine's speed is shared
    by all; every read's rows are checked against what was written."""
    from wavepipe.maintenance import table_status

    kinds = {"hour": _queries(options), "day": _queries(options, 24)}
    for _, path in states:
        _read(spark, path, *kinds["hour"][0][:3])  # warm-up: the engine's code paths, the table's log
    times = {(name, kind): [] for name, _ in states for kind in kinds}
    wrong: dict[str, list[str]] = {name: [] for name, _ in states}
    for kind, queries in kinds.items():
        for source, begin, end, expected in queries:
            for name, path in states:
                n, size, seconds = _read(spark, path, source, begin, end)
                times[name, kind].append(seconds)
                if n != expected or size != expected * options.waveform_bytes:
                    wrong[name].append(
                        f"{source} {begin:%Y-%m-%d %H:%M}+{kind}: {n} rows ({size} B), expected {expected}"
                    )
    # what every run does to the published table: look up its own waveforms' ids (the dedupe
    # check before publishing, ``tables.id_rows``), here a run's worth of ids per batch
    for k in range(options.reads):
        batch = (k * options.batches) // options.reads
        id_list = [r[0] for r in _rows(options, batch)]
        ids = spark.createDataFrame([(i,) for i in id_list], "waveform_id string")
        for name, path in states:
            for kind, listed in (("dedupe", id_list), ("dedupe_join", None)):
                n, seconds = _dedupe_check(spark, path, ids, listed)
                times[name, kind] = [*times.get((name, kind), []), seconds]
                if n != options.per_batch:
                    wrong[name].append(f"{kind} of batch {batch}: {n} ids found, expected {options.per_batch}")
    results = []
    for name, path in states:
        total = read_count(spark, path)
        if total != options.batches * options.per_batch:
            wrong[name].append(f"{total} distinct waveforms, expected {options.batches * options.per_batch}")
        status = table_status("waveforms", path)
        results.append(
            {
                "state": name,
                "files": status.files,
                "mb": round(status.bytes / 1e6, 1),
                "partitions": status.partitions,
                "files_per_partition_max": status.files_per_partition_max,
                "read_median_s": round(statistics.median(times[name, "hour"]), 3),
                "read_min_s": round(min(times[name, "hour"]), 3),
                "read_max_s": round(max(times[name, "hour"]), 3),
                "rows_per_read": [q[3] for q in kinds["hour"]],
                "day_median_s": round(statistics.median(times[name, "day"]), 3),
                "dedupe_median_s": round(statistics.median(times[name, "dedupe"]), 3),
                "dedupe_join_median_s": round(statistics.median(times[name, "dedupe_join"]), 3),
                "rows_per_day_read": [q[3] for q in kinds["day"]],
                "errors": wrong[name],
            }
        )
        log.info(
            "table layout, %s: %d files, one source over one hour read in %.3f s, over a day in %.3f s "
            "(medians of %d)%s",
            name,
            status.files,
            results[-1]["read_median_s"],
            results[-1]["day_median_s"],
            options.reads,
            f"; WRONG: {wrong[name]}" if wrong[name] else "",
        )
    return results


def _dedupe_check(spark, path: Path, ids, id_list: list[str] | None) -> tuple[int, float]:
    """A run's look-up of its ids in the table, as the reassembly does it (``tables.id_rows``, by
    delta-rs, with the ``id_list``; None: a Spark join alone, as it did before): (ids found,
    seconds)."""
    from wavepipe.spark_apps.tables import id_rows, read_delta

    began = time.perf_counter()
    if id_list is not None:
        found = len(id_rows(path, id_list, ["waveform_id", "checksum"]))
    else:
        found = read_delta(spark, path).join(ids, "waveform_id", "left_semi").count()
    return found, time.perf_counter() - began


def read_count(spark, path: Path) -> int:
    from pyspark.sql import functions as F

    from wavepipe.spark_apps.tables import read_delta

    return int(read_delta(spark, path).agg(F.count_distinct("waveform_id").alias("n")).collect()[0]["n"])


def _append_batches(spark, path: Path, options: LayoutOptions, batches: int, partition_by: list[str]) -> dict:
    """Append ``batches`` micro-batches to ``path`` through the publish step's writer, laid out by
    ``partition_by``: the seconds of each commit and the files each added."""
    from wavepipe.spark_apps.reassemble import OUTPUT_SCHEMA
    from wavepipe.spark_apps.tables import append_new, delta_log, delta_version

    seconds, began = [], time.monotonic()
    for b in range(batches):
        frame = spark.createDataFrame(_rows(options, b), OUTPUT_SCHEMA)
        t = time.perf_counter()
        append_new(frame, path, ["waveform_id"], partition_by, checked_version=delta_version(path))
        seconds.append(time.perf_counter() - t)
        if (b + 1) % max(1, batches // 10) == 0:
            log.info(
                "table layout: %d/%d micro-batches appended by %s (%.1f/s)",
                b + 1,
                batches,
                ", ".join(partition_by),
                (b + 1) / (time.monotonic() - began),
            )
    files = len(delta_log(path).files)
    return {
        "partition_by": partition_by,
        "batches": batches,
        "files_per_commit": round(files / batches, 1),
        "commit_median_s": round(statistics.median(seconds), 3),
        "commit_max_s": round(max(seconds), 3),
        "seconds": round(sum(seconds), 1),
    }


def run_layout(settings: Settings, options: LayoutOptions) -> dict:
    from wavepipe import engine_client, maintenance
    from wavepipe.bench.runner import run_header
    from wavepipe.local.engine_server import LocalEngine
    from wavepipe.spark_apps.tables import TABLE_KEYS, delta_writer, read_delta

    began = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    s = settings.replace(
        home=settings.home / "bench" / f"table-layout-{stamp}",
        spark_remote="",
        spark_engine="connect",
        spark_connect_port=0,
    )
    micro, one = s.output_table, s.tables_dir / "one_batch"
    clustered = s.replace(tables_uri=str(s.home / "zorder" / "tables"))
    layout = list(TABLE_KEYS["waveforms"][1])
    log.info("table layout: starting a Spark engine for %s", s.home)
    try:  # started inside: stopped also when a signal comes while it starts
        LocalEngine(s).up()
        with engine_client.attached(s) as spark:
            commits = _append_batches(spark, micro, options, options.batches, layout)
            if options.legacy_batches:
                legacy = s.tables_dir / "legacy_layout"
                commits["legacy"] = _append_batches(spark, legacy, options, options.legacy_batches, ["source", "date"])
            t = time.monotonic()
            # the same rows in one write: one file per partition, as one large run would write them
            delta_writer(read_delta(spark, micro).repartition(*layout)).partitionBy(*layout).save(str(one))
            one_batch_s = time.monotonic() - t
            # each state stays a table of its own (a copy: the log's paths are relative), all read
            # at their latest version side by side. `optimize --zorder` runs on the micro-batches as
            # a user would run it, in a second tables folder: on the compacted table it would find
            # every partition in one file already and, rightly, rewrite nothing.
            shutil.copytree(micro, s.tables_dir / "micro_batches")
            shutil.copytree(micro, clustered.output_table)
            compact = maintenance.optimize(s, tables=["waveforms"])[0]
            shutil.copytree(micro, s.tables_dir / "compacted")
            zorder = maintenance.optimize(clustered, tables=["waveforms"], zorder=True)[0]
            states = _measure(
                spark,
                [
                    ("one batch", one),
                    ("micro-batches", s.tables_dir / "micro_batches"),
                    ("compacted", s.tables_dir / "compacted"),
                    (ZORDERED, clustered.output_table),
                ],
                options,
            )
        vacuum = maintenance.vacuum(clustered, tables=["waveforms"], retention_hours=0)[0]
    finally:
        LocalEngine(s).down(force=True)
        shutil.rmtree(s.home, ignore_errors=True)
    base, day, dedupe = (states[0][k] for k in ("read_median_s", "day_median_s", "dedupe_median_s"))
    for state in states:
        state["vs_one_batch"] = round(state["read_median_s"] / base, 2) if base else None
        state["day_vs_one_batch"] = round(state["day_median_s"] / day, 2) if day else None
        state["dedupe_vs_one_batch"] = round(state["dedupe_median_s"] / dedupe, 2) if dedupe else None
    return {
        **run_header("table_layout", stamp, began, options),
        "append_s": commits["seconds"],
        "commits": commits,
        "one_batch_write_s": round(one_batch_s, 1),
        "optimize": {"compact": compact, "zorder": zorder},
        "vacuum": vacuum,
        "states": states,
    }


def goals(result: dict) -> list[tuple[str, bool | None, str]]:
    by = {s["state"]: s for s in result["states"]}
    out = []
    for state in ("compacted", ZORDERED):
        ratio = by.get(state, {}).get("vs_one_batch")
        out.append(
            (
                f"{state}: a read within {GOAL_RATIO:g}x of the one-batch table's",
                None if ratio is None else ratio <= GOAL_RATIO,
                f"{ratio}x",
            )
        )
    errors = [e for s in result["states"] for e in s["errors"]]
    out.append(("every waveform exactly once in every state", not errors, "; ".join(errors) or "yes"))
    return out


def to_markdown(result: dict, chart_name: str = "table-layout.png") -> str:
    o, m = result["options"], result["machine"]
    total_mb = o["batches"] * o["per_batch"] * o["waveform_bytes"] / 1e6
    lines = [
        f"# Table layout: many small runs from {o['sources']} sources, then maintenance",
        "",
        f"`{o['command']}` at wavepipe commit {m.get('wavepipe_commit') or '?'}, started {result['started']} UTC, "
        f"{result['seconds']:.0f} s in all.",
        "",
        f"**Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}; Python {m['python']}; "
        f"pyspark {m['pyspark']}, delta-spark {m['delta_spark']}; the Spark engine (Spark Connect, local[2]).",
        "",
        f"{o['batches']} micro-batches of {o['per_batch']} waveforms ({o['waveform_bytes'] // 1024} KiB of noise "
        f"each; {total_mb:.0f} MB in all) from {o['sources']} sources, start times over {o['hours']:g} h (two "
        "dates), each appended in its own Delta commit through the publish step's writer, the table partitioned "
        f"by {', '.join(result.get('commits', {}).get('partition_by') or ['date'])} "
        f"({result['append_s']:.0f} s in all); the same rows written in one batch ({result['one_batch_write_s']:.0f} s). "
        f"A typical read: one source over one hour, payloads summed (and one source over a day: a whole "
        f"partition; and a run's look-up of its {o['per_batch']} ids in the table, as every run's dedupe check "
        f"does it: with its ids as a list Delta skips files by, and by a join alone as before); {o['reads']} reads of each across the span, each "
        "on every state in turn (each state a table of its own, copied before the next step, after a "
        "warm-up read each), the median counts. Every read's rows were checked against what was written.",
        "",
        "| table | files | MB | partitions | most files in a partition | hour read p50 (s) | min | max | vs one "
        "batch | day read p50 (s) | vs one batch | a run's id look-up p50 (s) | vs one batch | the same "
        "by a join alone (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["states"]:
        lines.append(
            f"| {s['state']} | {s['files']} | {s['mb']} | {s['partitions']} | {s['files_per_partition_max']} | "
            f"{s['read_median_s']} | {s['read_min_s']} | {s['read_max_s']} | {s['vs_one_batch']}x | "
            f"{s.get('day_median_s', '-')} | {s.get('day_vs_one_batch', '-')}x | "
            f"{s.get('dedupe_median_s', '-')} | {s.get('dedupe_vs_one_batch', '-')}x | "
            f"{s.get('dedupe_join_median_s', '-')} |"
        )
    c, z, v = result["optimize"]["compact"], result["optimize"]["zorder"], result["vacuum"]
    lines += ["", *_commit_lines(result.get("commits"))]
    lines += [
        "",
        f"- `wavepipe table optimize` (compaction): {_rewrote(c)}; `optimize --zorder` on the micro-batches: "
        f"{_rewrote(z)}. Runs wait for the tables' lock meanwhile (their Spark steps hold it too).",
        f"- `wavepipe table vacuum --retention-hours 0` (the clustered table): {v['files_deleted']} replaced files "
        f"({v['bytes_deleted'] / 1e6:.0f} MB) deleted in {v['seconds']} s.",
        "",
        "Goals:",
        "",
    ]
    for name, met, numbers in goals(result):
        lines.append(f"- {'n/a' if met is None else ('met' if met else 'MISSED')}: {name} ({numbers})")
    lines += ["", f"![read time per layout]({chart_name})", ""]
    return "\n".join(lines)


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    states = result["states"]
    panels = [
        ("read_median_s", "one source over one hour (s)"),
        ("day_median_s", "one source over one day (s)"),
        ("dedupe_median_s", "a run's look-up of its ids (s)"),
    ]
    panels = [(k, what) for k, what in panels if all(k in s for s in states)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    names = [s["state"].replace(", ", ",\n") for s in states]
    for ax, (key, what) in zip(axes[0], panels, strict=True):
        bars = ax.bar(names, [s[key] for s in states], color=["grey", "tab:red", "tab:blue", "tab:green"])
        for bar, s in zip(bars, states, strict=True):
            ax.annotate(
                f"{s['files']} files", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom"
            )
        ax.axhline(states[0][key] * GOAL_RATIO, color="grey", linestyle="--", linewidth=0.8, label="1.2x one batch")
        ax.set_ylabel(f"median: {what}")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(f"{result['options']['batches']} micro-batches against one batch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(result: dict, out_dir: Path) -> list[Path]:
    """table-layout.json, .png and .md in ``out_dir`` (a chart that fails to draw loses nothing)."""
    from wavepipe.bench.results import save_page

    name = result["options"].get("name") or "table-layout"
    return save_page(result, out_dir, name, lambda r: to_markdown(r, f"{name}.png"), lambda r, path: chart(r, path))


def _rewrote(step: dict) -> str:
    """What one ``maintenance.optimize`` did, or why it rewrote nothing (its ``skipped``)."""
    if "skipped" in step:
        return f"rewrote nothing ({step['skipped']})"
    return f"{step['files_removed']} files rewritten into {step['files_added']} in {step['seconds']} s"


def _commit_lines(commits: dict | None) -> list[str]:
    """What one micro-batch commit costs, in this layout and (if measured) the earlier one."""
    if not commits:
        return []
    out = [
        f"- Each micro-batch commit, partitioned by {', '.join(commits['partition_by'])}: "
        f"{commits['files_per_commit']:g} file(s), {commits['commit_median_s']} s (median; max "
        f"{commits['commit_max_s']} s)."
    ]
    legacy = commits.get("legacy")
    if legacy:
        ratio = legacy["commit_median_s"] / commits["commit_median_s"] if commits["commit_median_s"] else None
        out.append(
            f"- The same micro-batches partitioned by {', '.join(legacy['partition_by'])} (wavepipe up to 77ad3ff), "
            f"{legacy['batches']} commits: {legacy['files_per_commit']:g} files each, {legacy['commit_median_s']} s "
            f"(median; max {legacy['commit_max_s']} s){f', {ratio:.1f}x the time' if ratio else ''}."
        )
    return out
