"""A Delta table's row count read from its log's own statistics, without Spark (``delta_row_count``)."""

import json

from wavepipe.spark_apps.tables import delta_row_count


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
