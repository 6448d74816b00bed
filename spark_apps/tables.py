"""The Delta tables a run writes: its candidate output (private to the run) and the published tables.

A run's reassembly writes its manifest (its new waveforms but their payload), quarantine and
dead-letter rows into candidate tables under the run's staging folder (``RunStore.candidate_dir``),
each replaced whole by one atomic Delta commit, so a retry of the reassembly starts over. Readers
never see them. Only a run whose candidates passed validation appends them to the published tables
(``publish_run``; the waveforms' payloads straight from the staged chunks), adding only keys not
there yet, so a retried publish adds nothing twice.

Every append is committed by delta-rs in the run's process, with the run's transaction: the
small tables' rows from this process (``append_rows``), the waveforms' as Parquet files the Spark
engine writes into a new folder of the table (``append_new``). A commit that meets another
writer's is tried again, as kafka-delta-ingest retries its commits: the same files, against the
table as it is then, without writing them again; only when that writer committed the run's
transaction (nothing left to do) or some of the same keys (decided again) does it differ. Window
runs replace their rows with Delta's own writer on the engine (``replaceWhere``).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath

import pyarrow as pa
import tenacity
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from wavepipe import storage
from wavepipe.contracts.errors import BUGS
from wavepipe.delta_files import NULL_PARTITION, add_action_fields, partition_values
from wavepipe.delta_txn import Txn
from wavepipe.faults import failpoint

log = logging.getLogger("wavepipe.tables")

#: Candidate table name -> (keys that identify a row, partition columns). The waveforms table is
#: partitioned by day only: a run writes one file per day it carries, however many sources (a
#: station, lead or microphone id: thousands in a real deployment) it holds. A read of one source
#: skips files by their ``source`` statistics, which ``wavepipe table optimize --zorder``
#: (``maintenance.CLUSTER_BY``) makes narrow. Tables laid out by ``source`` and ``date`` before
#: keep working; ``wavepipe table repair`` lays them out again.
TABLE_KEYS = {
    "quarantine": (["waveform_id", "reason"], None),
    "dead_letter": (["topic", "partition", "offset"], None),
    "waveforms": (["waveform_id"], ["date"]),
}


#: The name of a folder in a table that holds the Parquet files of one append (``write_files``),
#: then a time and a random part: a retry writes a new one, never over an earlier attempt's.
FILES_FOLDER = "wavepipe-append-"


def _holds_string(kind) -> bool:
    from pyspark.sql import types as T

    if isinstance(kind, T.StringType):
        return True
    if isinstance(kind, T.ArrayType):
        return _holds_string(kind.elementType)
    if isinstance(kind, T.MapType):
        return _holds_string(kind.keyType) or _holds_string(kind.valueType)
    if isinstance(kind, T.StructType):
        return any(_holds_string(f.dataType) for f in kind.fields)
    return False


def protocol_types(df: DataFrame) -> DataFrame:
    """``df`` with the types every Delta reader accepts. Over Spark Connect (pyspark 4.2), a column
    that ``mapInArrow``/``applyInArrow`` typed ``string`` is written to the Delta log as ``string
    collate UTF8_BINARY``, a type the Delta protocol does not define (delta-rs, Polars and Trino
    refuse the table); cast by its SQL name (parsed by the server), the same column is ``string``.
    Only string-holding columns are cast; the values are unchanged."""
    from pyspark.sql import functions as F

    columns = [
        F.col(f"`{f.name}`").cast(f.dataType.simpleString()).alias(f.name)
        if _holds_string(f.dataType)
        else F.col(f"`{f.name}`")
        for f in df.schema.fields
    ]
    return df.select(*columns)


def delta_writer(df: DataFrame):
    """The one way wavepipe writes a Delta table: ``df``'s writer, with protocol-valid types."""
    return protocol_types(df).write.format("delta")


def arrow_schema(schema: StructType):
    """``schema`` as Arrow, timestamps in UTC (pyspark 4.2 asks for ``timezone``, 4.1 for
    ``timestamp_utc``)."""
    if "timezone" in inspect.signature(to_arrow_schema).parameters:
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)


def delta_version(path: str) -> int | None:
    """The table's latest committed version, from its log's file names (None: no table yet).

    Every Delta commit is the file ``_delta_log/<version>.json`` (zero-padded), written atomically;
    reading the names costs a directory listing, where asking Delta costs a Spark job (and, the
    first time in a JVM, several seconds of Delta's start-up).
    """
    versions = storage.log_versions(path)
    return versions[-1] if versions else None


def commit_metric(path: str, version: int, name: str) -> int | None:
    """Operation metric ``name`` (e.g. ``numDeletedRows``) of the table's commit ``version``, as
    its writer recorded it in the commit's ``commitInfo``; None when the commit does not say."""
    for line in storage.read_text(storage.join(path, "_delta_log", f"{version:020d}.json")).splitlines():
        info = json.loads(line).get("commitInfo") if line.strip() else None
        if info is not None:
            value = (info.get("operationMetrics") or {}).get(name)
            return None if value is None else int(value)
    return None


def added_files(path: str, version: int) -> list[str]:
    """The data files table ``path``'s commit ``version`` added (paths relative to the table)."""
    return _logged_files(path, version, "add")


def removed_files(path: str, version: int) -> list[str]:
    """The data files table ``path``'s commit ``version`` removed (paths relative to the table;
    still there until a VACUUM)."""
    return _logged_files(path, version, "remove")


def _logged_files(path: str, version: int, action: str) -> list[str]:
    from urllib.parse import unquote

    text = storage.read_text(storage.join(path, "_delta_log", f"{version:020d}.json"))
    actions = (json.loads(line) for line in text.splitlines() if line.strip())
    return [unquote(a[action]["path"]) for a in actions if action in a]


@dataclass
class DeltaLog:
    """A Delta table's latest version as delta-rs reads its log (no Spark).

    ``files``: the live data files, path (relative to the table, URL-encoded as in the log) ->
    (bytes, rows or None when the log does not say, e.g. a file with deleted rows); ``last``:
    operation (WRITE, OPTIMIZE, VACUUM END...) -> when it last committed, epoch ms, among the
    newest ``HISTORY_COMMITS`` commits; ``partition_columns`` as the table declares them."""

    version: int
    files: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    partition_columns: list[str] = field(default_factory=list)
    #: per live file, its partition as a folder name would say it (``date=2026-11-25``; ``""``
    #: unpartitioned), from its partition values: files of one partition may lie in several
    #: folders (each append writes into a folder of its own)
    partition_of: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> int | None:
        counts = [rows for _, rows in self.files.values()]
        return None if any(r is None for r in counts) else sum(counts)


#: How far back ``delta_log`` looks for the last OPTIMIZE or VACUUM (reading history costs one
#: file per commit; a micro-batch table makes thousands a day).
HISTORY_COMMITS = 1000


def _live_files(table, partition_columns: list[str]) -> tuple[dict[str, tuple[int, int | None]], dict[str, str]]:
    """The live files (``DeltaLog.files``) and the partition of each (``DeltaLog.partition_of``)."""
    import pyarrow as pa

    adds = pa.table(table.get_add_actions(flatten=True))
    # only what is counted: a table's per-column statistics would be most of the conversion
    values = [f"partition.{c}" for c in partition_columns]
    deletion = [c for c in adds.column_names if c.startswith("deletionVector")]
    wanted = ["path", "size_bytes", "num_records", *values, *deletion]
    files, partition_of = {}, {}
    for add in adds.select([c for c in wanted if c in adds.column_names]).to_pylist():
        deleted = any(add.get(c) is not None for c in deletion)
        rows = None if deleted or add.get("num_records") is None else int(add["num_records"])
        files[add["path"]] = (int(add["size_bytes"] or 0), rows)
        partition_of[add["path"]] = "/".join(
            f"{c}={NULL_PARTITION if add.get(v) is None else add[v]}"
            for c, v in zip(partition_columns, values, strict=True)
        )
    return files, partition_of


def delta_log(path: str, *, history: bool = False) -> DeltaLog | None:
    """The table's latest version, read by delta-rs (the Delta project's reader of the log: commits,
    classic, multi-part and v2 checkpoints); ``history``: also when each operation last committed.
    None when there is no table, or delta-rs cannot open it (logged: a table written with types
    the protocol does not define needs ``wavepipe table repair``): then ask Spark."""
    if not storage.has_table(path):
        return None
    try:
        table = storage.delta_table(path)
        partition_columns = list(table.metadata().partition_columns)
        files, partition_of = _live_files(table, partition_columns)
        state = DeltaLog(table.version(), files, partition_columns=partition_columns, partition_of=partition_of)
        for info in table.history(HISTORY_COMMITS) if history else ():
            if info.get("operation"):
                state.last.setdefault(info["operation"], int(info.get("timestamp") or 0))
    except BUGS:
        raise
    except Exception as exc:  # a log delta-rs cannot read: the callers fall back to Spark or say so
        log.warning("delta-rs cannot read the table %s: %s", path, str(exc).splitlines()[0])
        return None
    return state


def delta_row_count(path: str) -> int | None:
    """The rows of the table's latest version, from its log's own file statistics (``numRecords``
    of each live data file), without a Spark job; None when the log cannot say (``delta_log``, a
    file written without statistics or with deleted rows): then ask Spark."""
    state = delta_log(path)
    return state.rows if state else None


#: A run looks up at most this many of its own waveform ids in a published table as a literal
#: list (``with_ids``), more only by a join. Measured on a table of 1600 files, for a run of 24
#: ids: 0.25 s against 1.61 s by the join alone (docs/benchmarks/table-layout.md).
ID_LIST_MAX = 2000


def read_delta(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(storage.for_spark(path))


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


#: Tries of a commit that met another writer's (two runs of one group at once, each on a worker
#: of its own; two first runs creating a table), in all: each try decides again from the table as
#: it is then.
COMMIT_TRIES = 3


def _committing(path: str) -> tenacity.Retrying:
    """Tries of a publish to table ``path`` (``COMMIT_TRIES`` in all) while its commit meets
    another writer's (``storage.is_commit_conflict``); any other error, or the last try's, is raised."""

    def say(state: tenacity.RetryCallState) -> None:
        first = str(state.outcome.exception()).splitlines()[0]
        log.warning("%s: another writer committed first (%s); deciding again from the table as it is now", path, first)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(storage.is_commit_conflict),
        stop=tenacity.stop_after_attempt(COMMIT_TRIES),
        before_sleep=say,
        reraise=True,
    )


def decided_again_on_conflict(publish):
    """``publish(data, path, ...)``, tried again (up to ``COMMIT_TRIES`` in all) while its commit
    meets another writer's: the next try finds what that writer committed (the group's
    transaction: nothing to write; or some of the keys: only the others are written). For a
    publish without a Spark write (``append_rows``); ``append_new`` commits the files it wrote
    again instead."""

    @functools.wraps(publish)
    def publishing(data, path: str, *args, **kwargs):
        return _committing(str(path))(publish, data, path, *args, **kwargs)

    return publishing


@dataclass(frozen=True)
class _Written:
    """Files a publish wrote into a table (``write_files``) and has not committed: their
    ``folder``, the columns they are laid out by and, for a table not there then, its schema."""

    folder: str
    partition_by: list[str]
    schema: object = None


@dataclass
class WorkerWrites:
    """Rows that Spark's Python workers write as Parquet files themselves, straight into the
    table's new folder (``assembly.write_parquet``): their bytes never pass through the JVM, and
    on an object store each file is written where it stays (no commit-time copy). ``files(target,
    skip)`` is the Spark frame of the files written at ``target`` (an ``assembly.FilesTarget``),
    the rows whose ``waveform_id`` is in ``skip`` left out; ``schema``: the rows' columns
    (pyarrow, partition columns included: a new table's schema); ``run_id``: the rows'."""

    schema: object
    run_id: str
    files: Callable[[object, set[str]], DataFrame]


def append_new(
    df: DataFrame | WorkerWrites,
    path: str,
    keys: list[str],
    partition_by: list[str] | None = None,
    checked_version: int | None = None,
    txn: Txn | None = None,
    scope: list[str] | None = None,
) -> None:
    """Append the rows of ``df`` whose ``keys`` are not in the table yet, in one atomic commit.

    The Spark engine writes the rows as Parquet files into a new folder of the table (one Spark
    job); this process commits them with delta-rs (``commit_files``), the run's ``txn`` in the
    same commit, as kafka-delta-ingest commits the files it writes. Until that commit, readers
    see none of them; files of a write killed before it are never part of the table and
    ``wavepipe table vacuum`` removes them.

    A commit that meets another writer's (``storage.is_commit_conflict``) is tried again, up to
    ``COMMIT_TRIES`` in all, against the table as it is then, with the files already written: no
    second Spark job. Unless the table now holds ``txn`` (a twin committed the run: nothing is
    committed, the files are left to ``wavepipe table vacuum``), or holds some of the files' keys:
    then the rows are decided again and written anew.

    ``txn``: the run's transaction (``wavepipe.delta_txn``): a table that already holds its
    version for its id is left as it is (an earlier attempt committed it); nothing is written.

    ``scope``: where in the table a row of ``df`` can already be: the waveform ids of ``df``
    (``with_ids``). Only the keys there are read (Delta skips the other files by their
    statistics), so the check costs what the run carries, not what the table holds.

    ``checked_version``: ``df`` already excludes the keys of that version of the table; they are
    only compared again if the table has moved since (another writer), so the payload rows are not
    joined against the table's keys in the common case.
    """
    written: list[_Written] = []  # files of this publish's write not committed yet (one write's)

    def write_and_commit(table) -> None:
        laid_out = partition_by
        if table is not None:  # the commit is checked against this version: see commit_files
            laid_out = table.metadata().partition_columns  # an existing table keeps its own layout
        moved = table is not None and table.version() != checked_version
        if isinstance(df, WorkerWrites):
            schema = df.schema if table is None else None
            folder = _workers_write(df, path, laid_out, _ids_there(path, keys, scope) if moved else set())
        else:
            frame = df
            if moved:
                existing = read_delta(frame.sparkSession, path)
                if scope is not None:
                    existing = with_ids(existing, scope)
                frame = frame.join(existing.select(*keys), keys, "left_anti")
            schema = arrow_schema(frame.schema) if table is None else None  # a new table's
            folder = write_files(frame, path, laid_out)
        written.append(_Written(folder, list(laid_out or []), schema))
        failpoint("publish.before_commit")
        commit_files(path, folder, laid_out or [], txn, table=table, schema=schema)

    def publish() -> None:
        table = storage.delta_table(path) if delta_version(path) is not None else None
        if table is not None:
            _require_columns(table, df.schema if isinstance(df, WorkerWrites) else arrow_schema(df.schema), path)
        if table is not None and txn is not None and (table.transaction_version(txn.app_id) or 0) >= txn.version:
            if written:
                log.info(
                    "%s: transaction %s@%d was committed by another attempt; the files this one wrote (%s) "
                    "are in no version (`wavepipe table vacuum` removes them)",
                    path,
                    txn.app_id,
                    txn.version,
                    written[0].folder,
                )
            return
        if written:
            files = written[0]
            why = _why_not_commit_again(path, files, keys, scope, table)
            if why is None:
                log.info(
                    "%s: committing the files already written (%s) against the table's version %s, "
                    "without writing them again",
                    path,
                    files.folder,
                    "none" if table is None else table.version(),
                )
                commit_files(path, files.folder, files.partition_by, txn, table=table, schema=files.schema)
                return
            log.warning(
                "%s: the files written (%s) cannot be committed again: %s; writing the rows again "
                "(those files are in no version; `wavepipe table vacuum` removes them)",
                path,
                files.folder,
                why,
            )
            written.clear()
        write_and_commit(table)

    _committing(str(path))(publish)


def missing_columns(table, schema: pa.Schema) -> list[pa.Field]:
    """The nullable columns of ``schema`` (pyarrow) that ``table`` (a ``DeltaTable``) lacks: those
    a newer wavepipe writes into a table an earlier one made."""
    have = {f.name for f in table.schema().fields}
    return [f for f in schema if f.name not in have and f.nullable]


def add_columns(table, schema: pa.Schema) -> list[str]:
    """Add ``missing_columns`` to ``table`` in one metadata-only commit by delta-rs (null in its
    older rows, as Spark's ``mergeSchema`` would add them); their names. ``wavepipe table repair``
    does this, never a run."""
    from deltalake import Schema

    new = missing_columns(table, schema)
    if new:
        log.info("adding the columns %s to the table %s", ", ".join(f.name for f in new), table.table_uri)
        table.alter.add_columns(list(Schema.from_arrow(pa.schema(new)).fields))
    return [f.name for f in new]


def _require_columns(table, schema: pa.Schema, path: str) -> None:
    """Refuse, before anything is written, rows with columns the table lacks (an earlier wavepipe
    made it: ``wavepipe table repair`` adds them); a required column the rows lack is left to
    ``_check_columns``'s error."""
    new = missing_columns(table, schema)
    if new:
        raise storage.TableNeedsRepairError(
            f"{path}: lacks the columns {', '.join(f.name for f in new)} that this wavepipe writes (an earlier "
            "wavepipe made it); nothing was written. Run `wavepipe table repair`, then retry"
        )


def _why_not_commit_again(path: str, files: _Written, keys: list[str], scope, table) -> str | None:
    """Why ``files`` cannot be committed as they are to table ``path`` as it is now (``table``, a
    ``DeltaTable``; None: still no table), or None: it is laid out as they are and holds none of
    their keys. Only the files' key columns are read (pyarrow), and only the table's keys in
    ``scope`` (delta-rs, ``_keys_in``; no scope: those equal to the files' keys)."""
    if table is None:  # still no table: the files create it, unless they were written into one
        return None if files.schema is not None else "the table is no longer there"
    laid_out = list(table.metadata().partition_columns)
    if laid_out != files.partition_by:
        return f"the table is partitioned by {laid_out}, the files by {files.partition_by}"
    mine = _written_keys(path, files, keys)
    if mine.empty:
        return None
    there = _keys_in(path, keys, scope) if scope is not None else _keys_among(path, keys, mine)
    both = mine.astype(object).merge(there.astype(object).drop_duplicates(), on=keys, how="inner")
    if both.empty:
        return None
    shown = ", ".join(str(tuple(row)) if len(keys) > 1 else str(row[0]) for row in both.head(3).itertuples(index=False))
    return f"{len(both)} of their rows have keys the table holds now (e.g. {shown})"


def _written_keys(path: str, files: _Written, keys: list[str]):
    """``keys`` of the rows in ``files`` (as pandas), read from the files themselves: only the key
    columns; a key the files are laid out by, from their folder names."""
    import pandas as pd

    frames = []
    for written in storage.written_files(path, files.folder):
        values = partition_values(PurePosixPath(written.path).relative_to(files.folder))
        stored = [k for k in keys if k not in values]
        frame = storage.read_parquet(storage.join(path, written.path), columns=stored).to_pandas()
        for key in keys:
            if key in values:
                frame[key] = values[key]
        frames.append(frame[keys])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=keys)


def _keys_among(path: str, keys: list[str], mine):
    """``keys`` of the table's rows whose every key is among those of ``mine`` (pandas), read by
    delta-rs: only the key columns (none when the table lacks one)."""
    import pandas as pd
    import pyarrow.compute as pc

    dataset = storage.delta_table(path).to_pyarrow_dataset()
    if not set(keys) <= set(dataset.schema.names):
        return pd.DataFrame(columns=keys)
    near = None
    for key in keys:
        found = pc.field(key).isin(list(mine[key].dropna().unique()))
        near = found if near is None else near & found
    return dataset.to_table(columns=keys, filter=near).to_pandas()


def _ids_there(path: str, keys: list[str], scope: list[str] | None) -> set[str]:
    """The waveform ids of ``scope`` that table ``path`` holds now (delta-rs: only their files)."""
    if keys != ["waveform_id"] or scope is None:
        raise ValueError(f"{path}: rows the workers write are keyed by waveform_id within a scope of ids")
    return set(id_rows(path, scope, ["waveform_id"])["waveform_id"])


def _workers_write(rows: WorkerWrites, path: str, partition_by: list[str] | None, skip: set[str]) -> str:
    """``rows`` written by Spark's Python workers into a new folder of table ``path``, laid out
    by ``partition_by`` (one Spark job); returns the folder."""
    from wavepipe.spark_apps.assembly import FilesTarget

    folder = new_files_folder()
    reach = storage.worker_options(path)  # an object store's endpoint: no keys
    target = FilesTarget(str(path), folder, tuple(partition_by or ()), rows.run_id, reach)
    rows.files(target, skip).toArrow()  # the files' paths and rows: what commit_files lists again
    return folder


def new_files_folder() -> str:
    """A new folder's name for the files of one append (``FILES_FOLDER``, a time, a random part)."""
    return f"{FILES_FOLDER}{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


def write_files(df: DataFrame, path: str, partition_by: list[str] | None) -> str:
    """``df``'s rows as Parquet files in a new folder of table ``path`` (``FILES_FOLDER``), laid
    out in Hive-style folders by ``partition_by``, as Delta lays out its own; one Spark job."""
    folder = new_files_folder()
    conf = df.sparkSession.conf
    conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # as Delta's writer; Spark's: INT96
    conf.set("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")  # no _SUCCESS file: nothing removes it
    writer = df.write.mode("error")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(storage.for_spark(storage.join(path, folder)))
    return folder


def commit_files(path: str, folder: str, partition_by: list[str], txn: Txn | None, *, table=None, schema=None) -> None:
    """Commit the Parquet files under ``folder`` of table ``path`` (``write_files``) with delta-rs:
    one commit of their ``add`` actions (statistics from their footers, ``delta_files``) and
    ``txn``'s transaction and metadata. ``table``: the table (a ``DeltaTable``) as it was when the
    caller found that it did not hold ``txn``: a commit of the same transaction id since then
    fails this one (delta-rs's conflict check), so two twins never both commit. Or ``schema``
    (pyarrow, partition columns included): there is no table yet, the commit creates it."""
    from deltalake import Schema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    files = storage.written_files(path, folder)
    footers = [storage.parquet_metadata(path, f) for f in files]
    adds = [AddAction(**add_action_fields(f, folder, footer)) for f, footer in zip(files, footers, strict=True)]
    properties = commit_properties(txn)
    if table is None:
        create_table_with_add_actions(
            storage.for_clients(path),
            Schema.from_arrow(schema),
            adds,
            mode="error",
            partition_by=partition_by or None,
            commit_properties=properties,
            storage_options=storage.delta_write_options(path),
        )
        return
    _check_columns(footers[0].schema.to_arrow_schema() if footers else None, table.schema(), partition_by, path)
    table.create_write_transaction(
        adds, "append", table.schema(), partition_by=partition_by or None, commit_properties=properties
    )


def ensure_table(path: str, schema, partition_by: list[str] | None) -> bool:
    """Make the table at ``path`` empty, with ``schema`` (pyarrow) laid out by ``partition_by``,
    if there is none, as its first rows would have made it (delta-rs, no Spark job); whether it
    did. A table another writer made first is left as it is."""
    from deltalake import DeltaTable

    if delta_version(path) is not None:
        return False
    try:
        DeltaTable.create(
            storage.for_clients(path),
            schema,
            mode="ignore",
            partition_by=partition_by or None,
            storage_options=storage.delta_write_options(path),
        )
    except Exception as exc:
        if delta_version(path) is None:  # not a race with another writer's creation: a real failure
            raise
        log.info("%s: made by another writer meanwhile (%s)", path, exc)
        return False
    return True


@decided_again_on_conflict
def append_rows(rows, path: str, keys: list[str], txn: Txn, scope: list[str] | tuple[str, dict]) -> None:
    """Append ``rows`` (pyarrow; small: quarantine or dead-letter rows) whose ``keys`` are not in
    the table yet, in one atomic commit by delta-rs in this process: no Spark job. The commit
    carries ``txn`` as ``append_new``'s do: a table that already holds its version
    for its id is left as it is (an earlier attempt committed it). Columns the table lacks are
    added to it.

    ``scope``: where a row of ``rows`` can already be: its waveform ids, or (topic, per partition
    the ``[from, to)`` of the ``offset`` column) for dead letters. Only the keys there are read
    (delta-rs skips the other files by their statistics), never every key of a table that grows."""
    from deltalake import write_deltalake

    table = storage.for_clients(path)
    if delta_version(path) is not None:
        table = storage.delta_table(path)  # the commit is checked against this version (as in commit_files)
        if (table.transaction_version(txn.app_id) or 0) >= txn.version:
            return
        there = _keys_in(path, keys, scope).drop_duplicates()
        mine = rows.select(keys).to_pandas().merge(there, on=keys, how="left", indicator=True)
        rows = rows.filter((mine["_merge"] == "left_only").to_numpy())
    if rows.num_rows:
        options = storage.delta_write_options(path) if isinstance(table, str) else None
        write_deltalake(
            table,
            rows,
            mode="append",
            schema_mode="merge",
            commit_properties=commit_properties(txn),
            storage_options=options,
        )


def commit_properties(txn: Txn | None):
    """A delta-rs commit's properties that carry ``txn``: its transaction and its metadata."""
    from deltalake.transaction import CommitProperties, Transaction

    if txn is None:
        return None
    return CommitProperties(
        custom_metadata={"userMetadata": txn.metadata}, app_transactions=[Transaction(txn.app_id, txn.version)]
    )


def _keys_in(path: str, keys: list[str], scope: list[str] | tuple[str, dict]):
    """``keys`` of the table's rows in ``scope`` (``append_rows``), as pandas."""
    if isinstance(scope, list):
        return id_rows(path, scope, keys)
    import pyarrow.compute as pc

    from wavepipe.spark_apps.classify import inside_window

    topic, offsets = scope
    if not offsets:
        return id_rows(path, [], keys)
    near = (
        (pc.field("topic") == topic)
        & pc.field("partition").isin(list(offsets))
        & (pc.field("offset") >= min(a for a, _ in offsets.values()))
    )
    columns = sorted({*keys, "topic", "partition", "offset"})
    found = storage.delta_table(path).to_pyarrow_dataset().to_table(columns=columns, filter=near).to_pandas()
    return found.loc[inside_window(found, topic, offsets, "offset"), keys]


def with_txn(writer, txn: Txn | None):
    """``writer`` committing as ``txn`` (id, version and the commit's ``userMetadata``)."""
    if txn is None:
        return writer
    return writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version).option("userMetadata", txn.metadata)


def _check_columns(files_schema, schema, partition_by: list[str], path: str) -> None:
    """A clear error, before the commit, when the files (their pyarrow ``files_schema``; None: no
    file) do not fit table ``path``'s ``schema`` (a Delta schema): a column the table lacks, or
    one it requires that the files lack."""
    if files_schema is None:
        return
    written = set(files_schema.names) | set(partition_by)
    fields = {f.name: f for f in schema.fields}
    unknown = sorted(written - set(fields))
    missing = sorted(name for name, f in fields.items() if not f.nullable and name not in written)
    if unknown or missing:
        raise ValueError(
            f"{path}: the rows to append do not fit the table (columns it lacks: {unknown or 'none'}; "
            f"required columns they lack: {missing or 'none'}); nothing was committed. If an earlier "
            "wavepipe wrote the table, run `wavepipe table repair`."
        )


def with_ids(frame: DataFrame, ids: list[str], *, keep: bool = True) -> DataFrame:
    """``frame``'s rows whose ``waveform_id`` is in ``ids`` (``keep=False``: not in ``ids``): a
    literal list up to ``ID_LIST_MAX`` (Delta skips the files whose ``waveform_id`` statistics
    exclude them), a semi- or anti-join beyond."""
    from pyspark.sql import functions as F

    if len(ids) <= ID_LIST_MAX:
        listed = F.col("waveform_id").isin(ids) if ids else F.lit(False)
        return frame.where(listed if keep else ~listed)
    listed = frame.sparkSession.createDataFrame([(i,) for i in ids], "waveform_id string")
    return frame.join(listed, "waveform_id", "left_semi" if keep else "left_anti")


def id_rows(path: str, ids: list[str], columns: list[str]):
    """``columns`` of the table's rows whose ``waveform_id`` is in ``ids``, read by delta-rs in
    this process as pandas: no Spark job. Only these columns are read, and only of the files whose
    ``waveform_id`` statistics can hold the ids (delta-rs prunes the others). Every id of the
    table, whatever its source and date partition, is looked at: an id reused for other content
    may carry another source or date. A column the table lacks comes back empty (None)."""
    import pandas as pd
    import pyarrow.compute as pc

    if not ids or delta_version(path) is None:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    dataset = storage.delta_table(path).to_pyarrow_dataset(file_pruning_predicate=[("waveform_id", "in", ids)])
    there = [c for c in columns if c in dataset.schema.names]  # a table of an earlier wavepipe lacks some
    rows = dataset.to_table(columns=there, filter=pc.field("waveform_id").isin(ids)).to_pandas()
    return rows.reindex(columns=columns)


def source_times(path: str, sources: list[str], since_us: int, until_us: int) -> pa.Table:
    """``waveform_id``, ``source``, ``start_time``, ``end_time`` of the table's rows of
    ``sources`` that start in ``[since_us, until_us)`` (``source_rows``). Empty when there is no
    table, or it has no ``end_time`` yet (written before it)."""
    stamp = pa.timestamp("us", tz="UTC")
    empty = pa.schema(
        [("waveform_id", pa.string()), ("source", pa.string()), ("start_time", stamp), ("end_time", stamp)]
    )
    rows = source_rows(path, sources, since_us, until_us, empty.names)
    return empty.empty_table() if rows is None else rows.cast(empty)


def source_rows(
    path: str, sources: list[str], since_us: int, until_us: int, columns: list[str], ends_after_us: int | None = None
) -> pa.Table | None:
    """``columns`` of the table's rows of ``sources`` that start in ``[since_us, until_us)``
    (microseconds), and end at or after ``ends_after_us`` if given, read by delta-rs in this process:
    only these columns, only of the files whose statistics can hold such rows. None when there is
    no table or it lacks one of ``columns``."""
    import pyarrow.compute as pc

    if not sources or delta_version(path) is None:
        return None
    table = storage.delta_table(path)
    if not set(columns) <= {f.name for f in table.schema().fields}:
        return None
    stamp = pa.timestamp("us", tz="UTC")
    since, until = pa.scalar(since_us, stamp), pa.scalar(until_us, stamp)
    pruning = [("source", "in", sources), ("start_time", ">=", since.as_py()), ("start_time", "<", until.as_py())]
    near = pc.field("source").isin(sources) & (pc.field("start_time") >= since) & (pc.field("start_time") < until)
    if ends_after_us is not None:
        after = pa.scalar(ends_after_us, stamp)
        pruning.append(("end_time", ">=", after.as_py()))
        near &= pc.field("end_time") >= after
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)
    return dataset.to_table(columns=columns, filter=near)


@decided_again_on_conflict
def upsert_rows(rows: pa.Table, path: str, keys: list[str], txn: Txn) -> bool:
    """Put ``rows`` in the table at ``path`` (made with their schema if there is none), each
    replacing the row with its ``keys`` if there is one, in one commit by delta-rs (no Spark job)
    that carries ``txn``. A table that already holds ``txn``'s version for its id is left as it is
    (an earlier attempt committed it): returns False then, True when committed."""
    from deltalake import write_deltalake

    if delta_version(path) is None:
        write_deltalake(
            storage.for_clients(path),
            rows,
            mode="append",
            commit_properties=commit_properties(txn),
            storage_options=storage.delta_write_options(path),
        )
        return True
    table = storage.delta_table(path)
    if (table.transaction_version(txn.app_id) or 0) >= txn.version:
        return False
    on = " AND ".join(f"t.{k} = s.{k}" for k in keys)
    merge = table.merge(rows, on, source_alias="s", target_alias="t", commit_properties=commit_properties(txn))
    merge.when_matched_update_all().when_not_matched_insert_all().execute()
    return True
