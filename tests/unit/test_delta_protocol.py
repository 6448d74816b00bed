"""The Delta protocol's types, and the metadata-only repair of a table whose log holds others
(tables written by delta-rs, then given the log an earlier wavepipe wrote)."""

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.unit.test_maintenance import legacy_log
from wavepipe import delta_protocol
from wavepipe.delta_protocol import RepairError, fixed_schema, repair_schema, schema_problems, type_errors


def _schema(*fields):
    return {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields]}


def test_only_the_protocols_types_pass():
    nested = {"type": "array", "elementType": {"type": "map", "keyType": "string", "valueType": "decimal(10, 2)"}}
    good = _schema(*[(t, t) for t in sorted(delta_protocol.PRIMITIVE_TYPES)], ("n", nested), ("d", "decimal(38,0)"))
    assert type_errors(good) == []
    collated = {"type": "array", "elementType": "string collate UTF8_BINARY", "containsNull": True}
    bad = _schema(("id", "string collate UTF8_BINARY"), ("tags", collated), ("t", "timestamp_ntz"), ("x", "varchar(3)"))
    assert type_errors(bad) == [
        "id: 'string collate UTF8_BINARY'",
        "tags[]: 'string collate UTF8_BINARY'",
        "t: 'timestamp_ntz'",
        "x: 'varchar(3)'",
    ]
    assert type_errors(bad, {"timestampNtz"})[2:] == ["x: 'varchar(3)'"]  # valid with its table feature
    assert type_errors({"type": "union"}) == ['<schema>: {"type": "union"}']


def test_only_the_binary_collation_is_dropped():
    schema = _schema(("a", "string collate UTF8_BINARY"), ("b", "string COLLATE spark.UTF8_BINARY"))
    schema["fields"].append({"name": "c", "type": "string collate UNICODE_CI", "nullable": True, "metadata": {}})
    fixed = fixed_schema(schema)
    assert [f["type"] for f in fixed["fields"]] == ["string", "string", "string collate UNICODE_CI"]
    assert fixed["fields"][0]["metadata"] == {} and schema["fields"][0]["type"] == "string collate UTF8_BINARY"


def _legacy(tmp_path, versions: int = 2):
    table = tmp_path / "t"
    for i in range(versions):
        write_deltalake(str(table), pa.table({"id": [f"w{i}"], "n": [i]}), mode="append")
    legacy_log(table)
    return table


def test_a_legacy_table_is_repaired_by_one_metadata_commit(tmp_path):
    table = _legacy(tmp_path)
    with pytest.raises(Exception, match="Unsupported Delta table type"):
        DeltaTable(str(table))
    files = sorted(p.name for p in table.glob("*.parquet"))
    assert repair_schema(table, dry_run=True) == {
        "version_before": 1,
        "columns": ["id: 'string collate UTF8_BINARY'"],
        "dry_run": True,
    }
    assert not (table / "_delta_log" / f"{2:020d}.json").exists()
    done = repair_schema(table)
    assert done["version"] == 2 and schema_problems(table) == []
    repaired = DeltaTable(str(table))
    assert sorted(repaired.to_pyarrow_table().column("id").to_pylist()) == ["w0", "w1"]
    assert sorted(p.name for p in table.glob("*.parquet")) == files, "no data file written"
    assert repaired.history(1)[0]["operation"] == "REPAIR SCHEMA"
    assert repair_schema(table) is None  # nothing left to do
    write_deltalake(str(table), pa.table({"id": ["w2"], "n": [2]}), mode="append")  # writers go on
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 3


def test_the_metadata_is_read_from_a_checkpoint_when_older_commits_are_gone(tmp_path):
    table = tmp_path / "t"
    for i in range(3):
        write_deltalake(str(table), pa.table({"id": [f"w{i}"]}), mode="append")
    DeltaTable(str(table)).create_checkpoint()
    write_deltalake(str(table), pa.table({"id": ["w3"]}), mode="append")
    for v in (0, 1):  # log retention cleaned them up
        (table / "_delta_log" / f"{v:020d}.json").unlink()
    version, meta, protocol = delta_protocol.latest_metadata(table)
    assert (version, meta["id"], protocol["minReaderVersion"]) == (3, DeltaTable(str(table)).metadata().id, 1)
    (table / "_delta_log" / f"{2:020d}.checkpoint.parquet").unlink()
    with pytest.raises(RepairError, match="missing"):
        delta_protocol.latest_metadata(table)


def test_a_repair_never_overwrites_a_commit_and_refuses_what_it_did_not_write(tmp_path):
    table = _legacy(tmp_path)
    log = table / "_delta_log"
    taken = log / f"{2:020d}.json"
    taken.write_text(json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n")  # another writer got there first
    assert not delta_protocol._commit_next(log, 2, [{"commitInfo": {}}])
    assert json.loads(taken.read_text()) == {"commitInfo": {"operation": "WRITE"}}
    assert [p.name for p in log.iterdir() if p.name.endswith(".tmp")] == []
    assert repair_schema(table)["version"] == 3  # read again, committed after it
    # what a repair killed before its link leaves behind is no commit to any reader
    (log / f".{4:020d}.json.dead.tmp").write_text(json.dumps({"metaData": {"schemaString": "{}"}}) + "\n")
    assert delta_protocol.latest_metadata(table)[0] == 3 and DeltaTable(str(table)).version() == 3
    other = _legacy(tmp_path / "other")
    first = other / "_delta_log" / f"{0:020d}.json"
    first.write_text(first.read_text().replace("UTF8_BINARY", "UNICODE_CI"))
    with pytest.raises(RepairError, match="cannot repair"):
        repair_schema(other)
    with pytest.raises(RepairError, match="not a Delta table"):
        repair_schema(tmp_path / "nothing")


def test_a_repair_that_loses_the_next_version_reads_the_table_again_and_gives_up_after_its_attempts(
    tmp_path, monkeypatch
):
    table = _legacy(tmp_path)
    commit, tries = delta_protocol._commit_next, []

    def another_writer_first(log_dir, version, actions):
        tries.append(version)
        if len(tries) == 1:  # another writer takes the version: the next attempt reads it
            assert commit(log_dir, version, [{"commitInfo": {"operation": "WRITE", "timestamp": 1}}])
            return False
        return commit(log_dir, version, actions)

    monkeypatch.setattr(delta_protocol, "_commit_next", another_writer_first)
    assert repair_schema(table)["version"] == 3 and tries == [2, 3]
    assert DeltaTable(str(table)).version() == 3 and DeltaTable(str(table)).to_pyarrow_table().num_rows == 2

    other = _legacy(tmp_path / "busy")
    monkeypatch.setattr(delta_protocol, "_commit_next", lambda *a: False)
    with pytest.raises(RepairError, match="other writers kept committing"):
        repair_schema(other, attempts=2)
