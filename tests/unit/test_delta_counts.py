"""A Delta table's row count read from its log's own statistics, without Spark (``delta_row_count``)."""

import json

from wavepipe.spark_apps.tables import delta_log, delta_row_count


def _commit(table, version, *actions):
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _add(path, rows):
    return {"add": {"path": path, "stats": json.dumps({"numRecords": rows, "minValues": {}})}}


def test_live_files_are_counted_after_overwrites_and_deletes(tmp_path):
    table = tmp_path / "t"
    _commit(table, 0, {"protocol": {}}, {"metaData": {}}, _add("a.parquet", 3), _add("b.parquet", 4))
    assert delta_row_count(table) == 7
    _commit(table, 1, {"remove": {"path": "a.parquet"}}, _add("c.parquet", 10))
    assert delta_row_count(table) == 14
    _commit(table, 2, {"commitInfo": {}})
    assert delta_row_count(table) == 14
    # a checkpoint beside a complete log changes nothing: every commit is still replayed
    (table / "_delta_log" / f"{2:020d}.checkpoint.parquet").write_bytes(b"not read")
    assert delta_row_count(table) == 14


def test_the_log_says_nothing_when_it_cannot_be_sure(tmp_path):
    assert delta_row_count(tmp_path / "none") is None  # no table
    no_stats = tmp_path / "no_stats"
    _commit(no_stats, 0, {"add": {"path": "a.parquet"}})
    assert delta_row_count(no_stats) is None
    deleted = tmp_path / "deleted"  # a deletion vector: fewer rows than the file's numRecords
    _commit(deleted, 0, {"add": {**_add("a.parquet", 5)["add"], "deletionVector": {"cardinality": 2}}})
    assert delta_row_count(deleted) is None
    gap = tmp_path / "gap"  # commits cleaned up by log retention: the replay would be partial
    _commit(gap, 3, _add("a.parquet", 1))
    assert delta_row_count(gap) is None


def test_a_log_cleaned_up_past_its_checkpoint_is_read_from_the_checkpoint(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "t"
    log = table / "_delta_log"
    log.mkdir(parents=True)
    add = pa.struct([("path", pa.string()), ("size", pa.int64()), ("stats", pa.string())])
    remove = pa.struct([("path", pa.string()), ("size", pa.int64())])
    rows = [
        {"add": {"path": "a.parquet", "size": 10, "stats": json.dumps({"numRecords": 3})}, "remove": None},
        {"add": {"path": "b.parquet", "size": 20, "stats": json.dumps({"numRecords": 4})}, "remove": None},
        {"add": None, "remove": {"path": "old.parquet", "size": 5}},
    ]
    pq.write_table(
        pa.Table.from_pylist(rows, schema=pa.schema([("add", add), ("remove", remove)])),
        log / f"{10:020d}.checkpoint.parquet",
    )
    (log / "_last_checkpoint").write_text(json.dumps({"version": 10, "size": 3}))
    _commit(table, 10, {"commitInfo": {}})  # commits 0-9 cleaned up
    _commit(table, 11, {"remove": {"path": "a.parquet"}}, _add("c.parquet", 6))
    state = delta_log(table)
    assert state.version == 11 and sorted(state.files) == ["b.parquet", "c.parquet"] and state.rows == 10
    assert delta_row_count(table) == 10
    (log / "_last_checkpoint").write_text(json.dumps({"version": 10, "parts": 2}))  # multi-part: not read
    assert delta_log(table) is None


def test_a_runs_staged_ids_are_listed_only_while_the_list_is_short(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wavepipe.spark_apps import tables

    files = []
    for i, ids in enumerate((["b", "a", "b"], ["c", None, "a"])):
        files.append(tmp_path / f"{i}.parquet")
        pq.write_table(pa.table({"waveform_id": ids, "seq": list(range(3))}), files[-1])
    assert tables.staged_ids(files) == ["a", "b", "c"]  # distinct, sorted, no null
    assert tables.staged_ids([]) == []
    monkeypatch.setattr(tables, "ID_LIST_MAX", 2)
    assert tables.staged_ids(files) is None  # too many for a literal list: the join alone
    monkeypatch.setattr(tables, "ID_LIST_MAX", 2000)
    pq.write_table(pa.table({"seq": [1]}), tmp_path / "other.parquet")  # no ids to read
    assert tables.staged_ids([tmp_path / "other.parquet"]) is None
    assert tables.staged_ids([tmp_path / "missing.parquet"]) is None


def test_a_candidate_tables_ids_are_read_from_its_live_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wavepipe.spark_apps.tables import table_ids

    table = tmp_path / "manifest"
    (table / "x=a b").mkdir(parents=True)
    pq.write_table(pa.table({"waveform_id": ["w2", "w1"]}), table / "x=a b" / "live.parquet")
    pq.write_table(pa.table({"waveform_id": ["gone"]}), table / "old.parquet")
    _commit(table, 0, _add("old.parquet", 1))
    _commit(table, 1, {"remove": {"path": "old.parquet"}}, _add("x=a%20b/live.parquet", 2))
    assert table_ids(table) == ["w1", "w2"]  # the live file only (its path URL-encoded in the log)
    assert table_ids(tmp_path / "none") is None
