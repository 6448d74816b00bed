"""A publish's commit that meets another writer's, on the real Spark engine (``tables.append_new``):
the files the engine wrote are committed again, no second write; only when the other writer
committed some of the same keys are the rows decided again and written anew. (The twin that
committed the run's transaction, and the tries' limit: tests/unit/test_commit_conflicts.py.)"""

from __future__ import annotations

import json
import logging
import urllib.parse

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from tests.helpers import commit_meanwhile
from wavepipe.delta_txn import Txn
from wavepipe.spark_apps import tables
from wavepipe.spark_apps.tables import append_new, read_delta

pytestmark = pytest.mark.integration

APP = "wavepipe:g:t"
DAY = "2026-01-01"
SCHEMA = "waveform_id string, n long, date string"


@pytest.fixture
def writes(monkeypatch) -> list[str]:
    """The folders the engine's writes (``tables.write_files``, the real one) made, one a write."""
    real, folders = tables.write_files, []

    def write_files(df, path, partition_by):
        folders.append(real(df, path, partition_by))
        return folders[-1]

    monkeypatch.setattr(tables, "write_files", write_files)
    return folders


def _older_run(path, ids: list[str], version: int) -> None:
    """An older run of the group (its transaction id, a lower version) committing ``ids`` late."""
    rows = pa.table({"waveform_id": ids, "n": [0] * len(ids), "date": [DAY] * len(ids)})
    write_deltalake(
        str(path),
        rows,
        mode="append",
        partition_by=["date"],
        commit_properties=CommitProperties(app_transactions=[Transaction(APP, version)]),
    )


def _frame(spark, ids: list[str]):
    return spark.createDataFrame([(i, n, DAY) for n, i in enumerate(ids)], SCHEMA)


def _ids(spark, path) -> list[str]:
    return sorted(r[0] for r in read_delta(spark, path).select("waveform_id").collect())


def _append_while_an_older_run_commits(spark, path, monkeypatch, caplog, ids: list[str]) -> None:
    """Run 7 appends ``ids`` to a table of ``a`` (run 5), checked at that version; between its
    write and its commit, run 6 commits ``b`` late."""
    _older_run(path, ["a"], 5)
    checked = DeltaTable(str(path)).version()
    commit_meanwhile(monkeypatch, lambda: _older_run(path, ["b"], 6))
    with caplog.at_level(logging.INFO, logger="wavepipe.tables"):
        append_new(_frame(spark, ids), path, ["waveform_id"], ["date"], checked, Txn(APP, 7, "run 7"), ids)


def test_the_engines_files_are_committed_again_not_written_again(spark, tmp_path, monkeypatch, writes, caplog):
    path = tmp_path / "waveforms"
    _append_while_an_older_run_commits(spark, path, monkeypatch, caplog, ["c", "d"])
    assert len(writes) == 1, "the engine wrote the rows again"
    table = DeltaTable(str(path))
    log = (path / "_delta_log" / f"{table.version():020d}.json").read_text().splitlines()
    added = {urllib.parse.unquote(json.loads(line)["add"]["path"]) for line in log if '"add"' in line}
    written = {p.relative_to(path).as_posix() for p in (path / writes[0]).rglob("*.parquet")}
    assert added == written != set()
    assert table.transaction_version(APP) == 7
    assert _ids(spark, path) == ["a", "b", "c", "d"]
    assert "committing the files already written" in caplog.text


def test_keys_another_writer_committed_meanwhile_are_decided_again(spark, tmp_path, monkeypatch, writes, caplog):
    """The older run committed ``b`` too: the files written cannot be committed as they are, so
    the rows are decided again from the table (one more write, of ``c`` only); each key once."""
    path = tmp_path / "waveforms"
    _append_while_an_older_run_commits(spark, path, monkeypatch, caplog, ["b", "c"])
    assert len(writes) == 2
    assert _ids(spark, path) == ["a", "b", "c"]
    assert DeltaTable(str(path)).transaction_version(APP) == 7
    assert "cannot be committed again: 1 of their rows have keys the table holds now (e.g. b)" in caplog.text


def _worker_writes(spark, tmp_path, ids: list[str], run_id: str):
    """A publish's waveforms as the workers write them (``tables.WorkerWrites``, the real
    ``written_by_workers`` on the engine), from waveforms ``ids`` staged in one file; counts its
    writes in ``.writes``."""
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from tests.helpers import chunk_rows, waveform_records
    from wavepipe.consumers.staging import CHUNK_SCHEMA
    from wavepipe.spark_apps.assembly import PUBLISHED_SCHEMA, assemble_file
    from wavepipe.spark_apps.reassemble import written_by_workers

    staged = tmp_path / f"{run_id}.parquet"
    records = [r for i in ids for r in waveform_records(i, 3, seed=len(i) + ord(i[0]))[0]]
    pq.write_table(pa.Table.from_pylist(chunk_rows(records), schema=CHUNK_SCHEMA), staged)
    rows = pa.Table.from_batches(list(assemble_file(str(staged), set(ids), strict=True)))
    frame = spark.createDataFrame(rows.to_pandas())

    def files(target, skip: set[str]):
        source.writes += 1
        return written_by_workers(frame.where(~F.col("waveform_id").isin(sorted(skip))), target)

    source = tables.WorkerWrites(PUBLISHED_SCHEMA, run_id, files)
    source.writes = 0
    return source, {r["waveform_id"]: r["payload"] for r in rows.to_pylist()}


@pytest.mark.parametrize(("mine", "writes_expected"), [(["c", "d"], 1), (["b", "c"], 2)])
def test_the_workers_files_are_committed_again_or_decided_again_without_the_keys_there(
    spark, tmp_path, monkeypatch, caplog, mine, writes_expected
):
    """The publish's own path (the workers write the files): run 6 of the group commits ``b``
    between run 7's write and its commit. Without a shared key the same files are committed
    (no second write); with ``b`` among them, the rows are written again without it. delta-rs
    reads every waveform back once, its bytes as written."""
    path = tmp_path / "waveforms"
    first, payloads = _worker_writes(spark, tmp_path, ["a"], "run-5")
    append_new(first, path, ["waveform_id"], ["date"], None, Txn(APP, 5, "run 5"), ["a"])
    late, late_payloads = _worker_writes(spark, tmp_path, ["b"], "run-6")
    source, mine_payloads = _worker_writes(spark, tmp_path, mine, "run-7")
    checked = DeltaTable(str(path)).version()
    commit_meanwhile(
        monkeypatch, lambda: append_new(late, path, ["waveform_id"], ["date"], None, Txn(APP, 6, "run 6"), ["b"])
    )
    with caplog.at_level(logging.INFO, logger="wavepipe.tables"):
        append_new(source, path, ["waveform_id"], ["date"], checked, Txn(APP, 7, "run 7"), mine)
    assert source.writes == writes_expected
    said = "committing the files already written" if writes_expected == 1 else "cannot be committed again"
    assert said in caplog.text, caplog.text  # the commit met run 6's, in both cases
    table = DeltaTable(str(path))
    assert table.transaction_version(APP) == 7
    read = table.to_pyarrow_table(columns=["waveform_id", "payload", "run_id"]).to_pylist()
    assert sorted(r["waveform_id"] for r in read) == sorted({"a", "b", *mine})
    expected = {**payloads, **late_payloads, **mine_payloads}
    assert all(r["payload"] == expected[r["waveform_id"]] for r in read)
    assert {r["waveform_id"]: r["run_id"] for r in read}["b"] == "run-6"
