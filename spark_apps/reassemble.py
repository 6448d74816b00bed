"""Reassembly: one run's staged chunks in, whole checked waveforms out.

Transformations are pure ``DataFrame -> DataFrame`` functions; ``main()`` only parses arguments
and does I/O. Guarantees:

* a waveform is written once: ids already in the output table are never candidates again, so a
  retried run, a re-read after a rewind, or pending chunks read a second time add no rows;
* an id names one content: chunks of an id that is in the output with the same ``wp-checksum``
  are a re-delivery (counted ``output_already_written``), chunks with another checksum are another
  content under a reused id, quarantined as ``id_conflict`` with both checksums, never dropped;
* one pass over the bytes: a waveform whose chunks one reader staged in order was hashed by that
  reader as it staged them (``consumers/staging.py``); it is verified from that digest and its
  row made from the chunks' metadata alone (the ``manifest``), so no payload is read here. Only
  the other waveforms (out of order, repeated, spread over partitions) are assembled and verified
  now, into the candidate waveform table;
* nothing is published here: the manifest, those candidate waveforms, quarantine and dead-letter
  rows go to the run's candidate tables (``spark_apps/tables.py``), which the validate step
  checks; publishing then writes each waveform's bytes once, into the output table;
* every staged record ends in one place: an output waveform, pending (incomplete, re-read next
  run from the partition's safe offset), quarantine (with a reason) or dead letter (with a reason).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import RunPlan, utc_now
from wavepipe.contracts.protocol import checksum, output_facts
from wavepipe.contracts.runfiles import RunStore, Step, staged_paths
from wavepipe.contracts.steps import PartitionAccount, ReadStats, Reassembled, WindowRows
from wavepipe.faults import armed, failpoint
from wavepipe.spark import phase
from wavepipe.spark_apps.app import load_run, output_lock
from wavepipe.spark_apps.tables import (
    delta_checksums,
    delta_version,
    read_delta,
    staged_ids,
    window_predicate,
    write_candidate,
)

log = logging.getLogger("wavepipe.reassemble")

PENDING = "pending"
CANDIDATE = "candidate"
QUARANTINED = "quarantined"
OUTPUT = "output"
#: In a time-window run: a waveform whose first chunk is outside the window (another window's).
OTHER_WINDOW = "other_window"

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("waveform_id", T.StringType(), False),
        T.StructField("source", T.StringType(), False),
        T.StructField("start_time", T.TimestampType(), False),
        T.StructField("date", T.DateType(), False),
        T.StructField("dtype", T.StringType(), False),
        T.StructField("channels", T.IntegerType(), False),
        T.StructField("sample_rate", T.DoubleType(), False),
        T.StructField("n_samples", T.LongType(), False),
        T.StructField("duration_s", T.DoubleType(), False),
        T.StructField("size_bytes", T.LongType(), False),
        T.StructField("n_chunks", T.IntegerType(), False),
        T.StructField("checksum", T.StringType(), False),
        T.StructField("payload", T.BinaryType(), True),
        T.StructField("topic", T.StringType(), False),
        T.StructField("partition", T.IntegerType(), False),
        T.StructField("first_offset", T.LongType(), False),
        T.StructField("last_offset", T.LongType(), False),
        T.StructField("checksum_ok", T.BooleanType(), False),
    ]
)
META_COLUMNS = [
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "waveform_id",
    "seq",
    "chunk_count",
    "total_size",
    "checksum",
    "dtype",
    "channels",
    "sample_rate",
    "start_ns",
    "source",
    "chunk_len",
]


# --- pure transformations ------------------------------------------------------------------------


def classify(
    meta: DataFrame,
    *,
    max_waveform_bytes: int = 0,
    ends: dict[int, int] | None = None,
    newest_ms: dict[int, int] | None = None,
    incomplete_after_offsets: int = 0,
    incomplete_after_ms: int = 0,
    window: dict[int, tuple[int, int]] | None = None,
) -> DataFrame:
    """Per waveform, from chunk metadata only (no payload is read): its status and reason.

    ``candidate``: every chunk present, chunks agree, sizes add up (checksum still to verify);
    ``pending``: chunks missing; ``quarantined``: chunks disagree (``chunk_count_mismatch``,
    ``metadata_mismatch``), sizes do not add up (``size_mismatch``) or the waveform is larger
    than ``max_waveform_bytes`` by its header or its chunks (``too_large``, at any completeness).
    Duplicate chunks (same waveform and sequence number) count once: the lowest offset wins.
    ``checksum`` is the chunks' ``wp-checksum`` (the smallest, where they disagree).

    ``expired`` marks a pending waveform no chunk of which arrived in the last
    ``incomplete_after_offsets`` offsets (before ``ends[partition]``) or ``incomplete_after_ms``
    of record time (before ``newest_ms[partition]``) of its partition: it is no longer expected
    to complete (``final_status`` quarantines it as ``incomplete`` unless it is a leftover).

    ``window`` (a time-window run: per partition ``[from, to)`` offsets): a waveform whose first
    chunk (``seq`` 0) is not among those offsets, or not read at all, is ``other_window``: another
    window's, set aside whatever its state.
    """
    first_copy = Window.partitionBy("waveform_id", "seq").orderBy("partition", "offset")
    ranked = meta.withColumn("copy_rank", F.row_number().over(first_copy))
    unique = F.col("copy_rank") == 1
    # "all chunks agree" as min == max (cheaper than distinct counts: no Expand, one aggregate)
    facts = F.struct("total_size", "checksum", "dtype", "channels", "sample_rate", "start_ns", "source")
    per = ranked.groupBy("waveform_id").agg(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.when(unique, 1).otherwise(0)).alias("distinct_chunks"),
        (F.min("chunk_count") != F.max("chunk_count")).alias("counts_differ"),
        F.max("chunk_count").alias("chunk_count"),
        (F.min(facts) != F.max(facts)).alias("facts_differ"),
        F.sum(F.when(unique, F.col("chunk_len")).otherwise(0)).alias("unique_bytes"),
        F.max("total_size").alias("total_size"),
        F.min("partition").alias("partition"),
        (F.min("partition") == F.max("partition")).alias("one_partition"),
        F.min(per_partition(ends) - F.col("offset")).alias("offsets_since"),
        F.min(per_partition(newest_ms) - F.col("timestamp_ms")).alias("ms_since"),
        F.min(F.when(F.col("seq") == 0, F.struct("partition", "offset"))).alias("seq0"),
        F.min("checksum").alias("checksum"),
        F.max("checksum").alias("checksum_max"),
    )
    outside = F.lit(False)
    if window is not None:
        seq0_partition, seq0_offset = F.col("seq0.partition"), F.col("seq0.offset")
        starts = per_partition({p: a for p, (a, _) in window.items()}, seq0_partition)
        ends_ = per_partition({p: b for p, (_, b) in window.items()}, seq0_partition)
        outside = ~F.coalesce((seq0_offset >= starts) & (seq0_offset < ends_), F.lit(False))
    too_large = F.lit(False)
    if max_waveform_bytes:
        too_large = (F.col("total_size") > max_waveform_bytes) | (F.col("unique_bytes") > max_waveform_bytes)
    missing = F.col("distinct_chunks") < F.col("chunk_count")
    stalled = F.lit(False)
    if incomplete_after_offsets:
        stalled = stalled | (F.col("offsets_since") > incomplete_after_offsets)
    if incomplete_after_ms:
        stalled = stalled | (F.col("ms_since") > incomplete_after_ms)
    # one id, two contents in this run (a reused id, or damaged headers): say so, with both checksums
    two_checksums = F.format_string(
        "; its chunks carry wp-checksum %s and %s (an id used for two contents in one run, or damaged chunks)",
        "checksum",
        "checksum_max",
    )
    disagree = F.when(F.col("checksum") != F.col("checksum_max"), two_checksums).otherwise(F.lit(""))
    return per.select(
        "waveform_id",
        "records",
        "distinct_chunks",
        "chunk_count",
        "total_size",
        "unique_bytes",
        "partition",
        "one_partition",
        "checksum",
        F.when(outside, F.lit(OTHER_WINDOW))
        .when(F.col("counts_differ"), F.lit(QUARANTINED))
        .when(F.col("facts_differ"), F.lit(QUARANTINED))
        .when(too_large, F.lit(QUARANTINED))
        .when(missing, F.lit(PENDING))
        .when(F.col("unique_bytes") != F.col("total_size"), F.lit(QUARANTINED))
        .otherwise(F.lit(CANDIDATE))
        .alias("status"),
        F.when(outside, F.lit(None))
        .when(F.col("counts_differ"), F.lit("chunk_count_mismatch"))
        .when(F.col("facts_differ"), F.lit("metadata_mismatch"))
        .when(too_large, F.lit("too_large"))
        .when(missing, F.lit(None))
        .when(F.col("unique_bytes") != F.col("total_size"), F.lit("size_mismatch"))
        .otherwise(F.lit(None))
        .cast("string")
        .alias("reason"),
        F.when(outside, F.lit("its first chunk is outside the window"))
        .when(F.col("counts_differ"), F.concat(F.lit("chunks disagree on wp-count"), disagree))
        .when(
            F.col("facts_differ"),
            F.concat(F.lit("chunks disagree on wp-size, wp-checksum or the waveform's metadata"), disagree),
        )
        .when(
            too_large,
            F.format_string(
                "%d bytes by header, %d in chunks; the maximum is %d",
                "total_size",
                "unique_bytes",
                F.lit(max_waveform_bytes),
            ),
        )
        .when(
            missing,
            F.format_string(
                "%d of %d chunks; none in the last %d offsets (%d s) of its partition",
                "distinct_chunks",
                "chunk_count",
                "offsets_since",
                (F.col("ms_since") / 1000).cast("long"),
            ),
        )
        .when(
            F.col("unique_bytes") != F.col("total_size"),
            F.format_string("chunks hold %d bytes, wp-size says %d", "unique_bytes", "total_size"),
        )
        .otherwise(F.lit(None))
        .alias("detail"),
        (~outside & missing & ~too_large & stalled).alias("expired"),
    )


def per_partition(values: dict[int, int] | None, partition=None):
    """A column: ``values[partition]`` of each row (null where not given); ``partition`` is the
    column holding the partition (default: ``partition``)."""
    if not values:
        return F.lit(None).cast("long")
    pairs = [x for p, v in sorted(values.items()) for x in (F.lit(int(p)), F.lit(int(v)).cast("long"))]
    return F.element_at(F.create_map(*pairs), F.col("partition") if partition is None else partition)


ARROW_OUTPUT_SCHEMA = to_arrow_schema(OUTPUT_SCHEMA, timezone="UTC")
#: A waveform is one binary cell of one row: Spark and Arrow cap those near 2 GiB; keep margin.
MAX_WAVEFORM_BYTES_LIMIT = 1024 * 1024 * 1024
_FACTS = ("waveform_id", "source", "dtype", "channels", "sample_rate", "start_ns", "checksum", "topic")


def output_row(facts: dict, payload: bytes, n_chunks: int, partition: int, first_offset: int, last_offset: int) -> dict:
    """One output row (a dict in OUTPUT_SCHEMA's order) for a joined payload; checksum verified,
    payload dropped (None) when it does not match."""
    ok = checksum(payload) == facts["checksum"]
    row = output_facts(facts, len(payload), n_chunks, partition, first_offset, last_offset)
    return {**row, "payload": payload if ok else None, "checksum_ok": ok}


def _batch(rows: list[dict]) -> pa.RecordBatch:
    columns = {name: [r[name] for r in rows] for name in ARROW_OUTPUT_SCHEMA.names}
    arrays = []
    for f in ARROW_OUTPUT_SCHEMA:
        values = columns[f.name]
        if pa.types.is_timestamp(f.type):
            arrays.append(pa.array(values, pa.int64()).cast(f.type))
        elif pa.types.is_date32(f.type):
            arrays.append(pa.array(values, pa.int32()).cast(f.type))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_OUTPUT_SCHEMA)


def assemble_arrow(table: pa.Table, failpoints: str | None = None, scope: str = "") -> pa.Table:
    """One waveform's chunk rows -> one output row: chunks in sequence order (first copy of each),
    payload joined, checksum verified. Runs in the Python workers; holds one waveform at a time."""
    order = sorted(
        range(table.num_rows),
        key=lambda i: (table["seq"][i].as_py(), table["partition"][i].as_py(), table["offset"][i].as_py()),
    )
    seqs = table["seq"].to_pylist()
    payloads = table["payload"]
    picked, seen = [], set()
    for i in order:
        if seqs[i] not in seen:
            seen.add(seqs[i])
            picked.append(i)
    payload = b"".join(payloads[i].as_py() for i in picked)
    facts = {name: table[name][picked[0]].as_py() for name in _FACTS}
    offsets = table["offset"].to_pylist()
    partitions = table["partition"].to_pylist()
    first_chunk = min(range(table.num_rows), key=lambda i: (partitions[i], offsets[i]))
    row = output_row(facts, payload, len(picked), partitions[first_chunk], offsets[first_chunk], max(offsets))
    failpoint("assemble.batch", failpoints, scope)
    return pa.Table.from_batches([_batch([row])])


#: Marks the error of a staged chunk file whose bytes changed after the reader hashed them.
STAGED_CHANGED = "wavepipe: staged chunks changed on disk"


def assemble_file(
    path: str,
    wanted: dict[str, str | None] | set[str],
    strict: bool = False,
    batch_bytes: int = Settings.model_fields["output_batch_bytes"].default,
) -> Iterator[pa.RecordBatch]:
    """Whole waveforms from one staged file, streamed: the ``wanted`` ids (id -> ``wp-checksum``,
    or a set: any checksum) must have every chunk carrying that checksum, once, in this file (one
    Kafka partition); chunks of the same id with another checksum (another content under a reused
    id) are not used. Holds only the waveforms whose chunks are still arriving (with keyed
    producers, one or two) and one batch of output (``batch_bytes`` of payload, or one waveform);
    stops reading once every wanted one is out.

    ``strict`` (waveforms the reader verified as it staged them): a waveform that no longer hashes
    to its checksum, or is not in the file, raises an error marked ``STAGED_CHANGED`` (the file
    changed since it was read) instead of coming out with ``checksum_ok`` false."""
    wanted = wanted if isinstance(wanted, dict) else dict.fromkeys(wanted)
    open_: dict[str, dict] = {}
    rows: list[dict] = []
    buffered = done = 0
    staged = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering would read the whole file ahead
    for batch in _row_group_batches(staged):
        if done == len(wanted):
            break
        ids = batch.column("waveform_id").to_pylist()
        if wanted.keys().isdisjoint(ids):
            continue
        checksums = batch.column("checksum").to_pylist()
        seqs = batch.column("seq").to_pylist()
        counts = batch.column("chunk_count").to_pylist()
        offsets = batch.column("offset").to_pylist()
        payloads = batch.column("payload")
        for i, wid in enumerate(ids):
            if wid not in wanted or wanted[wid] not in (None, checksums[i]):
                continue
            w = open_.get(wid)
            if w is None:
                facts = {name: batch.column(name)[i].as_py() for name in _FACTS}
                w = open_[wid] = {
                    "facts": facts,
                    "parts": {},
                    "partition": batch.column("partition")[i].as_py(),
                    "first": offsets[i],
                }
            w["parts"][seqs[i]] = payloads[i].as_py()
            if len(w["parts"]) == counts[i]:
                del open_[wid]
                payload = b"".join(w["parts"][k] for k in sorted(w["parts"]))
                row = output_row(w["facts"], payload, counts[i], w["partition"], w["first"], offsets[i])
                if strict and not row["checksum_ok"]:
                    raise RuntimeError(
                        f"{STAGED_CHANGED}: {path}: the chunks of {wid} no longer hash to "
                        f"{w['facts']['checksum']}, as they did when they were read"
                    )
                rows.append(row)
                done += 1
                buffered += len(payload)
                if buffered >= batch_bytes:
                    yield _batch(rows)
                    rows, buffered = [], 0
    if open_:  # classify said these were complete in this file: the file changed under us
        raise RuntimeError(
            f"{STAGED_CHANGED if strict else 'staged chunks changed'}: {path}: {len(open_)} waveforms "
            f"expected complete are not, e.g. {next(iter(open_))}"
        )
    if strict and done < len(wanted):
        raise RuntimeError(
            f"{STAGED_CHANGED}: {path}: {len(wanted) - done} waveforms it held when it was read are not in it"
        )
    if rows:
        yield _batch(rows)


def _row_group_batches(staged: pq.ParquetFile, rows: int = 256) -> Iterator[pa.RecordBatch]:
    """One row group in memory at a time (the reader wrote them ``staging_flush_bytes`` big)."""
    for index in range(staged.num_row_groups):
        yield from staged.read_row_group(index).to_batches(max_chunksize=rows)


def _assemble_tasks(
    batches: Iterator[pa.RecordBatch], failpoints: str | None, scope: str, strict: bool, batch_bytes: int
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for path, ids in zip(batch.column("path").to_pylist(), batch.column("ids").to_pylist(), strict=True):
            for out in assemble_file(path, {w["waveform_id"]: w["checksum"] for w in ids}, strict, batch_bytes):
                yield out
                failpoint("assemble.batch", failpoints, scope)


def assemble_local(
    spark: SparkSession,
    files: dict[int, str],
    candidates: DataFrame,
    batch_bytes: int,
    scope: str = "",
    strict: bool = False,
) -> DataFrame:
    """Whole waveforms for candidates whose chunks are all in one partition's staged file, each
    file streamed by one task: no shuffle of payloads (the common case with keyed producers).
    ``batch_bytes``: the setting ``output_batch_bytes``; ``scope``: what the run's failpoints count
    their hits in (the run id); ``strict``: see ``assemble_file``."""
    paths = spark.createDataFrame(sorted(files.items()), "partition int, path string")
    tasks = (
        candidates.groupBy("partition")
        .agg(F.collect_list(F.struct("waveform_id", "checksum")).alias("ids"))
        .join(paths, "partition")
        .select("path", "ids")
    )
    failpoints = armed()  # the workers (a Spark engine's) do not have this process's environment

    def tasks_of_this_run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _assemble_tasks(batches, failpoints, scope, strict, batch_bytes)

    return tasks.repartition(max(1, len(files))).mapInArrow(tasks_of_this_run, OUTPUT_SCHEMA)


def chunk_files(store: RunStore, plan: RunPlan) -> dict[int, str]:
    """Per partition read, the run's staged chunk file (where its reader staged it)."""
    return {r.partition: str(staged_paths(store, plan.run_id, r)[0]) for r in plan.ranges if r.size}


#: Routes of a new candidate waveform (``route``): how its bytes are verified and written.
DIGEST, LOCAL, SHUFFLE = "digest", "local", "shuffle"
#: The manifest: one row per waveform the run publishes, all its output columns but the payload,
#: and ``written_from``: ``staged`` (its bytes are written once, at publish, straight from the
#: staged chunks) or ``candidate`` (from the run's candidate waveform table). Every row's payload
#: was verified against its checksum before the row was made (by its reader, or by the assembly).
MANIFEST_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields if f.name not in ("payload", "checksum_ok")]


def route(candidates: DataFrame, digests: DataFrame | None) -> DataFrame:
    """The candidates with ``route`` and ``digest_ok``. ``digest``: its chunks are all in one
    staged file, each once, and the reader hashed them in order as it staged them (one row of
    ``digests`` for the id, with the same checksum, chunk count and partition): verified from
    that hash (``digest_ok``), no payload read now. ``local``: one staged file, not in order:
    assembled and verified from that file. ``shuffle``: chunks over partitions or repeated."""
    simple = F.col("one_partition") & (F.col("records") == F.col("distinct_chunks"))
    if digests is None:
        return candidates.select(
            "*",
            F.when(simple, F.lit(LOCAL)).otherwise(F.lit(SHUFFLE)).alias("route"),
            F.lit(None).cast("boolean").alias("digest_ok"),
        )
    one = (
        digests.groupBy("waveform_id")
        .agg(F.count(F.lit(1)).alias("n"), F.first(F.struct("checksum", "n_chunks", "partition", "digest")).alias("d"))
        .where("n = 1")
        .select("waveform_id", "d")
    )
    has = (
        simple
        & (F.col("d.checksum") == F.col("checksum"))
        & (F.col("d.n_chunks") == F.col("chunk_count"))
        & (F.col("d.partition") == F.col("partition"))
    )
    has = F.coalesce(has, F.lit(False))
    return candidates.join(one, "waveform_id", "left").select(
        *candidates.columns,
        F.when(has, F.lit(DIGEST)).when(simple, F.lit(LOCAL)).otherwise(F.lit(SHUFFLE)).alias("route"),
        F.when(has, F.col("d.digest") == F.col("checksum")).alias("digest_ok"),
    )


def assemble(chunks: DataFrame, candidates: DataFrame, scope: str = "") -> DataFrame:
    """Whole waveforms for the candidate ids (one row each; payload null where the checksum fails),
    grouped by a shuffle: for waveforms spread over partitions or with duplicate chunks. Where the
    candidates have a ``checksum``, only chunks carrying it are used (not another content's)."""
    keys = ["waveform_id", "checksum"] if "checksum" in candidates.columns else ["waveform_id"]
    wanted = chunks.join(candidates.select(*keys), keys, "left_semi")
    failpoints = armed()

    def one_waveform(table: pa.Table) -> pa.Table:
        return assemble_arrow(table, failpoints, scope)

    return wanted.groupBy("waveform_id").applyInArrow(one_waveform, OUTPUT_SCHEMA)


def final_status(
    classified: DataFrame, before_ids: DataFrame, after_ids: DataFrame, quarantined_ids: DataFrame
) -> DataFrame:
    """Per waveform, where it ended: ``output`` (written now or already before), ``pending``, or
    ``quarantined`` with a reason.

    A waveform quarantined earlier (and not in the output) stays quarantined with its reason,
    whatever chunks arrive later, also a complete set. A candidate absent from the output after
    the write failed its checksum (the write appends every verified candidate that was neither
    written nor quarantined before). An incomplete set of chunks of a waveform that is already in
    the output is a leftover of a run that started inside it: it is accounted with that waveform
    and does not hold the commit back. Any other incomplete waveform stays pending until
    ``expired``, then is quarantined as ``incomplete``.
    """
    before = before_ids.select("waveform_id", F.lit(True).alias("was_there"))
    after = after_ids.select("waveform_id", F.lit(True).alias("is_there"))
    quarantined = quarantined_ids.groupBy("waveform_id").agg(F.first("reason").alias("q_reason"))
    joined = (
        classified.join(before, "waveform_id", "left")
        .join(after, "waveform_id", "left")
        .join(quarantined, "waveform_id", "left")
    )
    is_candidate = F.col("status") == CANDIDATE
    stale = F.col("status") == PENDING
    earlier = (is_candidate | stale) & F.col("was_there").isNull() & F.col("q_reason").isNotNull()
    return joined.select(
        "waveform_id",
        F.when(earlier, F.lit(QUARANTINED))
        .when(is_candidate & F.col("is_there").isNotNull(), F.lit(OUTPUT))
        .when(is_candidate, F.lit(QUARANTINED))
        .when(stale & F.col("was_there").isNotNull(), F.lit(OUTPUT))
        .when(stale & F.col("expired"), F.lit(QUARANTINED))
        .otherwise(F.col("status"))
        .alias("status"),
        F.when(earlier, F.col("q_reason"))
        .when(is_candidate & F.col("is_there").isNull(), F.lit("checksum_mismatch"))
        .when(stale & F.col("was_there").isNotNull(), F.lit(None))
        .when(stale & F.col("expired"), F.lit("incomplete"))
        .otherwise(F.col("reason"))
        .alias("reason"),
        F.when(earlier, F.lit("chunks of a waveform quarantined earlier"))
        .when(is_candidate & F.col("is_there").isNull(), F.lit("the joined chunks' sha256 differs from wp-checksum"))
        .otherwise(F.col("detail"))
        .alias("detail"),
        F.coalesce(F.col("was_there"), F.lit(False)).alias("already_written"),
    )


def split_conflicts(meta: DataFrame, output: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(the chunks of the waveforms as the output knows them, the conflicting chunks).

    ``output``: ``waveform_id`` and ``checksum`` of the output table's rows with the run's ids. A
    chunk whose id is in the output under another ``wp-checksum`` is another content under a
    reused id: a conflict (with ``output_checksum``), never a chunk of the waveform already
    written. Chunks with the output's checksum (a re-delivery) and chunks of ids not in the output
    are the waveforms'."""
    owners = output.select("waveform_id", F.col("checksum").alias("output_checksum")).dropDuplicates(["waveform_id"])
    marked = meta.join(owners, "waveform_id", "left")
    conflict = F.col("output_checksum").isNotNull() & (F.col("checksum") != F.col("output_checksum"))
    return marked.where(~conflict).drop("output_checksum"), marked.where(conflict)


def conflict_status(conflicts: DataFrame, window: dict[int, tuple[int, int]] | None = None) -> DataFrame:
    """Per waveform id, where its conflicting chunks (``split_conflicts``) end: quarantined with the
    reason ``id_conflict``, the output's and their own checksums in the detail and in
    ``output_checksum``; in a time-window run, ``other_window`` when their first chunk is another
    window's. Columns as ``final_status``'s, plus ``output_checksum``."""
    placed = classify(conflicts.select(*META_COLUMNS), window=window).select("waveform_id", "status", "checksum")
    owners = conflicts.groupBy("waveform_id").agg(F.first("output_checksum").alias("output_checksum"))
    other = F.col("status") == OTHER_WINDOW
    return placed.join(owners, "waveform_id").select(
        "waveform_id",
        F.when(other, F.lit(OTHER_WINDOW)).otherwise(F.lit(QUARANTINED)).alias("status"),
        F.when(other, F.lit(None)).otherwise(F.lit("id_conflict")).cast("string").alias("reason"),
        F.when(other, F.lit("its first chunk is outside the window"))
        .otherwise(
            F.format_string(
                "wp-id %s is in the output with wp-checksum %s; these chunks carry wp-checksum %s "
                "(another content under the same id)",
                "waveform_id",
                "output_checksum",
                "checksum",
            )
        )
        .alias("detail"),
        F.lit(False).alias("already_written"),
        "output_checksum",
    )


def quarantine_rows(meta: DataFrame, status: DataFrame, run_id: str) -> DataFrame:
    """One row per quarantined waveform and reason: what the quarantine table holds. ``checksum``:
    the chunks' ``wp-checksum`` (the smallest where they disagree); ``output_checksum``: for an
    ``id_conflict``, the checksum of the output's waveform with that id."""
    if "output_checksum" not in status.columns:
        status = status.withColumn("output_checksum", F.lit(None).cast("string"))
    return (
        meta.join(status.where(F.col("status") == QUARANTINED), "waveform_id")
        .groupBy("waveform_id", "reason")
        .agg(
            F.first("detail").alias("detail"),
            F.first("topic").alias("topic"),
            F.min(F.struct("partition", "offset")).alias("first"),
            F.max("offset").alias("last_offset"),
            F.count(F.lit(1)).alias("records"),
            F.max("chunk_count").alias("chunk_count"),
            F.max("total_size").alias("total_size"),
            F.first("source").alias("source"),
            F.min("checksum").alias("checksum"),
            F.first("output_checksum").alias("output_checksum"),
        )
        .select(
            "waveform_id",
            "reason",
            "detail",
            "topic",
            F.col("first.partition").alias("partition"),
            F.col("first.offset").alias("first_offset"),
            "last_offset",
            "records",
            "chunk_count",
            "total_size",
            "source",
            "checksum",
            "output_checksum",
            F.lit(run_id).alias("run_id"),
            F.current_timestamp().alias("quarantined_at"),
        )
    )


def accounting(meta: DataFrame, status: DataFrame) -> DataFrame:
    """Per partition and final status: records, payload bytes, and first offset."""
    return (
        meta.join(status, "waveform_id", "left")
        .groupBy("partition", "status", "reason", "already_written")
        .agg(F.count(F.lit(1)).alias("records"), F.sum("chunk_len").alias("bytes"), F.min("offset").alias("min_offset"))
    )


# --- I/O -------------------------------------------------------------------------------------------


def reassemble_run(spark: SparkSession, settings, plan: RunPlan) -> Reassembled:
    """Reassemble run ``plan``'s staged chunks into the tables; return the accounting."""
    store = RunStore(settings)
    staging = store.staging_dir(plan.run_id)
    chunk_paths = sorted((staging / "chunks").glob("*.parquet"))
    dead_files = sorted((staging / "dead_letter").glob("*.parquet"))
    staged = {p.stem for p in chunk_paths}
    missing = [r.name for r in plan.ranges if r.size and r.name not in staged]
    if missing:
        raise RuntimeError(f"run {plan.run_id}: ranges not staged yet: {', '.join(missing)}; run their consume step")
    # the candidates are made again from the staged chunks: an earlier result, and any validation
    # of it, is void until this one is saved (after every candidate table is written)
    store.clear_step(plan.run_id, Step.REASSEMBLE)
    store.clear_step(plan.run_id, Step.VALIDATE)
    shutil.rmtree(store.candidate_dir(plan.run_id), ignore_errors=True)
    timings: dict[str, float] = {}
    t = time.monotonic()
    chunks = spark.read.parquet(*map(str, chunk_paths))
    files = chunk_files(store, plan)
    out_path = settings.output_table
    candidates = store.candidate_dir(plan.run_id)
    v0 = delta_version(out_path)
    # a window run recomputes the window's rows: the tables' other rows are what was there before
    outside = (
        None if not plan.is_window else f"NOT ({window_predicate(plan.topic, plan.window_offsets(), 'first_offset')})"
    )
    # the output's ids among the run's, with their checksums (read once): an id there under another
    # checksum is a reused id, a conflict; its chunks are set apart, the rest are the waveforms'
    # the same ids as a list, read from the staged files here: Delta skips the table's files that
    # cannot hold them (a file changed between the two reads only makes an id look new, and
    # validation checks the new ids against the table again, exactly)
    id_list = staged_ids(chunk_paths) if v0 is not None else None
    known = delta_checksums(spark, out_path, v0, chunks, counted=outside, id_list=id_list).persist()
    before = known.where("counted").select("waveform_id")
    meta, conflicts = chunks.select(*META_COLUMNS), None
    if v0 is not None:
        meta, conflicts = split_conflicts(meta, known)
    newest = {}
    for r in plan.ranges:
        read = store.load_result(plan.run_id, Step.consume(r), ReadStats)
        if read is not None and read.max_timestamp_ms is not None:
            newest[r.partition] = read.max_timestamp_ms
    if not 0 < settings.max_waveform_bytes <= MAX_WAVEFORM_BYTES_LIMIT:
        raise ValueError(f"max_waveform_bytes must be in 1..{MAX_WAVEFORM_BYTES_LIMIT} (a waveform is one Spark row)")
    classified = classify(
        meta,
        max_waveform_bytes=settings.max_waveform_bytes,
        ends={r.partition: r.end for r in plan.ranges},
        newest_ms=newest,
        incomplete_after_offsets=settings.incomplete_after_offsets,
        incomplete_after_ms=int(settings.incomplete_after_s * 1000),
        window=plan.window_offsets() if plan.is_window else None,
    ).persist()
    q_version = delta_version(settings.quarantine_table)
    # an id_conflict row is about another content under the id: it does not quarantine this one
    q_before = (
        read_delta(spark, settings.quarantine_table, q_version)
        .where(outside or "true")
        .where(F.col("reason") != "id_conflict")
        .select("waveform_id", "reason")
        if q_version is not None
        else spark.createDataFrame([], "waveform_id string, reason string")
    )
    new_candidates = classified.where(F.col("status") == CANDIDATE)
    if q_version is not None:  # quarantined once, quarantined for good (e.g. late chunks of an incomplete one)
        new_candidates = new_candidates.join(q_before.select("waveform_id"), "waveform_id", "left_anti")
    if v0 is not None:  # kept: counted below, then assembled (the table's ids are read once)
        new_candidates = new_candidates.join(before, "waveform_id", "left_anti")
    # how each new waveform is verified and written (``route``): most from the readers' digests
    digest_files = sorted((staging / "digests").glob("*.parquet"))
    digests = spark.read.parquet(*map(str, digest_files)) if digest_files else None
    routed = route(new_candidates, digests).persist()
    kinds = {(r["route"], r["digest_ok"]): r["count"] for r in routed.groupBy("route", "digest_ok").count().collect()}
    timings["classify_s"] = time.monotonic() - t
    t = time.monotonic()
    after = before
    parts = []  # waveforms not verified while they were read: assembled and verified now
    if kinds.get((LOCAL, None)):
        parts.append(
            assemble_local(
                spark, files, routed.where(F.col("route") == LOCAL), settings.output_batch_bytes, scope=plan.run_id
            )
        )
    if kinds.get((SHUFFLE, None)):
        parts.append(assemble(chunks, routed.where(F.col("route") == SHUFFLE), scope=plan.run_id))
    manifest, written = [], []  # the manifest's rows, and their ids (not read back from it)
    if parts:
        assembled = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        verified = assembled.where("checksum_ok").drop("checksum_ok").withColumn("run_id", F.lit(plan.run_id))
        write_candidate(verified, candidates / "waveforms")
        manifest.append(
            read_delta(spark, candidates / "waveforms").select(
                *MANIFEST_COLUMNS,
                "run_id",
                F.lit("candidate").alias("written_from"),
            )
        )
        written.append(manifest[-1].select("waveform_id"))
    from_digests = kinds.get((DIGEST, True), 0)
    if from_digests:  # verified by the readers: written once, at publish, from the staged chunks
        ids = routed.where((F.col("route") == DIGEST) & F.col("digest_ok")).select("waveform_id")
        manifest.append(
            digests.join(ids, "waveform_id", "left_semi").select(
                *MANIFEST_COLUMNS,
                F.lit(plan.run_id).alias("run_id"),
                F.lit("staged").alias("written_from"),
            )
        )
        written.append(ids)  # one digest row each (``route``): the manifest's ids
    if manifest:  # else: no new rows, no candidate tables
        write_candidate(
            manifest[0] if len(manifest) == 1 else manifest[0].unionByName(manifest[1]), candidates / "manifest"
        )
        failpoint("reassemble.after_write")
        after = before
        for ids in written:
            after = after.unionByName(ids)
    timings["assemble_write_s"] = time.monotonic() - t

    t = time.monotonic()
    status = final_status(classified, before, after, q_before).persist()
    placed = status
    if conflicts is not None:
        conflicted = conflict_status(conflicts, plan.window_offsets() if plan.is_window else None).persist()
        placed = status.unionByName(conflicted.drop("output_checksum"))
    counted = accounting(meta, status)
    if conflicts is not None:
        counted = counted.unionByName(accounting(conflicts.select(*META_COLUMNS), conflicted))
    # waveforms by final status, and records by partition and final status: one Spark job
    by_waveform = placed.groupBy("status", "reason", "already_written").agg(F.count(F.lit(1)).alias("records"))
    rows = (
        counted.withColumn("per_waveform", F.lit(False))
        .unionByName(
            by_waveform.select(
                F.lit(None).cast("int").alias("partition"),
                "status",
                "reason",
                "already_written",
                "records",
                F.lit(None).cast("long").alias("bytes"),
                F.lit(None).cast("long").alias("min_offset"),
                F.lit(True).alias("per_waveform"),
            )
        )
        .collect()
    )
    waveforms = [
        {"status": r["status"], "reason": r["reason"], "already_written": r["already_written"], "count": r["records"]}
        for r in rows
        if r["per_waveform"]
    ]
    rows = [r for r in rows if not r["per_waveform"]]
    if any(w["status"] == QUARANTINED for w in waveforms):
        quarantine = quarantine_rows(meta, status, plan.run_id)
        if conflicts is not None:
            quarantine = quarantine.unionByName(
                quarantine_rows(conflicts.select(*META_COLUMNS), conflicted, plan.run_id)
            )
        write_candidate(quarantine, candidates / "quarantine")
    dead_files = [f for f in dead_files if pq.ParquetFile(f).metadata.num_rows]
    dead_counts: dict[int, tuple[int, int]] = {}
    other_dead: dict[int, tuple[int, int]] = {}
    if dead_files:
        dead = spark.read.parquet(*map(str, dead_files)).withColumn("run_id", F.lit(plan.run_id))
        if plan.is_window:  # dead letters past the window's end are the next window's
            mine = F.expr(window_predicate(plan.topic, plan.window_offsets(), "offset"))
            other_dead = _count_by_partition(dead.where(~mine))
            dead = dead.where(mine)
        dead_counts = _count_by_partition(dead)
        if dead_counts:
            write_candidate(dead, candidates / "dead_letter")
    timings["accounting_s"] = time.monotonic() - t
    classified.unpersist()
    new_candidates.unpersist()
    routed.unpersist()
    known.unpersist()
    if conflicts is not None:
        conflicted.unpersist()
    result = summarize(plan, rows, waveforms, dead_counts, timings, other_dead)
    # what validation must find in the candidate tables (anything else: they are not this result's)
    new = result.waveforms.get("output_new", 0)
    result.candidates = {
        "manifest": new,
        "waveforms": new - from_digests,
        "quarantine": sum(w["count"] for w in waveforms if w["status"] == QUARANTINED),
        "dead_letter": sum(n for n, _ in dead_counts.values()),
    }
    # how the new candidates were verified (the rest failed their checksum: quarantined)
    result.verified = {
        "while_read": from_digests,
        "from_one_staged_file": kinds.get((LOCAL, None), 0),
        "by_a_shuffle": kinds.get((SHUFFLE, None), 0),
    }
    if plan.is_window:
        result.window_rows = window_rows(spark, plan, status, candidates)
    status.unpersist()
    return result


def window_rows(spark: SparkSession, plan: RunPlan, status: DataFrame, candidates: Path) -> WindowRows:
    """What a window run's publish replaces, beyond the rows whose first offset is in the window:

    ``keep``: waveforms the run read but does not own (their first chunk is another window's) or
    could not complete (chunks past what it read): their rows stay, whatever their first offset.
    ``extra`` (per table): waveforms the run owns whose row's first offset is outside the window
    (chunks spread over partitions, or out of order): their rows are replaced too. Both are small:
    waveforms at the window's edges."""
    keep = [
        r["waveform_id"]
        for r in status.where(F.col("status").isin(OTHER_WINDOW, PENDING)).select("waveform_id").collect()
    ]
    inside = window_predicate(plan.topic, plan.window_offsets(), "first_offset")
    extra = {}
    for name, table in (("waveforms", "manifest"), ("quarantine", "quarantine")):
        path = candidates / table
        extra[name] = (
            [
                r["waveform_id"]
                for r in read_delta(spark, path).where(f"NOT ({inside})").select("waveform_id").distinct().collect()
            ]
            if delta_version(path) is not None
            else []
        )
    return WindowRows(keep=sorted(keep), extra=extra)


def _count_by_partition(rows: DataFrame) -> dict[int, tuple[int, int]]:
    """Per partition: (rows, value bytes) of staged dead-letter rows."""
    return {
        r["partition"]: (r["n"], r["bytes"] or 0)
        for r in rows.groupBy("partition")
        .agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("bytes"))
        .collect()
    }


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


def reassemble_and_save(
    spark: SparkSession, settings, store: RunStore, plan: RunPlan, *, validate: bool, session_s: float
) -> Reassembled:
    """Reassemble run ``plan`` and save the result as its ``reassemble`` step; ``validate``: then
    validate and publish in the same session. ``session_s``: what getting the session took."""
    began = time.monotonic()
    with phase("reassemble"):
        result = reassemble_run(spark, settings, plan)
    result.timings["spark_app_s"] = round(time.monotonic() - began, 3)
    result.timings["session_start_s"] = round(session_s, 3)
    store.save_result(plan.run_id, Step.REASSEMBLE, result)
    log.info("run %s reassembled: %s", plan.run_id, result.waveforms)
    if validate:
        from wavepipe.spark_apps.validate import validate_and_publish

        validate_and_publish(spark, settings, plan)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Reassemble one wavepipe run's staged chunks.")
    parser.add_argument("--run-id", required=True)
    parser.add_argument(
        "--validate",
        action="store_true",
        help="then validate and publish in the same Spark session (what `wavepipe run` does)",
    )
    args = parser.parse_args(argv)
    settings, store, plan = load_run(args.run_id, log)
    if plan is None:
        return 2
    with output_lock(settings, store):
        began = time.monotonic()
        if args.validate:
            from wavepipe.spark_apps.validate import import_in_background

            import_in_background()
        spark = SparkSession.builder.appName(f"wavepipe-reassemble-{plan.run_id}").getOrCreate()
        try:
            result = reassemble_and_save(
                spark, settings, store, plan, validate=args.validate, session_s=time.monotonic() - began
            )
        finally:
            began = time.monotonic()
            spark.stop()
        result.timings["session_stop_s"] = round(time.monotonic() - began, 3)
        store.save_result(plan.run_id, Step.REASSEMBLE, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
