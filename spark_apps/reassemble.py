"""Reassembly: one run's staged chunks in, its candidate tables out (the waveforms it would
publish, without their payloads; its quarantine and dead-letter rows).

``reassemble_run`` replaces the run's candidate tables (small, written by delta-rs) and
returns the run's accounting; the Spark parts (``assemble``, ``assemble_local``) are
``DataFrame -> DataFrame`` functions. Guarantees:

* a waveform is written once: ids already in the output table are never candidates again, so a
  retried run, a re-read after a rewind, or pending chunks read a second time add no rows;
* an id names one content: chunks of an id that is in the output with the same ``wp-checksum``
  are a re-delivery (counted ``output_already_written``), chunks with another checksum are another
  content under a reused id, quarantined as ``id_conflict`` with both checksums, never dropped;
* one pass over the bytes: a waveform whose chunks one reader staged in order was hashed by that
  reader as it staged them (``consumers/staging.py``); it is verified from that digest and its
  row made from the chunks' metadata alone (the ``manifest``), so no payload is read here. Only
  the other waveforms (out of order, repeated, spread over partitions) are assembled now, by
  Spark, to verify them: their metadata comes back, their payload is not written anywhere;
* the metadata is worked on once, in this process (``spark_apps/classify.py``: pyarrow and
  pandas, no Spark job): classification, routes, accounting, quarantine rows, the manifest; the
  run's ids are looked up in the published tables by delta-rs (``tables.id_rows``);
* nothing is published here: the manifest, quarantine and dead-letter rows go to the run's
  candidate tables (small, written by delta-rs: no Spark job), which the validate step checks;
  publishing then writes each waveform's bytes once, straight from the staged chunks into the
  output table, in one Spark write;
* every staged record ends in one place: an output waveform, pending (incomplete, re-read next
  run from the partition's safe offset), quarantine (with a reason) or dead letter (with a reason).

The joining of payloads itself is ``spark_apps/assembly.py`` (pure pyarrow); here Spark runs it
where the bytes are.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from wavepipe import storage
from wavepipe.contracts.errors import StepFailedError
from wavepipe.contracts.plan import RunPlan, utc_now
from wavepipe.contracts.rows import DEAD_LETTER_SCHEMA, QUALITY_NAMES
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import PartitionAccount, ReadStats, Reassembled, WindowRows
from wavepipe.faults import armed, failpoint
from wavepipe.run_store import Run, RunStore, staged_paths
from wavepipe.spark_apps.assembly import (
    ARROW_OUTPUT_SCHEMA,
    WRITTEN_SCHEMA,
    FilesTarget,
    Holding,
    Rules,
    assemble_arrow,
    assemble_tasks,
    hold_apart,
    write_parquet,
    write_wanted,
)
from wavepipe.spark_apps.classify import (
    CANDIDATE,
    DIGEST,
    LOCAL,
    OTHER_WINDOW,
    OUTPUT,
    PENDING,
    QUARANTINED,
    SHUFFLE,
    accounting,
    by_waveform,
    classify,
    conflict_status,
    final_status,
    inside_window,
    quarantine_rows,
    read_meta,
    route,
    split_conflicts,
)
from wavepipe.spark_apps.tables import delta_version, id_rows

log = logging.getLogger("wavepipe.reassemble")

#: The output table's columns as Spark types (``assembly.ARROW_OUTPUT_SCHEMA``'s).
OUTPUT_SCHEMA = from_arrow_schema(ARROW_OUTPUT_SCHEMA, prefer_timestamp_ntz=False)
#: The files a worker wrote (``assembly.WRITTEN_SCHEMA``), as Spark's schema.
WRITTEN = from_arrow_schema(WRITTEN_SCHEMA)
#: A waveform is one binary cell of one row: Spark and Arrow cap those near 2 GiB; keep margin.
MAX_WAVEFORM_BYTES_LIMIT = 1024 * 1024 * 1024


def assemble_local(
    spark: SparkSession,
    files: dict[int, str],
    rows: pd.DataFrame,
    batch_bytes: int,
    lists: str,
    scope: str = "",
    strict: bool = False,
    verify_only: bool = False,
    notes: str | None = None,
    writes: FilesTarget | None = None,
    quality: Rules | None = (),
    holding: Holding | None = None,
) -> DataFrame:
    """Whole waveforms for the waveforms ``rows`` names (id, checksum, partition; ``gap_s``, the
    run's, where it has it), whose chunks are
    all in one partition's staged file, each file streamed by one task: no shuffle of payloads
    (the common case with keyed producers). The tasks (a staged file and the file of the ids wanted
    from it, written under folder ``lists``: ``wanted_lists_dir``) are made here and handed to
    Spark as a local relation, which it splits over its cores: no Spark job before the one that
    assembles. ``batch_bytes``: the setting ``output_batch_bytes``; ``scope``: what the
    run's failpoints count their hits in (the run id); ``strict``, ``verify_only``, ``notes``: see
    ``assemble_file``. ``writes``: the workers write the waveforms as Parquet files there
    themselves (``assembly.write_parquet``) and the frame holds the files written
    (``WRITTEN``), not the rows. ``quality``: the rules the rows' measured quality is
    flagged by (``Settings.quality``; None: not measured; never when ``verify_only``: no payload);
    ``holding``: the rows a quarantining rule holds back (``assembly.hold_apart``)."""
    lists = storage.join(lists, uuid.uuid4().hex)  # a retried publish's lists never meet an earlier one's
    tasks = []
    carried = [c for c in ("waveform_id", "checksum", "gap_s") if c in rows.columns]
    for p, group in rows.groupby("partition")[carried]:
        if p in files:
            tasks.append((files[p], storage.join(lists, f"p{p}.parquet")))
            write_wanted(pa.Table.from_pandas(group, preserve_index=False), tasks[-1][1])
    failpoints = armed()  # the workers (a Spark engine's) do not have this process's environment
    reach = storage.worker_options(next(iter(files.values()), ""))  # an object store's endpoint: no keys

    def tasks_of_this_run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = assemble_tasks(batches, failpoints, scope, strict, batch_bytes, verify_only, reach, notes, quality)
        rows = (hold_apart(batch, holding) for batch in rows)
        return rows if writes is None else write_parquet(rows, writes)

    local = spark.createDataFrame(tasks, "path string, wanted string")
    return local.mapInArrow(tasks_of_this_run, OUTPUT_SCHEMA if writes is None else WRITTEN)


def written_by_workers(rows: DataFrame, writes: FilesTarget) -> DataFrame:
    """Output ``rows`` (``assemble``'s) written as Parquet files at ``writes`` by Spark's Python
    workers (``assembly.write_parquet``); the frame of the files written (``WRITTEN``)."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return write_parquet(batches, writes)

    return rows.mapInArrow(write, WRITTEN)


def wanted_lists_dir(store: RunStore, run_id: str) -> str:
    """Where ``assemble_local`` writes the ids each of its tasks assembles (removed with the staging)."""
    return storage.join(store.staging_dir(run_id), "wanted")


def held_dir(store: RunStore, run_id: str) -> str:
    """Where the workers write the rows a quarantining quality rule holds back from the output
    (``assembly.hold_apart``): in the run's staging, until its publish quarantines them."""
    return storage.join(store.staging_dir(run_id), "held")


def changed_notes_dir(store: RunStore, run_id: str) -> str:
    """Where an assembly that finds a staged file changed since its reader hashed it leaves a note
    (``assembly.changed_notes``): in the run's staging, so a read from Kafka again drops them."""
    return storage.join(store.staging_dir(run_id), "changed")


def chunk_files(store: RunStore, plan: RunPlan) -> dict[int, str]:
    """Per partition read, the run's staged chunk file (where its reader staged it)."""
    return {r.partition: staged_paths(store, plan.run_id, r)[0] for r in plan.ranges if r.size}


#: The manifest: one row per waveform the run publishes, all its output columns but the payload,
#: and ``written_from``, how publish writes its bytes (once, straight from the staged chunks):
#: ``staged`` (its partition's staged file streamed, no shuffle) or ``shuffled`` (its chunks
#: grouped by a shuffle over the run's staged files). Every row's payload was verified against
#: its checksum before the row was made (by its reader, or by an assembly that kept no payload).
STAGED, SHUFFLED = "staged", "shuffled"
MANIFEST_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields if f.name not in ("payload", "checksum_ok", *QUALITY_NAMES)]


def assemble(
    chunks: DataFrame,
    candidates: DataFrame,
    scope: str = "",
    strict: bool = False,
    verify_only: bool = False,
    notes: str | None = None,
    quality: Rules | None = (),
    holding: Holding | None = None,
) -> DataFrame:
    """Whole waveforms for the candidate ids (one row each; payload null where the checksum fails),
    grouped by a shuffle: for waveforms spread over partitions or with duplicate chunks. Where the
    candidates have a ``checksum``, only chunks carrying it are used (not another content's); where
    they have a ``gap_s``, it is the row's. ``strict``, ``verify_only``, ``notes``, ``quality``:
    see ``assemble_arrow``; ``holding``: see ``assemble_local``."""
    keys = ["waveform_id", "checksum"] if "checksum" in candidates.columns else ["waveform_id"]
    if "gap_s" in candidates.columns:
        wanted = chunks.join(candidates.select(*keys, "gap_s"), keys, "inner")
    else:
        wanted = chunks.join(candidates.select(*keys), keys, "left_semi")
    failpoints = armed()

    def one_waveform(table: pa.Table) -> pa.Table:
        row = assemble_arrow(table, failpoints, scope, strict, verify_only, notes, quality)
        return pa.Table.from_batches([hold_apart(b, holding) for b in row.to_batches()], row.schema)

    return wanted.groupBy("waveform_id").applyInArrow(one_waveform, OUTPUT_SCHEMA)


# --- I/O -------------------------------------------------------------------------------------------


@dataclass
class _Found:
    """What a run's metadata pass found (``_classified``): the chunks as the output knows them
    (``meta``) and those of ids the output holds under another checksum (``conflicts``), each
    waveform's classification, the output's ids before the run's write, and the waveforms
    quarantined earlier (id -> reason)."""

    meta: pd.DataFrame
    conflicts: pd.DataFrame
    classified: pd.DataFrame
    before: set[str]
    quarantined: dict[str, str]
    output_version: int | None


def reassemble_run(spark: SparkSession, run: Run) -> tuple[Reassembled, pa.Table | None]:
    """Reassemble ``run``'s staged chunks into its candidate tables; return the accounting.

    The chunk metadata is classified in this process (``spark_apps/classify.py``), the run's ids
    looked up in the output and quarantine tables by delta-rs; Spark assembles (to verify them)
    only the waveforms its readers could not verify as they staged them (out of order, spread over
    partitions). Returns the accounting and the manifest it wrote (None: no new waveform), which
    validation takes in memory when it runs in this process."""
    settings, store, plan = run.settings, run.store, run.plan
    chunk_paths = staged_chunk_files(store, plan)
    # the candidates are made again from the staged chunks: an earlier result, and any validation
    # of it, is void until this one is saved (after every candidate table is written)
    run.clear(Step.REASSEMBLE, Step.VALIDATE, Step.PUBLISH)
    candidates = store.candidate_dir(plan.run_id)
    storage.delete_tree(candidates)
    timings: dict[str, float] = {}
    t = time.monotonic()
    found = _classified(spark, run, chunk_paths)
    fresh = found.classified[
        (found.classified["status"] == CANDIDATE)
        & ~found.classified["waveform_id"].isin(found.quarantined)  # quarantined once, quarantined for good
        & ~found.classified["waveform_id"].isin(found.before)
    ]
    digests = _digests(store.staged_files(plan.run_id, "digests"))
    routed = route(fresh, None if digests is None else digests.select(_ROUTED_BY).to_pandas())
    timings["classify_s"] = time.monotonic() - t
    t = time.monotonic()
    manifest = _verify_assembled(spark, settings, store, plan, routed, digests, chunk_paths)
    timings["assemble_verify_s"] = time.monotonic() - t
    t = time.monotonic()
    written = set(manifest.column("waveform_id").to_pylist()) if manifest is not None else set()
    status = final_status(found.classified, found.before, found.before | written, found.quarantined)
    conflicted = conflict_status(found.conflicts, plan.window_offsets() if plan.is_window else None)
    rows = accounting(found.meta, status) + accounting(found.conflicts, conflicted)
    waveforms = by_waveform(pd.concat([status, conflicted], ignore_index=True))
    quarantine = None
    if any(w["status"] == QUARANTINED for w in waveforms):
        quarantine = _quarantine_candidates(
            found, status, conflicted, plan.run_id, storage.join(candidates, "quarantine")
        )
    dead_counts, other_dead = _stage_dead_letters(store, plan, storage.join(candidates, "dead_letter"))
    timings["accounting_s"] = time.monotonic() - t
    result = summarize(plan, rows, waveforms, dead_counts, timings, other_dead)
    result.output_version = found.output_version
    # what validation must find in the candidate tables (anything else: they are not this result's)
    result.candidates = {
        "manifest": result.waveforms.get("output_new", 0),
        "quarantine": quarantine.num_rows if quarantine is not None else 0,
        "dead_letter": sum(n for n, _ in dead_counts.values()),
    }
    result.verified = _verified_by(routed)
    if plan.is_window:
        result.window_rows = window_rows(plan, status, manifest, quarantine)
    return result, manifest


def _quarantine_candidates(
    found: _Found, status: pd.DataFrame, conflicted: pd.DataFrame, run_id: str, path: str
) -> pa.Table:
    """The run's quarantine rows (its own waveforms', and those of other contents under ids the
    output holds), written to the candidate table at ``path`` by delta-rs: no Spark job."""
    rows = pa.concat_tables(
        [quarantine_rows(found.meta, status, run_id), quarantine_rows(found.conflicts, conflicted, run_id)]
    )
    storage.write_delta(path, rows)
    return rows


def _verified_by(routed: pd.DataFrame) -> dict[str, int]:
    """How the new candidates were verified (the rest failed their checksum: quarantined)."""
    kinds = routed.groupby(["route", routed["digest_ok"].astype(str)]).size().to_dict()
    return {
        "while_read": kinds.get((DIGEST, "True"), 0),
        "from_one_staged_file": kinds.get((LOCAL, "None"), 0),
        "by_a_shuffle": kinds.get((SHUFFLE, "None"), 0),
    }


def staged_chunk_files(store: RunStore, plan: RunPlan) -> list[str]:
    """The run's staged chunk files; an error naming the ranges whose reader has not staged them."""
    chunk_paths = store.staged_files(plan.run_id, "chunks")
    staged = {p.rpartition("/")[2].removesuffix(".parquet") for p in chunk_paths}
    missing = [r.name for r in plan.ranges if r.size and r.name not in staged]
    if missing:
        raise StepFailedError(f"run {plan.run_id}: ranges not staged yet: {', '.join(missing)}; run their consume step")
    return chunk_paths


def _classified(spark: SparkSession, run: Run, chunk_paths: list[str]) -> _Found:
    """The run's chunk metadata (read here: no payload, no Spark job), its ids looked up in the
    output and quarantine tables (by delta-rs, skipping files that cannot hold them), and each
    waveform classified (``metadata.classify``). A window run recomputes the window's rows: the
    tables' other rows are what was there before."""
    settings, plan = run.settings, run.plan
    if not 0 < settings.max_waveform_bytes <= MAX_WAVEFORM_BYTES_LIMIT:
        raise ValueError(f"max_waveform_bytes must be in 1..{MAX_WAVEFORM_BYTES_LIMIT} (a waveform is one Spark row)")
    meta = read_meta(chunk_paths)
    ids = sorted(meta["waveform_id"].dropna().unique().tolist())
    output_version = delta_version(settings.output_table)  # before the look-up: a later write changes it
    # the output's rows with the run's ids, and their checksums: an id there under another
    # checksum is a reused id, a conflict; its chunks are set apart, the rest are the waveforms'
    known = earlier_rows(settings.output_table, plan, ids, ["checksum"])
    meta, conflicts = split_conflicts(meta, known)
    newest = {}
    for r in plan.ranges:
        read = run.result(Step.consume(r), ReadStats)
        if read is not None and read.max_timestamp_ms is not None:
            newest[r.partition] = read.max_timestamp_ms
    classified = classify(
        meta,
        max_waveform_bytes=settings.max_waveform_bytes,
        ends={r.partition: r.end for r in plan.ranges},
        newest_ms=newest,
        incomplete_after_offsets=settings.incomplete_after_offsets,
        incomplete_after_ms=int(settings.incomplete_after_s * 1000),
        window=plan.window_offsets() if plan.is_window else None,
    )
    earlier = earlier_rows(settings.quarantine_table, plan, ids, ["reason"])
    # an id_conflict row is about another content under the id: it does not quarantine this one
    earlier = earlier[earlier["counted"] & (earlier["reason"] != "id_conflict")]
    firsts = earlier.sort_values(["waveform_id", "reason"]).drop_duplicates("waveform_id")
    quarantined = dict(zip(firsts["waveform_id"], firsts["reason"], strict=True))
    before = set(known.loc[known["counted"], "waveform_id"])
    return _Found(meta, conflicts, classified, before, quarantined, output_version)


def earlier_rows(table: str, plan: RunPlan, ids: list[str], columns: list[str]) -> pd.DataFrame:
    """The rows of published ``table`` with the run's ``ids`` (``waveform_id`` and ``columns``),
    and ``counted``: the row stays beside the run's output. A window run replaces the rows inside
    its window, so only those outside it count; an incremental run counts every row."""
    rows = id_rows(table, ids, ["waveform_id", *columns, "topic", "partition", "first_offset"])
    if not plan.is_window:
        return rows.assign(counted=True)
    return rows.assign(counted=~inside_window(rows, plan.topic, plan.window_offsets(), "first_offset"))


#: The columns of the readers' digests that choose a waveform's route.
_ROUTED_BY = ["waveform_id", "checksum", "n_chunks", "partition", "digest"]


def _digests(files: list[str]) -> pa.Table | None:
    """The waveforms the run's readers hashed in order as they staged them (``DIGEST_SCHEMA``;
    ``files``: their staged digests). Kept in Arrow: a start time may be any year Spark allows,
    beyond pandas' nanoseconds."""
    return pa.concat_tables([storage.read_parquet(f) for f in files]) if files else None


def _verify_assembled(
    spark: SparkSession, settings, store: RunStore, plan: RunPlan, routed: pd.DataFrame, digests, chunk_paths
) -> pa.Table | None:
    """The manifest: one row per new waveform whose payload matches its checksum, all its output
    columns but the payload (None: no new waveform). Those its reader verified as it read them
    come from the readers' digests. The others are assembled by Spark only to be verified: just
    their metadata comes back (``checksum_ok``), no payload is written. Every payload is written
    once, at publish, from the staged chunks (``written_from``); one that fails its checksum is
    not in the manifest (``final_status`` quarantines it)."""
    manifest = []
    assembled = _assembled(spark, settings, store, plan, routed, chunk_paths)
    if assembled is not None:
        rows = assembled.filter(pc.field("checksum_ok")).select(MANIFEST_COLUMNS)
        shuffled = routed.loc[routed["route"] == SHUFFLE, "waveform_id"].tolist()
        from_shuffle = pc.is_in(rows["waveform_id"], value_set=pa.array(shuffled, pa.string()))
        manifest.append(_manifest_rows(rows.filter(from_shuffle), plan.run_id, SHUFFLED))
        manifest.append(_manifest_rows(rows.filter(pc.invert(from_shuffle)), plan.run_id, STAGED))
    ok = routed[(routed["route"] == DIGEST) & (routed["digest_ok"] == True)]  # noqa: E712 (object column)
    if len(ok):  # verified by the readers: one digest row each (``route``)
        rows = digests.filter(pc.is_in(digests["waveform_id"], value_set=pa.array(ok["waveform_id"], pa.string())))
        manifest.append(_manifest_rows(rows, plan.run_id, STAGED))
    if not manifest:
        return None
    table = pa.concat_tables(manifest)
    storage.write_delta(storage.join(store.candidate_dir(plan.run_id), "manifest"), table)
    failpoint("reassemble.after_write")
    return table


def _assembled(spark: SparkSession, settings, store: RunStore, plan: RunPlan, routed: pd.DataFrame, chunk_paths):
    """The waveforms no reader verified, assembled by Spark (out of order in one partition: from
    its staged file; spread over partitions or with duplicate chunks: by a shuffle), collected
    without their payload: one Spark action. None: there are none."""
    parts = []
    local = routed[routed["route"] == LOCAL]
    if len(local):
        files = chunk_files(store, plan)
        batch_bytes = settings.output_batch_bytes
        lists = wanted_lists_dir(store, plan.run_id)
        parts.append(assemble_local(spark, files, local, batch_bytes, lists, scope=plan.run_id, verify_only=True))
    shuffled = routed[routed["route"] == SHUFFLE]
    if len(shuffled):
        wanted = wanted_waveforms(spark, shuffled)
        chunks = spark.read.parquet(*map(storage.for_spark, chunk_paths))
        parts.append(assemble(chunks, wanted, scope=plan.run_id, verify_only=True))
    if not parts:
        return None
    assembled = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    return assembled.drop("payload").toArrow()


def wanted_waveforms(spark: SparkSession, rows: pd.DataFrame) -> DataFrame:
    """The waveforms ``rows`` names (id, checksum, partition; ``gap_s`` where it has it), handed
    to Spark's assembly as a local relation: no table is read for it."""
    if "gap_s" in rows.columns:
        gaps = rows["gap_s"].astype(object).where(rows["gap_s"].notna(), None)  # null, not NaN
        return spark.createDataFrame(
            rows[["waveform_id", "checksum", "partition"]].assign(gap_s=gaps),
            "waveform_id string, checksum string, partition int, gap_s double",
        )
    return spark.createDataFrame(
        rows[["waveform_id", "checksum", "partition"]], "waveform_id string, checksum string, partition int"
    )


MANIFEST_SCHEMA = pa.schema(
    [ARROW_OUTPUT_SCHEMA.field(name) for name in MANIFEST_COLUMNS]
    + [pa.field("run_id", pa.string()), pa.field("written_from", pa.string())]
)


def read_manifest(candidates: str) -> pd.DataFrame:
    """The run's manifest (``_verify_assembled`` wrote it), read by delta-rs: no Spark job
    (``manifest_frame``). Start times stay Python datetimes: pandas' nanosecond timestamps end in 1677 and 2262,
    Spark's in years 1 and 9999, and a producer may send any start time in between (the suite
    says if it is plausible)."""
    path = storage.join(candidates, "manifest")
    exists = delta_version(path) is not None
    return manifest_frame(storage.delta_table(path).to_pyarrow_table() if exists else None)


def manifest_frame(rows: pa.Table | None) -> pd.DataFrame:
    """The manifest's rows (None: none) as pandas, start times as Python datetimes."""
    rows = MANIFEST_SCHEMA.empty_table() if rows is None else rows
    return rows.to_pandas(timestamp_as_object=True, date_as_object=True)


def _manifest_rows(rows: pa.Table, run_id: str, written_from: str) -> pa.Table:
    """``rows`` (the manifest's columns) as manifest rows of ``run_id``, ``written_from``."""
    rows = rows.select(MANIFEST_COLUMNS).append_column("run_id", pa.array([run_id] * rows.num_rows, pa.string()))
    rows = rows.append_column("written_from", pa.array([written_from] * rows.num_rows, pa.string()))
    return rows.cast(MANIFEST_SCHEMA)


#: The dead-letter table's columns: the staged dead letters and the run that published them.
DEAD_LETTER_ROWS = DEAD_LETTER_SCHEMA.append(pa.field("run_id", pa.string()))


def _stage_dead_letters(store: RunStore, plan: RunPlan, path: str) -> tuple[dict, dict]:
    """The run's dead letters into its candidate table ``path``; per partition (rows, value
    bytes) of them, and of those a window run leaves to the next window (past its end)."""
    files = store.staged_files(plan.run_id, "dead_letter")
    tables = [t for t in (storage.read_parquet(f) for f in files) if t.num_rows]
    if not tables:
        return {}, {}
    dead = pa.concat_tables(tables)
    dead = dead.append_column(DEAD_LETTER_ROWS.field("run_id"), pa.array([plan.run_id] * dead.num_rows, pa.string()))
    other: dict[int, tuple[int, int]] = {}
    if plan.is_window:
        frame = dead.select(["topic", "partition", "offset"]).to_pandas()
        mine = inside_window(frame, plan.topic, plan.window_offsets(), "offset").to_numpy()
        other = _count_by_partition(dead.filter(pa.array(~mine)))
        dead = dead.filter(pa.array(mine))
    counts = _count_by_partition(dead)
    if dead.num_rows:
        storage.write_delta(path, dead)
    return counts, other


def window_rows(
    plan: RunPlan, status: pd.DataFrame, manifest: pa.Table | None, quarantine: pa.Table | None
) -> WindowRows:
    """What a window run's publish replaces, beyond the rows whose first offset is in the window:

    ``keep``: waveforms the run read but does not own (their first chunk is another window's) or
    could not complete (chunks past what it read): their rows stay, whatever their first offset.
    ``extra`` (per table): waveforms the run owns whose row's first offset is outside the window
    (chunks spread over partitions, or out of order): their rows are replaced too. Both are small:
    waveforms at the window's edges."""
    keep = status.loc[status["status"].isin([OTHER_WINDOW, PENDING]), "waveform_id"]
    extra = {}
    for name, rows in (("waveforms", manifest), ("quarantine", quarantine)):
        if rows is None:
            extra[name] = []
            continue
        frame = rows.select(["waveform_id", "topic", "partition", "first_offset"]).to_pandas()
        inside = inside_window(frame, plan.topic, plan.window_offsets(), "first_offset")
        extra[name] = sorted(set(frame.loc[~inside, "waveform_id"]))
    return WindowRows(keep=sorted(keep), extra=extra)


def _count_by_partition(rows: pa.Table) -> dict[int, tuple[int, int]]:
    """Per partition: (rows, value bytes) of staged dead-letter rows."""
    if not rows.num_rows:
        return {}
    frame = pd.DataFrame(
        {
            "partition": rows.column("partition").to_numpy(),
            "bytes": pc.binary_length(rows.column("value")).to_numpy(False),
        }
    )
    g = frame.groupby("partition")
    return {int(p): (int(n), int(b)) for p, n, b in zip(g.size().index, g.size(), g["bytes"].sum(), strict=True)}


def summarize(
    plan: RunPlan, rows, waveforms, dead_counts: dict, timings: dict, other_dead: dict | None = None
) -> Reassembled:
    """Collected aggregates -> per-partition accounting and safe offsets.
    ``other_dead``: per partition, dead letters of a window run that are the next window's."""
    partitions = {}
    for r in plan.ranges:
        part = partitions[r.partition] = PartitionAccount(safe_offset=r.end)
        part.dead_letter, part.dead_letter_bytes = dead_counts.get(r.partition, (0, 0))
        part.other_window, part.other_window_bytes = (other_dead or {}).get(r.partition, (0, 0))
    for row in rows:
        part = partitions[row["partition"]]
        status, n, nbytes = row["status"], row["records"], row["bytes"] or 0
        if status == OUTPUT:
            part.output += n
            part.output_bytes += nbytes
            if row["already_written"]:
                part.output_already_written += n
        elif status == PENDING:
            part.pending += n
            part.pending_bytes += nbytes
            part.safe_offset = min(part.safe_offset, row["min_offset"])
        elif status == OTHER_WINDOW:
            part.other_window += n
            part.other_window_bytes += nbytes
            part.other_window_chunks += n
        elif status == QUARANTINED:
            part.quarantined += n
            part.quarantined_bytes += nbytes
            part.quarantine_reasons[row["reason"]] = part.quarantine_reasons.get(row["reason"], 0) + n
        else:
            raise RuntimeError(f"chunk rows of partition {row['partition']} have no status: {row}")
    counts: dict[str, int] = {}
    for w in waveforms:
        key = (
            w["status"]
            if w["status"] != OUTPUT
            else ("output_already_written" if w["already_written"] else "output_new")
        )
        if w["status"] == QUARANTINED:
            key = f"quarantined:{w['reason']}"
        counts[key] = counts.get(key, 0) + w["count"]
    return Reassembled(
        run_id=plan.run_id,
        finished_at=utc_now(),
        partitions=partitions,
        waveforms=counts,
        timings={k: round(v, 3) for k, v in timings.items()},
    )
