"""Delta ``add`` actions for Parquet files that a writer other than Delta put in a table's folder.

A publish has the Spark engine write the run's rows as plain Parquet files into a new folder of
the output table, and commits them from the run's own process with delta-rs, the run's
transaction in the same commit (``tables.append_new``), as kafka-delta-ingest commits the files
it writes. Delta's own writer would rebuild the table's state on the engine to check the
transaction id (three Spark jobs, and a checkpoint every tenth commit, about 0.7 s a run).

A commit names each file with its size, its partition values (from its Hive-style folder
names, as Spark writes them) and its statistics, read here from the file's footer: readers
skip files by them (delta-rs's look-up of a run's ids, Spark's and Trino's filters), so they must
hold every value of the file. Kept exact where the footer is (row counts, null counts, integers,
strings), widened where Delta's format is coarser (timestamps: milliseconds, the
minimum rounded down, the maximum up), left out where a footer's can mislead (floating point:
NaN) or mean nothing (binary payloads). Pure: no Spark, no table.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import PurePath, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

#: Spark's folder name for a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_values(relative: PurePath) -> dict[str, str | None]:
    """The ``key=value`` folder names on the way to a file (``relative`` to where it was written)."""
    values: dict[str, str | None] = {}
    for part in relative.parts[:-1]:
        key, sep, value = part.partition("=")
        if sep:
            value = urllib.parse.unquote(value)
            values[urllib.parse.unquote(key)] = None if value == NULL_PARTITION else value
    return values


def _delta_timestamp(value: datetime, up: bool) -> str | None:
    """``value`` in Delta's statistics format (UTC, milliseconds, a four-digit year), rounded
    ``up`` or down; None where rounding up leaves the calendar (the bound is then not stated)."""
    value = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    extra = value.microsecond % 1000
    if extra:
        value -= timedelta(microseconds=extra)
        try:
            value += timedelta(milliseconds=1) if up else timedelta(0)
        except OverflowError:  # within the last millisecond of year 9999
            return None
    return f"{value.year:04d}-{value:%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"


def _bound(value, kind: pa.DataType, up: bool):
    """A footer's minimum or maximum as Delta states it; None where it is not stated."""
    if pa.types.is_timestamp(kind):
        return _delta_timestamp(value, up)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return value
    if pa.types.is_integer(kind):
        return value
    return None  # floating point (a footer's bounds may skip NaN), booleans, binary, dates, nested


def file_stats(metadata: pq.FileMetaData) -> dict:
    """Delta's ``stats`` of a Parquet file: ``numRecords``, and per top-level column its
    ``nullCount`` and ``minValues``/``maxValues`` where every row group's footer states them."""
    schema = metadata.schema.to_arrow_schema()
    stats: dict = {"numRecords": metadata.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for i in range(metadata.num_columns):
        name = metadata.schema.column(i).path
        if "." in name or name not in schema.names:
            continue
        column = [metadata.row_group(g).column(i).statistics for g in range(metadata.num_row_groups)]
        if not column or any(s is None or not s.has_null_count for s in column):
            continue
        stats["nullCount"][name] = sum(s.null_count for s in column)
        bounded = [s for s in column if s.has_min_max]
        if len(bounded) != sum(1 for g in range(metadata.num_row_groups) if metadata.row_group(g).num_rows > 0):
            continue  # a row group with values but no bounds: none can be stated for the file
        kind = schema.field(name).type
        low = _bound(min(s.min for s in bounded), kind, up=False) if bounded else None
        high = _bound(max(s.max for s in bounded), kind, up=True) if bounded else None
        if low is not None and high is not None:
            stats["minValues"][name], stats["maxValues"][name] = low, high
    return stats


@dataclass(frozen=True)
class WrittenFile:
    """A data file a writer left in a table's folder: its path relative to the table, its size
    and its modification time (ms since the epoch)."""

    path: str
    size: int
    modified_ms: int


def add_action_fields(written: WrittenFile, written_to: str, metadata: pq.FileMetaData) -> dict:
    """What a Delta ``add`` of ``written`` says: its path relative to the table, size, modification
    time (ms), partition values (its folders under ``written_to``, the folder the writer was given,
    relative to the table) and ``stats`` (JSON, from its footer's ``metadata``)."""
    return {
        "path": written.path,
        "size": written.size,
        "partition_values": partition_values(PurePosixPath(written.path).relative_to(written_to)),
        "modification_time": written.modified_ms,
        "data_change": True,
        "stats": json.dumps(file_stats(metadata), separators=(",", ":")),
    }
