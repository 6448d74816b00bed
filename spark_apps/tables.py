"""The Delta tables a run writes: its candidate output (private to the run) and the published tables.

A run's reassembly writes its new waveforms, quarantine and dead-letter rows into candidate tables
under the run's staging folder (``RunStore.candidate_dir``), each replaced whole by one atomic Delta
commit, so a retry of the reassembly starts over. Readers never see them. Only a run whose
candidates passed validation appends them to the published tables (``publish_run``), adding only
keys not there yet, so a retried publish adds nothing twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from wavepipe.contracts.runfiles import read_json_or

#: Candidate table name -> (keys that identify a row, partition columns).
TABLE_KEYS = {
    "quarantine": (["waveform_id", "reason"], None),
    "dead_letter": (["topic", "partition", "offset"], None),
    "waveforms": (["waveform_id"], ["source", "date"]),
}


def delta_version(path: Path) -> int | None:
    """The table's latest committed version, from its log's file names (None: no table yet).

    Every Delta commit is the file ``_delta_log/<version>.json`` (zero-padded), written atomically;
    reading the names costs a directory listing, where asking Delta costs a Spark job (and, the
    first time in a JVM, several seconds of Delta's start-up).
    """
    log_dir = Path(path) / "_delta_log"
    if not log_dir.is_dir():
        return None
    versions = [int(f.name[:-5]) for f in log_dir.iterdir() if f.name.endswith(".json") and f.name[:-5].isdigit()]
    return max(versions) if versions else None


@dataclass
class DeltaLog:
    """A Delta table's latest version as its log tells it, read without Spark.

    ``files``: the live data files, path (relative to the table, URL-encoded) -> (bytes, rows or
    None when the log does not say, e.g. a file with deleted rows); ``last``: operation (WRITE,
    OPTIMIZE, VACUUM END...) -> when it last committed, epoch ms."""

    version: int
    files: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)

    def apply(self, action: dict) -> None:
        if "add" in action:
            add = action["add"]
            stats = add.get("stats") or "{}"
            stats = json.loads(stats) if isinstance(stats, str) else stats
            rows = None if add.get("deletionVector") or "numRecords" not in stats else int(stats["numRecords"])
            self.files[add["path"]] = (int(add.get("size") or 0), rows)
        elif "remove" in action:
            self.files.pop(action["remove"]["path"], None)
        elif "commitInfo" in action and action["commitInfo"].get("operation"):
            info = action["commitInfo"]
            self.last[info["operation"]] = int(info.get("timestamp") or 0)

    @property
    def rows(self) -> int | None:
        counts = [rows for _, rows in self.files.values()]
        return None if any(r is None for r in counts) else sum(counts)


def _commit_versions(log_dir: Path) -> list[int]:
    return sorted(int(f.name[:-5]) for f in log_dir.iterdir() if f.name.endswith(".json") and f.name[:-5].isdigit())


def _checkpoint_actions(log_dir: Path, version: int) -> list[dict] | None:
    """The actions of the table's single-file checkpoint at ``version`` (None: there is none)."""
    path = log_dir / f"{version:020d}.checkpoint.parquet"
    if not path.is_file():
        return None
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path, columns=["add", "remove"]).to_pylist()
    except Exception:  # a checkpoint of another shape (v2, damaged): replay from version 0 or give up
        return None
    return [{kind: row[kind]} for row in rows for kind in ("add", "remove") if row.get(kind)]


def delta_log(path: Path) -> DeltaLog | None:
    """The table's latest version from its log: every commit from version 0 replayed in order, or
    its latest single-file checkpoint and the commits after it; None when neither is complete (no
    table, commits cleaned up past the checkpoint, a multi-part or v2 checkpoint): then ask Spark."""
    log_dir = Path(path) / "_delta_log"
    if not log_dir.is_dir():
        return None
    commits = _commit_versions(log_dir)
    if not commits:
        return None
    start, actions = 0, []
    if commits[0] != 0:
        last = read_json_or(log_dir / "_last_checkpoint", {})
        checkpointed = last.get("version") if isinstance(last, dict) and not last.get("parts") else None
        checkpoint = _checkpoint_actions(log_dir, checkpointed) if isinstance(checkpointed, int) else None
        if checkpoint is None or checkpointed > commits[-1]:
            return None
        start, actions = checkpointed + 1, checkpoint
    wanted = [v for v in commits if v >= start]
    if wanted != list(range(start, start + len(wanted))):
        return None  # a gap: the replay would be partial
    state = DeltaLog(version=commits[-1])
    for action in actions:
        state.apply(action)
    for version in wanted:
        for line in (log_dir / f"{version:020d}.json").read_text().splitlines():
            if line.strip():
                state.apply(json.loads(line))
    return state


def delta_row_count(path: Path) -> int | None:
    """The rows of the table's latest version, from its log's own file statistics (``numRecords``
    of each live data file), without a Spark job; None when the log cannot say (``delta_log``, a
    file written without statistics or with deleted rows): then ask Spark."""
    state = delta_log(path)
    return state.rows if state else None


#: A run looks up at most this many of its own waveform ids in a published table as a literal
#: list (``only_ids``), more only by a join. Measured on a table of 1600 files, for a run of 24
#: ids: 0.25 s against 1.61 s by the join alone (docs/benchmarks/table-layout.md).
ID_LIST_MAX = 2000


def _distinct_ids(files: list[Path | str]) -> list[str] | None:
    """The distinct non-null ``waveform_id`` values of parquet ``files`` (pyarrow, one column), or
    None: more than ``ID_LIST_MAX``, too many rows to be worth reading, or unreadable."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        if sum(pq.ParquetFile(f).metadata.num_rows for f in files) > 100 * ID_LIST_MAX:
            return None  # a large run: reading its ids costs more than the list would save
        ids = set()
        for f in files:
            ids.update(v for v in pc.unique(pq.read_table(f, columns=["waveform_id"])["waveform_id"]).to_pylist() if v)
            if len(ids) > ID_LIST_MAX:
                return None
    except (OSError, KeyError, ValueError):
        return None
    return sorted(ids)


def table_ids(path: Path) -> list[str] | None:
    """The distinct waveform ids of the Delta table ``path`` (its live files, from its log: the
    same version Spark reads, as nothing else writes a run's candidate tables), or None as
    ``_distinct_ids`` says, or when the log cannot be read without Spark."""
    from urllib.parse import unquote

    state = delta_log(path)
    if state is None:
        return None
    return _distinct_ids([Path(path) / unquote(p) for p in sorted(state.files)])


def staged_ids(chunk_files: list[Path | str]) -> list[str] | None:
    """The distinct waveform ids in a run's staged chunk files (read here, one column, no Spark);
    None when there are more than ``ID_LIST_MAX`` (or the files do not say)."""
    return _distinct_ids(chunk_files)


def only_ids(frame: DataFrame, ids: list[str] | None) -> DataFrame:
    """``frame``'s rows whose ``waveform_id`` is in ``ids`` (None: every row). The caller still
    joins on its ids: this literal list only lets Delta skip the files whose ``waveform_id``
    statistics exclude them, so a run's look-up does not scan the whole table."""
    from pyspark.sql import functions as F

    if ids is None:
        return frame
    return frame.where(F.col("waveform_id").isin(ids) if ids else F.lit(False))


def read_delta(spark: SparkSession, path: Path, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(str(path))


def delta_ids(spark: SparkSession, path: Path, version: int | None, where: str | None = None) -> DataFrame:
    """The table's waveform ids at ``version`` (of the rows matching SQL ``where``, if given)."""
    if version is None:
        return spark.createDataFrame([], "waveform_id string")
    return read_delta(spark, path, version).where(where or "true").select("waveform_id")


def window_predicate(topic: str, offsets: dict[int, tuple[int, int]], offset_column: str) -> str:
    """SQL: the rows of ``topic`` whose ``offset_column`` is inside a window's per-partition
    ``[from, to)`` offsets. It selects a window's rows to replace (``replaceWhere``) and the rows
    outside it; topic names are ``[a-zA-Z0-9._-]`` (Kafka's rule), so quoting is plain."""
    if not offsets:
        return "false"
    parts = " OR ".join(
        f"(`partition` = {int(p)} AND `{offset_column}` >= {int(a)} AND `{offset_column}` < {int(b)})"
        for p, (a, b) in sorted(offsets.items())
    )
    return f"(topic = '{topic}' AND ({parts}))"


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def replace_predicate(
    topic: str, offsets: dict[int, tuple[int, int]], offset_column: str, keep: list[str] = (), extra: list[str] = ()
) -> str:
    """SQL: the rows a window run replaces: those inside the window (``window_predicate``) but
    not of a waveform in ``keep``, and those of a waveform in ``extra`` wherever they are."""
    where = window_predicate(topic, offsets, offset_column)
    if keep:
        where = f"({where} AND waveform_id NOT IN ({', '.join(map(sql_string, keep))}))"
    if extra:
        where = f"({where} OR waveform_id IN ({', '.join(map(sql_string, extra))}))"
    return where


def append_new(
    df: DataFrame,
    path: Path,
    keys: list[str],
    partition_by: list[str] | None = None,
    checked_version: int | None = None,
    merge_schema: bool = False,
    txn: str | None = None,
) -> None:
    """Append the rows of ``df`` whose ``keys`` are not in the table yet, in one atomic commit.

    ``checked_version``: ``df`` already excludes the keys of that version of the table; they are
    only compared again if the table has moved since (another writer), so the payload rows are not
    joined against the table's keys in the common case.

    ``txn``: an id for this append (Delta's ``txnAppId``, version 1): Delta skips it if the table
    already holds it, and refuses a concurrent twin. Two appends of the same rows race past the
    key check when a killed client's write still runs on the Spark engine beside its retry; with
    one ``txn`` only one of them commits.
    """
    version = delta_version(path)
    if version is not None and version != checked_version:
        existing = read_delta(df.sparkSession, path).select(*keys)
        df = df.join(existing, keys, "left_anti")
    writer = df.write.format("delta").mode("append")
    if txn:
        writer = writer.option("txnAppId", txn).option("txnVersion", 1)
    if merge_schema:  # columns added since the table was created (e.g. ``detail``) are added to it
        writer = writer.option("mergeSchema", "true")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.save(str(path))


def write_candidate(df: DataFrame, path: Path) -> None:
    """Replace the run's candidate table ``path`` with ``df`` (one atomic commit). Uncompressed:
    it is read once or twice and then deleted; the published tables are compressed when written."""
    (
        df.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("compression", "uncompressed")
        .save(str(path))
    )


def delta_checksums(
    spark: SparkSession,
    path: Path,
    version: int | None,
    ids: DataFrame,
    counted: str | None = None,
    id_list: list[str] | None = None,
) -> DataFrame:
    """``waveform_id``, ``checksum`` and ``counted`` (the row matches SQL ``counted``; true if not
    given) of the table's rows at ``version`` whose id is in ``ids`` (a semi-join: only the ids a
    run read are kept, and only these two columns of the table are scanned, never the payloads).
    Every id of the table, whatever its source and date partition, is looked at: an id reused for
    other content may carry another source or date. ``id_list``: the same ids as a list, if the
    caller has them (``staged_ids``): files that cannot hold them are skipped (``only_ids``)."""
    schema = "waveform_id string, checksum string, counted boolean"
    if version is None:
        return spark.createDataFrame([], schema)
    rows = only_ids(read_delta(spark, path, version), id_list).selectExpr(
        "waveform_id", "checksum", f"({counted or 'true'}) AS counted"
    )
    return rows.join(ids.select("waveform_id").distinct(), "waveform_id", "left_semi")
