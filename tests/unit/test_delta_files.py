"""Committing Parquet files written outside Delta (``delta_files``, ``tables.commit_files``): the
statistics readers skip files by, the partition values, and the transaction that commits once."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from wavepipe.delta_files import file_stats, partition_values
from wavepipe.delta_txn import Txn
from wavepipe.maintenance import compaction_plan, files_per_partition
from wavepipe.spark_apps.tables import commit_files, delta_log

SCHEMA = pa.schema(
    [
        pa.field("waveform_id", pa.string(), False),
        pa.field("start_time", pa.timestamp("us", tz="UTC"), False),
        pa.field("n_samples", pa.int64(), False),
        pa.field("sample_rate", pa.float64(), False),
        pa.field("payload", pa.binary(), True),
    ]
)


def _rows(ids, start_us, payload=b"x"):
    return pa.table(
        {
            "waveform_id": ids,
            "start_time": pa.array(start_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "n_samples": list(range(len(ids))),
            "sample_rate": [float("nan")] + [100.0] * (len(ids) - 1),
            "payload": [None] + [payload] * (len(ids) - 1),
        },
        schema=SCHEMA,
    )


def test_file_stats_hold_every_value_of_the_file(tmp_path):
    """Bounds over all row groups; timestamps widened to whole milliseconds; no bounds for
    floating point (NaN) or binary; null counts exact."""
    base = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
    path = tmp_path / "f.parquet"
    table = _rows(["m", "b", "z", "k"], [base + 5_123_456, base + 999, base + 7_000_001, base + 1_000])
    pq.write_table(table, path, row_group_size=2)
    stats = file_stats(pq.read_metadata(path))
    assert stats["numRecords"] == 4
    assert (stats["minValues"]["waveform_id"], stats["maxValues"]["waveform_id"]) == ("b", "z")
    assert (stats["minValues"]["n_samples"], stats["maxValues"]["n_samples"]) == (0, 3)
    assert stats["minValues"]["start_time"] == "2026-01-01T00:00:00.000Z"  # 999 us, rounded down
    assert stats["maxValues"]["start_time"] == "2026-01-01T00:00:07.001Z"  # 7.000001 s, rounded up
    assert "sample_rate" not in stats["minValues"] and "payload" not in stats["maxValues"]
    assert stats["nullCount"] == {"waveform_id": 0, "start_time": 0, "n_samples": 0, "sample_rate": 0, "payload": 1}
    json.dumps(stats)  # what the commit writes


def test_timestamp_bounds_at_the_ends_of_the_calendar_stay_valid_or_are_left_out(tmp_path):
    """Any year Spark allows: year 1 keeps four digits (RFC 3339); a maximum in the last
    millisecond of year 9999 cannot be rounded up, so no bounds are stated for the column."""
    first_us, last_us = -62_135_596_800_000_000, 253_402_300_799_999_999
    for values, expected in (
        ([first_us, 1], ("0001-01-01T00:00:00.000Z", "1970-01-01T00:00:00.001Z")),
        ([0, last_us], None),
    ):
        path = tmp_path / "t.parquet"
        pq.write_table(pa.table({"t": pa.array(values, pa.int64()).cast(pa.timestamp("us", tz="UTC"))}), path)
        stats = file_stats(pq.read_metadata(path))
        found = (stats["minValues"]["t"], stats["maxValues"]["t"]) if "t" in stats["minValues"] else None
        assert found == expected and stats["nullCount"] == {"t": 0}


def test_partition_values_come_from_spark_style_folder_names():
    assert partition_values(Path("date=2026-01-01/part-0.parquet")) == {"date": "2026-01-01"}
    assert partition_values(Path("source=a%2Fb/date=__HIVE_DEFAULT_PARTITION__/p.parquet")) == {
        "source": "a/b",
        "date": None,
    }
    assert partition_values(Path("part-0.parquet")) == {}


def _write_files(table: Path, name: str, rows: pa.Table) -> str:
    """``rows`` as a writer outside Delta leaves them: Parquet files in folder ``name`` of
    ``table``, by date; the folder's name is returned, as ``tables.write_files`` returns it."""
    pads.write_dataset(
        rows.append_column("date", pa.array(["2026-01-01"] * rows.num_rows)),
        table / name,
        format="parquet",
        partitioning=pads.partitioning(pa.schema([("date", pa.string())]), flavor="hive"),
    )
    return name


def test_committed_files_carry_the_transaction_once_and_their_statistics(tmp_path):
    base = 1_767_225_600_000_000
    table = tmp_path / "t"
    schema = SCHEMA.append(pa.field("date", pa.string(), False))
    first = _write_files(table, "wavepipe-append-1", _rows(["a", "b"], [base, base + 1]))
    commit_files(str(table), first, ["date"], Txn("wavepipe:g:t", 1, "wavepipe_run {}"), schema=schema)
    dt = DeltaTable(str(table))
    assert (dt.version(), dt.transaction_version("wavepipe:g:t")) == (0, 1)
    assert sorted(dt.to_pyarrow_table(columns=["waveform_id"]).column(0).to_pylist()) == ["a", "b"]
    assert dt.history(1)[0]["userMetadata"] == "wavepipe_run {}"
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    assert adds["partition.date"] == ["2026-01-01"] and adds["min.waveform_id"] == ["a"]

    # a twin: it found the table without its transaction, then another commit of it landed
    stale = DeltaTable(str(table))
    second = _write_files(table, "wavepipe-append-2", _rows(["c"], [base]))
    commit_files(str(table), second, ["date"], Txn("wavepipe:g:t", 2, "wavepipe_run {}"), table=DeltaTable(str(table)))
    twin = _write_files(table, "wavepipe-append-3", _rows(["c"], [base]))
    with pytest.raises(CommitFailedError):
        commit_files(str(table), twin, ["date"], Txn("wavepipe:g:t", 2, "wavepipe_run {}"), table=stale)
    dt = DeltaTable(str(table))
    assert (dt.version(), dt.transaction_version("wavepipe:g:t")) == (1, 2)
    assert sorted(dt.to_pyarrow_table(columns=["waveform_id"]).column(0).to_pylist()) == ["a", "b", "c"]
    # one day's files in two appends' folders are one partition to compact
    state = delta_log(table)
    assert files_per_partition(state) == {"date=2026-01-01": 2}
    assert compaction_plan(state) == (["date=2026-01-01"], [])


def test_files_that_do_not_fit_the_table_are_refused_before_the_commit(tmp_path):
    base = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1e6)
    table = tmp_path / "t"
    schema = SCHEMA.append(pa.field("date", pa.string(), False))
    commit_files(
        str(table), _write_files(table, "wavepipe-append-1", _rows(["a"], [base])), ["date"], None, schema=schema
    )
    other = _rows(["b"], [base]).append_column("extra", pa.array([1]))
    with pytest.raises(ValueError, match=r"columns it lacks: \['extra'\].*nothing was committed"):
        commit_files(
            str(table), _write_files(table, "wavepipe-append-2", other), ["date"], None, table=DeltaTable(str(table))
        )
    assert DeltaTable(str(table)).version() == 0
