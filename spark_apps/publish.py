"""Publishing: a validated run's rows into the published tables, exactly once.

Everything that writes and commits the published tables is here: the group's transaction
(``run_txn``), the waveforms' bytes written once from the staged chunks, the small tables' rows,
and a window run's replacement of its window. Guarantees:

* each new waveform's bytes are written once, into the output table, straight from the staged
  chunks (checked against its checksum again as they are written: a staged file that changed
  since its reader hashed it fails the write, ``StagedChunksChangedError``, and nothing is
  published);
* each table gets one Delta commit that carries the group's transaction (``wavepipe.delta_txn``)
  and only keys not in the table yet, so a retried publish adds nothing twice;
* the output table is written first: a run whose waveforms cannot be written published nothing.

The step takes what validation decided in memory (``ToPublish``); nothing it needs is read again
from the run's files but the staged chunks themselves and the small candidate tables.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import PurePosixPath

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wavepipe import delta_txn, storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import CandidatesMismatchError, ConflictError
from wavepipe.contracts.plan import RunPlan
from wavepipe.contracts.protocol import MIN_TIME_US
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import Named, Published, Reassembled, WindowRows
from wavepipe.delta_files import partition_values
from wavepipe.delta_txn import Txn
from wavepipe.faults import failpoint
from wavepipe.maintenance import table_paths
from wavepipe.run_store import Run, RunStore
from wavepipe.spark_apps.assembly import PUBLISHED_SCHEMA, FilesTarget, Holding, changed_notes
from wavepipe.spark_apps.classify import QUARANTINE_SCHEMA
from wavepipe.spark_apps.quality import GAP_LOOKBACK_S, SUMMARY_COLUMNS, gaps_to_previous, summarize
from wavepipe.spark_apps.quality_hours import (
    HOUR_US,
    QC_KEYS,
    QC_TABLE_SCHEMA,
    READ_COLUMNS,
    as_rows,
    epoch_times,
    hourly,
    touched_hours,
)
from wavepipe.spark_apps.reassemble import (
    DEAD_LETTER_ROWS,
    SHUFFLED,
    STAGED,
    WRITTEN,
    assemble,
    assemble_local,
    changed_notes_dir,
    chunk_files,
    held_dir,
    staged_chunk_files,
    wanted_lists_dir,
    wanted_waveforms,
    written_by_workers,
)
from wavepipe.spark_apps.rejections import Rejection, named, rejection
from wavepipe.spark_apps.tables import (
    TABLE_KEYS,
    WorkerWrites,
    added_files,
    append_new,
    append_rows,
    commit_metric,
    delta_row_count,
    delta_version,
    delta_writer,
    ensure_table,
    removed_files,
    replace_predicate,
    source_rows,
    source_times,
    upsert_rows,
    window_predicate,
    with_txn,
)
from wavepipe.spark_apps.validate import ToPublish

#: Each published table's columns as its first rows make it (``ensure_tables``).
EMPTY_TABLES = {
    "waveforms": PUBLISHED_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "dead_letter": DEAD_LETTER_ROWS,
    "qc": QC_TABLE_SCHEMA,
}

log = logging.getLogger("wavepipe.publish")
_STAMP = pa.timestamp("us", tz="UTC")
#: Where a waveform lies in time: what the ``qc`` table's hours are found from.
TIMES = pa.schema([("source", pa.string()), ("start_time", _STAMP), ("end_time", _STAMP)])

#: The published tables, in the order a run publishes them: its waveforms first, so a run whose
#: waveforms cannot be written (``StagedChunksChangedError``) has published nothing.
PUBLISHED = ("waveforms", "quarantine", "dead_letter")


class StagedChunksChangedError(ConflictError):
    """A staged chunk file changed on disk after its reader hashed it: nothing of the run's
    waveforms was published, and its staged copies were removed so a retry reads them again."""


def publish(
    spark: SparkSession,
    run: Run,
    reassembled: Reassembled,
    what: ToPublish,
    readers_done: Callable[[], object] = lambda: None,
) -> Published:
    """Publish ``run`` (``publish_run``). A staged chunk file changed since its reader hashed it (the assembly left a note saying so)
    publishes nothing and sends the run back to read Kafka again (``StagedChunksChangedError``),
    once ``readers_done()`` says nothing else of the run (the plot) reads its staged files."""
    settings, store = run.settings, run.store
    try:
        done = publish_run(spark, run, reassembled, what)
    except Exception:
        notes = changed_notes(changed_notes_dir(store, run.run_id))
        if not notes:
            raise
        readers_done()
        read_again(run)
        raise StagedChunksChangedError(
            f"run {run.run_id}: {notes[0]}. None of the run's waveforms was published and no offset "
            "moved. Its staged copies were removed: retry the run (`wavepipe run` resumes it) and it reads "
            "its planned ranges again from Kafka; in Airflow, clear the run's tasks from consume on."
        ) from None
    ensure_tables(settings, table_paths(settings))  # those no row has reached yet
    # under the output lock: a table's version now is the run's own commit where it put rows
    versions = {
        name: done.output_table_version if name == "waveforms" else delta_version(path)
        for name, path in table_paths(settings).items()
    }
    return dataclasses.replace(done, table_versions=versions)


def publish_run(spark: SparkSession, run: Run, reassembled: Reassembled, what: ToPublish) -> Published:
    """Append the run's rows to the published tables (keys not there yet only), or for a window
    run replace the window's rows; the rows a quarantining quality rule held back go to the
    quarantine table with the others; then the ``qc`` table's hours they touched (``update_qc``).
    Returns the output table's version after, for a window run the rows of it that the window's
    commit replaced (None: Delta did not say), the ``qc`` rows written and the rows held back."""
    targets = table_paths(run.settings)
    txn = run_txn(run, reassembled)
    settings, store, plan = run.settings, run.store, run.plan
    if settings.quality_metrics and len(what.waveforms):
        what = dataclasses.replace(what, waveforms=with_gaps(what.waveforms, targets["waveforms"]))
    if _holding(store, plan) and (
        plan.is_window or delta_txn.txn_version(targets["waveforms"], txn.app_id) < txn.version
    ):
        storage.delete_tree(held_dir(store, plan.run_id))  # the write to come holds its own
    small = {name: publish_rows(store, plan, name, what.rejection) for name in PUBLISHED[1:]}
    if plan.is_window:
        replaced, held = _replace_window_run(spark, store, plan, reassembled, what, small, targets, txn)
        failpoint("publish.after_write")
        version = delta_version(settings.output_table)
        touched = pa.concat_tables([run_times(what.waveforms), removed_times(targets["waveforms"], version)])
        began = time.monotonic()
        hours = update_qc(settings, plan, touched, txn) if settings.quality_metrics else 0
        names = named_safely(_with_rows(small["quarantine"], held.rows), small["dead_letter"])
        return _published(plan, version, hours, held.moved, names, began, replaced_rows=replaced)
    source = None if what.all_there or not len(what.waveforms) else _waveform_files(spark, store, plan, what.waveforms)
    if source is not None:
        keys, partition_by = TABLE_KEYS["waveforms"]
        checked = what.checked_version if what.in_table == 0 else None
        scope = sorted(what.waveforms["waveform_id"])
        append_new(source, targets["waveforms"], keys, partition_by, checked_version=checked, txn=txn, scope=scope)
    held = held_rejection(store, plan)
    small["quarantine"] = _with_rows(small["quarantine"], held.rows)
    for name, rows in small.items():
        if rows is not None:
            append_rows(rows, targets[name], TABLE_KEYS[name][0], txn, _run_keys(plan, name, rows))
    failpoint("publish.after_write")
    began = time.monotonic()
    hours = update_qc(settings, plan, run_times(what.waveforms), txn) if settings.quality_metrics else 0
    names = named_safely(small["quarantine"], small["dead_letter"])
    return _published(plan, delta_version(settings.output_table), hours, held.moved, names, began)


def _published(plan: RunPlan, version: int | None, hours, held, names, qc_began: float, **more) -> Published:
    """The run's ``Published`` record as its commits left it (``qc_began``: when the ``qc``
    table's update began)."""
    return Published(
        run_id=plan.run_id,
        output_table_version=version,
        qc_hours=hours,
        held=held,
        named=names,
        timings={"qc_table_s": time.monotonic() - qc_began},
        **more,
    )


def named_safely(quarantine: pa.Table | None, dead_letter: pa.Table | None) -> Named | None:
    """``rejections.named`` of the rows a run publishes; None (and a warning) if that fails: the
    names only describe the run, the tables hold the rows."""
    try:
        return named(quarantine, dead_letter)
    except Exception:  # only describes the run
        log.warning("the quarantined waveforms and dead letters could not be named", exc_info=True)
        return None


def named_in_run(store: RunStore, plan: RunPlan, rejection: Rejection) -> Named:
    """The quarantined waveforms and dead letters run ``plan`` would publish (``publish_rows``:
    its candidate tables, read by delta-rs, and the waveforms validation rejected), by name: for
    a run that failed validation and publishes nothing."""
    return named(*(publish_rows(store, plan, name, rejection) for name in PUBLISHED[1:]))


def ensure_tables(settings: Settings, targets: dict[str, str]) -> None:
    """Make each published table that is not there yet, empty with its schema: from a group's
    first publish on, every reader finds all of them (the ``qc`` table while quality is measured),
    not only the ones a row has reached. Called once a publish committed its rows: a table they
    reached was made by them (its first version holds them), and a publish that failed leaves
    nothing new behind."""
    for name, schema in EMPTY_TABLES.items():
        if name != "qc" or settings.quality_metrics:
            partition_by = TABLE_KEYS[name][1] if name in TABLE_KEYS else None
            if ensure_table(targets[name], schema, partition_by):
                log.info("%s: made empty, with its schema (the first rows come later)", targets[name])


def _with_rows(rows: pa.Table | None, more: pa.Table | None) -> pa.Table | None:
    parts = [t for t in (rows, more) if t is not None]
    return pa.concat_tables(parts, promote_options="default") if parts else None


def held_rejection(store: RunStore, plan: RunPlan) -> Rejection:
    """The rows a quarantining quality rule held back from run ``plan``'s output
    (``assembly.hold_apart``) as quarantine rows: the reason, the first quarantining rule a row
    breaks (``QualityRule.reason``), the detail, how (``QualityRule.explain``); and where their
    records go in the run's accounting (``rejections.rejection``). A row held twice (a retried
    Spark task) counts once."""
    rules = [r for r in store.settings.quality() or () if r.quarantine]
    folder = held_dir(store, plan.run_id)
    names = storage.files(folder, ".parquet") if rules else []
    if not names:
        return Rejection()
    held = pa.concat_tables([storage.read_parquet(n) for n in names], promote_options="default")
    rejected: dict[str, dict] = {}
    for row in held.to_pylist():
        flagged = row["qc_flags"] or []
        rule = next((r for r in rules if r.name in flagged), None)
        rejected.setdefault(
            row["waveform_id"],
            {
                "reason": rule.reason if rule else f"qc_{flagged[0]}",
                "detail": rule.explain(row) if rule else f"breaks quality rule {flagged[0]}",
                **{k: row[k] for k in ("checksum", "partition", "first_offset")},
            },
        )
    return rejection(list(chunk_files(store, plan).values()), rejected, plan.run_id)


def _holding(store: RunStore, plan: RunPlan) -> Holding | None:
    """What the run's quarantining quality rules hold back, and where (None: no such rule)."""
    names = frozenset(r.name for r in store.settings.quality() or () if r.quarantine)
    if not names:
        return None
    folder = held_dir(store, plan.run_id)
    return Holding(names, folder, storage.worker_options(folder))


def run_times(waveforms: pd.DataFrame) -> pa.Table:
    """``source``, ``start_time``, ``end_time`` of ``waveforms`` (manifest rows)."""
    return pa.Table.from_pandas(waveforms[list(TIMES.names)], preserve_index=False).cast(TIMES)


def removed_times(path: str, version: int | None) -> pa.Table:
    """``source``, ``start_time``, ``end_time`` of the rows table ``path``'s commit ``version``
    removed (``_file_times``; their files are there until a VACUUM)."""
    parts = [_file_times(path, f) for f in ([] if version is None else removed_files(path, version))]
    return pa.concat_tables(parts) if parts else TIMES.empty_table()


def _file_times(path: str, relative: str) -> pa.Table:
    """``TIMES`` of the rows of the table's data file ``relative``, only these columns read: a row
    without ``end_time`` (written before it) ends at its start; a table an earlier wavepipe
    partitioned by source names it in the file's folders."""
    uri = storage.join(path, relative)
    there = storage.parquet_dataset([uri]).schema.names
    rows = storage.read_parquet(uri, columns=[c for c in TIMES.names if c in there])
    folders = partition_values(PurePosixPath(relative))
    source = rows["source"] if "source" in there else pa.repeat(folders.get("source"), rows.num_rows)
    end = rows["end_time"] if "end_time" in there else rows["start_time"]
    return pa.table({"source": source, "start_time": rows["start_time"], "end_time": end}).cast(TIMES)


def update_qc(settings: Settings, plan: RunPlan, touched: pa.Table, txn: Txn) -> int | None:
    """Recompute the ``qc`` table's row of each source and hour ``touched`` covers (the run's
    waveforms, and for a window run the rows its commit replaced) from the waveforms table as it
    is now (``quality_hours.hourly``), in one commit that carries ``txn``: a retried publish
    commits it once. Returns the hours written (None: an earlier attempt wrote them). delta-rs in
    this process: no Spark job."""
    hours = touched_hours(epoch_times(touched))
    if hours.empty:
        return 0
    first, until = int(hours["hour"].min()), int(hours["hour"].max()) + HOUR_US
    since = max(first - GAP_LOOKBACK_S * 1_000_000, MIN_TIME_US)
    sources = sorted(set(hours["source"]))
    read = source_rows(settings.output_table, sources, since, until, READ_COLUMNS, ends_after_us=first)
    if read is None:  # no waveform measured there
        return 0
    rows = hourly(as_rows(read), hours, plan.run_id)
    return rows.num_rows if upsert_rows(rows, settings.qc_table, QC_KEYS, txn) else None


def with_gaps(waveforms: pd.DataFrame, output: str) -> pd.DataFrame:
    """``waveforms`` (manifest rows) with ``gap_s``, each one's gap to its source's previous
    waveform (``quality.gaps_to_previous``): among the run's, and the output table's that start up
    to ``quality.GAP_LOOKBACK_S`` before the run's first of that source (delta-rs; no Spark job)."""
    run = pa.Table.from_pandas(waveforms[["waveform_id", "source", "start_time", "end_time"]], preserve_index=False)
    starts = run["start_time"].cast(pa.int64())
    since = max(pc.min(starts).as_py() - GAP_LOOKBACK_S * 1_000_000, MIN_TIME_US)
    earlier = source_times(output, sorted(set(run["source"].to_pylist())), since, pc.max(starts).as_py() + 1)
    mine = set(run["waveform_id"].to_pylist())  # a retried publish's rows already there are the run's own
    earlier = earlier.filter(pc.invert(pc.is_in(earlier["waveform_id"], value_set=pa.array(sorted(mine)))))
    gaps = gaps_to_previous(run, earlier)
    return waveforms.assign(gap_s=[gaps[w] for w in waveforms["waveform_id"]])


def quality_summary(settings: Settings, version: int | None) -> dict | None:
    """``quality.summarize`` of the waveforms the run's commit (version ``version`` of the output
    table) published, read from the files that commit added: only their quality columns, no Spark
    job. None: the run measured none (``quality_metrics`` off, or it published no waveform)."""
    rules = settings.quality()
    if rules is None or version is None:
        return None
    path = settings.output_table
    parts = [storage.read_parquet(storage.join(path, f), columns=SUMMARY_COLUMNS) for f in added_files(path, version)]
    if not parts:
        return None
    return summarize(pa.concat_tables(parts), rules)


def publish_rows(store: RunStore, plan: RunPlan, name: str, rejection: Rejection) -> pa.Table | None:
    """The run's rows of the small published table ``name`` (quarantine, dead letters; None:
    none): its candidate table, read by delta-rs, and for the quarantine the rows of the
    waveforms ``rejection`` holds (those go there instead of the waveforms)."""
    source = storage.join(store.candidate_dir(plan.run_id), name)
    parts = [storage.delta_table(source).to_pyarrow_table()] if delta_version(source) is not None else []
    if name == "quarantine" and rejection.rows is not None:
        parts.append(rejection.rows)
    return pa.concat_tables(parts, promote_options="default") if parts else None


def _waveform_files(spark: SparkSession, store: RunStore, plan: RunPlan, waveforms: pd.DataFrame) -> WorkerWrites:
    """The ``waveforms`` (manifest rows), for Spark's Python workers to write as Parquet files
    into the output table's new folder themselves (``_assembled``): one Spark job, and the bytes
    never pass through the JVM."""

    def files(target: FilesTarget, skip: set[str]) -> DataFrame:
        parts = _assembled(spark, store, plan, waveforms[~waveforms["waveform_id"].isin(skip)], target)
        return _union(parts) if parts else spark.createDataFrame([], WRITTEN)

    return WorkerWrites(PUBLISHED_SCHEMA, plan.run_id, files)


def _staged_waveforms(spark: SparkSession, store: RunStore, plan: RunPlan, waveforms: pd.DataFrame) -> DataFrame | None:
    """The ``waveforms`` (manifest rows) with their payloads as a Spark frame (``_assembled``),
    for Delta's own writer (a window run's ``replaceWhere``); None: none."""
    parts = _assembled(spark, store, plan, waveforms, None)
    return _union(parts).drop("checksum_ok").withColumn("run_id", F.lit(plan.run_id)) if parts else None


def _assembled(
    spark: SparkSession, store: RunStore, plan: RunPlan, waveforms: pd.DataFrame, writes: FilesTarget | None
) -> list[DataFrame]:
    """The ``waveforms`` assembled from the staged chunks, strictly (one whose chunks no longer
    hash to its checksum fails the write and leaves a note, ``changed_notes_dir``): streamed from
    their partition's staged file (``assemble_local``), or grouped by a shuffle (``assemble``).
    ``writes``: the workers write them there as Parquet files and the frames hold the files."""
    staged, shuffled = (waveforms[waveforms["written_from"] == kind] for kind in (STAGED, SHUFFLED))
    batch_bytes, notes, parts = store.settings.output_batch_bytes, changed_notes_dir(store, plan.run_id), []
    if len(staged):
        files = chunk_files(store, plan)
        parts.append(
            assemble_local(
                spark,
                files,
                staged,
                batch_bytes,
                wanted_lists_dir(store, plan.run_id),
                scope=plan.run_id,
                strict=True,
                notes=notes,
                writes=writes,
                quality=store.settings.quality(),
                holding=_holding(store, plan),
            )
        )
    if len(shuffled):
        chunks = spark.read.parquet(*map(storage.for_spark, staged_chunk_files(store, plan)))
        wanted, quality = wanted_waveforms(spark, shuffled), store.settings.quality()
        holding = _holding(store, plan)
        rows = assemble(chunks, wanted, scope=plan.run_id, strict=True, notes=notes, quality=quality, holding=holding)
        parts.append(rows if writes is None else written_by_workers(rows, writes))
    return parts


def _union(parts: list[DataFrame]) -> DataFrame:
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def _replace_window_run(
    spark: SparkSession,
    store: RunStore,
    plan: RunPlan,
    reassembled: Reassembled,
    what: ToPublish,
    small: dict[str, pa.Table | None],
    targets: dict,
    txn: Txn,
) -> tuple[int | None, Rejection]:
    """Window run ``plan``'s publish: each table's rows of the window replaced (``replace_window``),
    the waveforms' first (the rows a quarantining quality rule holds back join the quarantine's).
    Returns the output table's rows the commit replaced, and the rows held back."""
    rows = reassembled.window_rows
    if rows is None:
        raise CandidatesMismatchError(
            f"run {plan.run_id}: its reassembly recorded no window rows; run the reassemble step again"
        )
    waveforms = _staged_waveforms(spark, store, plan, what.waveforms)
    replaced = replace_window(spark, waveforms, targets["waveforms"], "waveforms", plan, rows, txn)
    held = held_rejection(store, plan)
    small = {**small, "quarantine": _with_rows(small["quarantine"], held.rows)}
    outside = [*what.rejection.outside(plan.window_offsets()), *held.outside(plan.window_offsets())]
    rows = WindowRows(keep=rows.keep, extra={**rows.extra, "quarantine": [*rows.extra.get("quarantine", []), *outside]})
    for name in PUBLISHED[1:]:
        source = None if small[name] is None else spark.createDataFrame(small[name])
        replace_window(spark, source, targets[name], name, plan, rows, txn)
    return replaced, held


def _run_keys(plan: RunPlan, name: str, rows: pa.Table) -> list[str] | tuple[str, dict]:
    """Where the run's ``rows`` of the small published table ``name`` can collide with rows
    already there (the ``scope`` of ``append_rows``): their waveform ids, or for dead letters the
    run's topic and ranges' offsets. A publish compares its keys with those rows only, never with
    every key of a table that grows with every run."""
    if name == "dead_letter":
        return plan.topic, {r.partition: (r.start, r.end) for r in plan.ranges}
    return sorted({wid for wid in rows.column("waveform_id").to_pylist() if wid is not None})


def run_txn(run: Run, reassembled: Reassembled) -> Txn:
    """The transaction every commit of run ``plan`` to a published table carries: its group's
    stable id, the version frozen in its plan (a plan made while a table could not be read gets
    one now, and keeps it), and its ranges and safe offsets as the commit's metadata."""
    plan = run.plan
    app = delta_txn.app_id(plan.group, plan.topic)
    if plan.txn_version is None:
        plan = dataclasses.replace(plan, txn_version=delta_txn.next_version(table_paths(run.settings).values(), app))
        run.replan(plan)
    safe = {p: acc.safe_offset for p, acc in reassembled.partitions.items()}
    return Txn(app, plan.txn_version, delta_txn.commit_metadata(plan, safe))


def replace_window(
    spark: SparkSession,
    source: DataFrame | None,
    target: str,
    name: str,
    plan: RunPlan,
    rows: WindowRows,
    txn: Txn | None = None,
) -> int | None:
    """Replace the rows of window run ``plan``'s window in ``target`` by ``source``, in one atomic
    Delta commit (``replaceWhere``): readers see the old window or the new one, and a retry
    replaces it again with the same rows. No rows (None): the window's rows are deleted (the
    window now holds none of this table's rows). ``rows``: the reassembly's ``window_rows`` (rows
    kept although inside the window, rows replaced although outside it). Returns the rows of
    ``target`` that the commit removed (Delta's commit metric; None when it does not say)."""
    keys, partition_by = TABLE_KEYS[name]
    if name == "dead_letter":  # records, not waveforms: the window's offsets say it all
        where = window_predicate(plan.topic, plan.window_offsets(), "offset")
    else:
        where = replace_predicate(
            plan.topic, plan.window_offsets(), "first_offset", rows.keep, rows.extra.get(name, [])
        )
    before = delta_version(target)
    if before is None:
        if source is not None:
            append_new(source, target, keys, partition_by, txn=txn)
        return 0
    if source is None and delta_row_count(target) == 0:  # nothing there to delete: no Spark job
        return 0
    if source is None:  # SQL: Delta's Python API needs a plugin over Spark Connect
        spark.sql(f"DELETE FROM delta.`{storage.for_spark(target)}` WHERE {where}")
    else:
        with_txn(delta_writer(source), txn).mode("overwrite").option("replaceWhere", where).option(
            "mergeSchema", "true"
        ).save(storage.for_spark(target))
    after = delta_version(target)
    if after == before:
        return 0
    try:  # only describes the run: the window is replaced whatever this says
        return commit_metric(target, after, "numDeletedRows")
    except (OSError, ValueError) as exc:
        log.warning("%s: the rows its commit %s replaced are not known: %s", target, after, exc)
        return None


def read_again(run: Run) -> None:
    """Forget the run's staged copies and every result made from them: its next attempt reads its
    planned ranges again (Kafka holds the records; the plan is kept)."""
    run.store.discard_staging(run.run_id)
    run.clear(*(Step.consume(r) for r in run.plan.ranges), Step.REASSEMBLE, Step.VALIDATE, Step.PUBLISH)
