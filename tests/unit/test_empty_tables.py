"""A group's first publish makes every published table, empty with its schema (delta-rs)."""

from __future__ import annotations

import deltalake
import pyarrow as pa

from wavepipe.contracts.config import load_settings
from wavepipe.maintenance import table_paths
from wavepipe.spark_apps.publish import EMPTY_TABLES, ensure_tables
from wavepipe.spark_apps.tables import TABLE_KEYS, append_rows, ensure_table


def test_every_published_table_is_made_empty_once_with_its_schema_and_layout(tmp_path):
    settings = load_settings(home=tmp_path)
    targets = table_paths(settings)
    ensure_tables(settings, targets)
    for name, schema in EMPTY_TABLES.items():
        table = deltalake.DeltaTable(targets[name])
        assert table.version() == 0 and table.to_pyarrow_table().num_rows == 0, name
        assert table.schema().to_arrow().names == schema.names, name
        layout = TABLE_KEYS[name][1] if name in TABLE_KEYS else None
        assert table.metadata().partition_columns == (layout or []), name
    assert not ensure_table(targets["quarantine"], EMPTY_TABLES["quarantine"], None)  # there: left as it is
    assert deltalake.DeltaTable(targets["quarantine"]).version() == 0


def test_rows_reach_a_table_made_empty_as_they_reach_one_they_make(tmp_path):
    from wavepipe.delta_txn import Txn

    settings = load_settings(home=tmp_path, quality_metrics=False)
    targets = table_paths(settings)
    ensure_tables(settings, targets)
    assert not (tmp_path / "tables" / "qc").exists()  # kept only while quality is measured
    schema = EMPTY_TABLES["dead_letter"]
    row = {name: [None] for name in schema.names} | {"topic": ["t"], "partition": [0], "offset": [7]}
    append_rows(
        pa.table(row, schema=schema),
        targets["dead_letter"],
        ["topic", "partition", "offset"],
        Txn("app", 1, "{}"),
        ("t", {0: (0, 10)}),
    )
    table = deltalake.DeltaTable(targets["dead_letter"])
    assert table.version() == 1 and table.to_pyarrow_table().column("offset").to_pylist() == [7]


def test_a_vacuum_of_tables_with_nothing_outside_their_version_starts_no_spark_job(tmp_path):
    """The empty tables a first publish makes cost maintenance nothing: no Spark session is
    asked for (none runs here), each is skipped with the reason."""
    from wavepipe import maintenance

    settings = load_settings(home=tmp_path)
    ensure_tables(settings, table_paths(settings))
    done = maintenance.vacuum(settings, retention_hours=0)
    assert [d["table"] for d in done] == list(maintenance.TABLES)
    assert all("nothing to delete" in d["skipped"] for d in done), done
