"""A Delta table's files, rows and ids read from its log by delta-rs, without Spark (``delta_log``).
The tables here are written by delta-rs itself, an independent writer."""

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from wavepipe.spark_apps.tables import delta_log, delta_row_count


def test_live_files_are_counted_after_appends_overwrites_and_compaction(tmp_path):
    table = str(tmp_path / "t")
    write_deltalake(
        table, pa.table({"waveform_id": ["a", "b", "c"], "date": ["d1", "d1", "d2"]}), partition_by=["date"]
    )
    assert delta_row_count(tmp_path / "t") == 3
    write_deltalake(table, pa.table({"waveform_id": ["d"], "date": ["d2"]}), mode="append")
    state = delta_log(tmp_path / "t")
    assert (state.version, state.rows, len(state.files), state.partition_columns) == (1, 4, 3, ["date"])
    DeltaTable(table).optimize.compact()
    DeltaTable(table).create_checkpoint()  # the state is then read from the checkpoint onwards
    write_deltalake(table, pa.table({"waveform_id": ["e"], "date": ["d1"]}), mode="append")
    state = delta_log(tmp_path / "t", history=True)
    assert (state.version, state.rows, len(state.files)) == (3, 5, 3)
    assert set(state.last) == {"WRITE", "OPTIMIZE"} and state.last["WRITE"] >= state.last["OPTIMIZE"]
    write_deltalake(table, pa.table({"waveform_id": ["z"], "date": ["d9"]}), mode="overwrite")
    assert delta_row_count(tmp_path / "t") == 1


def test_the_log_says_nothing_when_it_cannot_be_read(tmp_path):
    assert delta_row_count(tmp_path / "none") is None  # no table
    broken = tmp_path / "broken" / "_delta_log"
    broken.mkdir(parents=True)
    (broken / f"{0:020d}.json").write_text('{"add": {"path": "a.parquet"}}\n')  # no protocol, no metadata
    assert delta_log(tmp_path / "broken") is None


def test_a_commits_metric_is_read_from_its_commit_info(tmp_path):
    """delta-rs, another writer, records a DELETE's removed rows as Spark's Delta does."""
    from wavepipe.spark_apps.tables import commit_metric

    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"waveform_id": ["a", "b", "c"], "first_offset": [0, 5, 9]}))
    DeltaTable(table).delete("first_offset < 6")
    assert commit_metric(tmp_path / "t", 1, "num_deleted_rows") == 2
    assert commit_metric(tmp_path / "t", 0, "numDeletedRows") is None  # an append says nothing of it
