"""The pure reassembly transformations on a real local Spark session."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.helpers import chunk_rows, waveform_records
from wavepipe.consumers.staging import CHUNK_SCHEMA
from wavepipe.spark_apps.reassemble import assemble

pytestmark = pytest.mark.integration


def _frame(spark, rows):
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA))


def test_assemble_orders_by_sequence_and_verifies(spark):
    records, expected = waveform_records("w", 4, seed=9)
    shuffled = [records[2], records[0], records[3], records[1], records[0]]  # out of order, one duplicate
    rows = chunk_rows(shuffled, first_offset=100)
    out = assemble(_frame(spark, rows), spark.createDataFrame([("w",)], "waveform_id string")).collect()
    assert len(out) == 1
    row = out[0]
    assert row["checksum_ok"] and row["checksum"] == expected
    assert (row["n_chunks"], row["first_offset"], row["last_offset"]) == (4, 100, 104)
    assert bytes(row["payload"]) == b"".join(v for _, _, v in records)


def test_a_publish_append_commits_once_per_transaction_id(spark, tmp_path):
    """Two appends of the same rows that both passed the key check (a killed client's write still
    running on the engine beside its retry): with one transaction (the group's id, the run's
    version), one of them commits; the next run's version commits, and the table's log holds the
    run's metadata and one transaction entry for the group."""
    import deltalake

    from wavepipe import delta_txn
    from wavepipe.delta_txn import Txn
    from wavepipe.spark_apps.tables import append_new, delta_version, read_delta

    app = delta_txn.app_id("g", "t")
    path = tmp_path / "table"
    rows = spark.createDataFrame([("a",), ("b",)], "waveform_id string")
    append_new(rows, path, ["waveform_id"], txn=Txn(app, 7, "wavepipe_run {}"))
    version = delta_version(path)
    # the twin: checked against the version before the first append landed (no key check now)
    append_new(rows, path, ["waveform_id"], checked_version=version, txn=Txn(app, 7, "wavepipe_run {}"))
    assert delta_version(path) == version, "the second append of the same transaction committed"
    assert sorted(r[0] for r in read_delta(spark, path).collect()) == ["a", "b"]
    # the group's next run (its version grows) is appended as usual, its metadata in the commit
    append_new(
        spark.createDataFrame([("c",)], "waveform_id string"),
        path,
        ["waveform_id"],
        checked_version=version,
        txn=Txn(app, 8, 'wavepipe_run {"next": true}'),
    )
    table = deltalake.DeltaTable(str(path))
    assert table.transaction_version(app) == 8
    assert table.history(1)[0]["userMetadata"] == 'wavepipe_run {"next": true}'
    assert sorted(r[0] for r in read_delta(spark, path).collect()) == ["a", "b", "c"]


def test_an_append_compares_its_keys_only_where_its_scope_says(spark, tmp_path):
    """``scope`` bounds the key check to the rows a run could collide with (its ids, or its
    offsets): keys there are not appended twice. Spark appends payload tables (``append_new``),
    delta-rs the small ones (``append_rows``), which also skips a transaction version the table
    holds and records the run's metadata; Spark reads back what delta-rs wrote."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from wavepipe.delta_txn import Txn
    from wavepipe.spark_apps.tables import append_new, append_rows, read_delta

    keys = ["waveform_id", "reason"]
    schema = "waveform_id string, reason string, partition int, offset long"
    first = [("a", "incomplete", 0, 1), ("b", "too_large", 0, 5)]
    again = [("a", "incomplete", 0, 1), ("a", "size_mismatch", 0, 1), ("c", "x", 0, 9)]
    expected = [("a", "incomplete"), ("a", "size_mismatch"), ("b", "too_large"), ("c", "x")]
    by_spark = tmp_path / "by_spark"
    append_new(spark.createDataFrame(first, schema), by_spark, keys)
    append_new(spark.createDataFrame(again, schema), by_spark, keys, scope=["a", "c"])
    assert sorted(tuple(r)[:2] for r in read_delta(spark, by_spark).collect()) == expected

    def arrow(rows):
        names = ["waveform_id", "reason", "partition", "offset"]
        types = [pa.string(), pa.string(), pa.int32(), pa.int64()]
        return pa.table([pa.array(c, t) for c, t in zip(zip(*rows, strict=True), types, strict=True)], names=names)

    by_ids = tmp_path / "by_ids"
    append_rows(arrow(first), by_ids, keys, Txn("app", 1, "run 1"), ["a", "b"])
    append_rows(arrow(again), by_ids, keys, Txn("app", 2, "run 2"), ["a", "c"])
    append_rows(arrow([("d", "x", 0, 11)]), by_ids, keys, Txn("app", 2, "run 2 again"), ["d"])  # held: skipped
    assert sorted(tuple(r)[:2] for r in read_delta(spark, by_ids).collect()) == expected
    table = DeltaTable(str(by_ids))
    assert table.transaction_version("app") == 2 and table.history(1)[0]["userMetadata"] == "run 2"

    dead = tmp_path / "dead"
    offsets = ["topic", "partition", "offset"]
    rows = pa.table({"topic": ["t", "t"], "partition": pa.array([0, 0], pa.int32()), "offset": [1, 5]})
    append_rows(rows, dead, offsets, Txn("app", 1, ""), ("t", {0: (0, 10)}))
    more = pa.table({"topic": ["t"] * 3, "partition": pa.array([0, 0, 0], pa.int32()), "offset": [1, 5, 9]})
    append_rows(more, dead, offsets, Txn("app", 2, ""), ("t", {0: (0, 10)}))
    assert sorted(r["offset"] for r in read_delta(spark, dead).collect()) == [1, 5, 9]
