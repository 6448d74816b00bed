"""A publish whose commit meets another writer's is tried again, a few times; other failures are
not retried (spark_apps/tables.py). ``append_rows`` decides again (it writes nothing before its
commit); ``append_new`` commits the files it already wrote again, as kafka-delta-ingest retries
its commits, unless the table now holds the run's transaction or some of the files' keys.

The ``append_new`` cases run on real Delta tables (delta-rs in a tmp dir): the engine's write is
a pyarrow write of the same layout, and another writer commits between the write and the commit
(at ``publish.before_commit``). The case that writes again (keys collide) needs Spark to decide
again: tests/integration/test_commit_retry.py."""

from __future__ import annotations

import json
import logging
import urllib.parse
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql import types as T

from tests.helpers import commit_meanwhile
from wavepipe.delta_txn import Txn
from wavepipe.spark_apps import tables
from wavepipe.spark_apps.tables import COMMIT_TRIES, append_new, decided_again_on_conflict
from wavepipe.storage import is_commit_conflict


def _publish(failures: list[BaseException]):
    calls = []

    @decided_again_on_conflict
    def publish(data, path, *, txn=None):
        calls.append((data, path, txn))
        if failures:
            raise failures.pop(0)

    return publish, calls


def test_a_commit_that_met_another_writers_is_decided_again_with_the_same_arguments():
    publish, calls = _publish([CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")])
    publish("rows", "s3://lake/t", txn="wavepipe:g:t@7")
    assert calls == [("rows", "s3://lake/t", "wavepipe:g:t@7")] * 2


def test_a_table_created_meanwhile_is_a_conflict_and_other_failures_are_not():
    assert is_commit_conflict(DeltaError("Generic error: A Delta Lake table already exists at that location."))
    assert not is_commit_conflict(DeltaError("Generic S3 error: 403 Forbidden"))
    assert not is_commit_conflict(RuntimeError("Failed to commit transaction: already exists"))
    publish, calls = _publish([DeltaError("Generic S3 error: 403 Forbidden")])
    with pytest.raises(DeltaError, match="403"):
        publish("rows", "s3://lake/t")
    assert len(calls) == 1


def test_it_gives_up_after_its_tries():
    publish, calls = _publish([CommitFailedError("conflict")] * (COMMIT_TRIES + 1))
    with pytest.raises(CommitFailedError):
        publish("rows", "/tmp/t")
    assert len(calls) == COMMIT_TRIES


# --- append_new on real Delta tables --------------------------------------------------------

APP = "wavepipe:g:t"
DAY = "2026-01-01"
SPARK_SCHEMA = T.StructType(
    [
        T.StructField("waveform_id", T.StringType(), False),
        T.StructField("n", T.LongType(), False),
        T.StructField("date", T.StringType(), False),
    ]
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("waveform_id", pa.string(), False),
        pa.field("n", pa.int64(), False),
        pa.field("date", pa.string(), False),
    ]
)


class _Frame:
    """What ``append_new`` reads of a DataFrame when it need not ask Spark (its schema), and the
    rows the stand-in for the engine's write (``writes``) writes."""

    schema = SPARK_SCHEMA

    def __init__(self, ids: list[str]):
        self.rows = _rows(ids)


def _rows(ids: list[str]) -> pa.Table:
    return pa.table({"waveform_id": ids, "n": list(range(len(ids))), "date": [DAY] * len(ids)}, schema=ARROW_SCHEMA)


@pytest.fixture
def writes(monkeypatch) -> list[str]:
    """``tables.write_files`` as the engine lays the files out (a new folder of the table, Hive
    folders by partition column, no partition column in the files), by pyarrow: the folders it
    wrote, one per call."""
    folders: list[str] = []

    def write_files(df, path, partition_by):
        folder = f"{tables.FILES_FOLDER}{len(folders)}"
        fields = [(c, pa.string()) for c in partition_by or []]
        layout = pads.partitioning(pa.schema(fields), flavor="hive") if fields else None
        pads.write_dataset(df.rows, Path(path) / folder, format="parquet", partitioning=layout)
        folders.append(folder)
        return folder

    monkeypatch.setattr(tables, "write_files", write_files)
    return folders


def _other_writer(path: Path, ids: list[str], txn: tuple[str, int] | None) -> None:
    properties = CommitProperties(app_transactions=[Transaction(*txn)]) if txn else None
    write_deltalake(str(path), _rows(ids), mode="append", partition_by=["date"], commit_properties=properties)


def _ids(path: Path) -> list[str]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["waveform_id"]).column(0).to_pylist())


def _added(path: Path, version: int) -> set[str]:
    """The paths of the data files commit ``version`` of table ``path`` added."""
    log = (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return {urllib.parse.unquote(json.loads(line)["add"]["path"]) for line in log if '"add"' in line}


def _files(path: Path, folder: str) -> set[str]:
    return {p.relative_to(path).as_posix() for p in (path / folder).rglob("*.parquet")}


@pytest.mark.parametrize(
    "meanwhile",
    ["an older run of the group committed late", "another writer created the table"],
)
def test_a_commit_that_lost_commits_the_same_files_again_without_writing_them_again(
    tmp_path, monkeypatch, writes, caplog, meanwhile
):
    """The other writer's commit refuses this one (the group's transaction id in it: delta-rs's
    "Concurrent transaction"; or the table's creation: "already exists"); it holds none of the
    run's keys, so the files written are committed as they are against the new version: one
    write, no second Spark job."""
    path = tmp_path / "waveforms"
    if meanwhile.startswith("an older run"):
        _other_writer(path, ["a"], (APP, 5))
        checked = DeltaTable(str(path)).version()
        commit_meanwhile(monkeypatch, lambda: _other_writer(path, ["b"], (APP, 6)))
    else:
        checked = None
        commit_meanwhile(monkeypatch, lambda: _other_writer(path, ["a", "b"], None))
    with caplog.at_level(logging.INFO, logger="wavepipe.tables"):
        append_new(_Frame(["c", "d"]), path, ["waveform_id"], ["date"], checked, Txn(APP, 7, "run 7"), ["c", "d"])
    assert len(writes) == 1, "the rows were written again"
    table = DeltaTable(str(path))
    assert _added(path, table.version()) == _files(path, writes[0]) != set()
    assert table.transaction_version(APP) == 7 and table.history(1)[0]["userMetadata"] == "run 7"
    assert _ids(path) == ["a", "b", "c", "d"]
    assert "another writer committed first" in caplog.text
    assert "committing the files already written" in caplog.text


def test_a_twin_that_committed_the_transaction_leaves_the_files_in_no_version(tmp_path, monkeypatch, writes, caplog):
    """Another attempt of the same run (its transaction: the group's id and the run's version)
    committed the same rows first: nothing more is committed; the files this attempt wrote are
    in no version, left to ``wavepipe table vacuum``."""
    path = tmp_path / "waveforms"
    _other_writer(path, ["a"], (APP, 6))
    checked = DeltaTable(str(path)).version()
    commit_meanwhile(monkeypatch, lambda: _other_writer(path, ["b", "c"], (APP, 7)))
    with caplog.at_level(logging.INFO, logger="wavepipe.tables"):
        append_new(_Frame(["b", "c"]), path, ["waveform_id"], ["date"], checked, Txn(APP, 7, "run 7"), ["b", "c"])
    table = DeltaTable(str(path))
    assert len(writes) == 1 and table.version() == checked + 1, "a commit after the twin's"
    assert _ids(path) == ["a", "b", "c"]
    assert not _files(path, writes[0]) & set(table.file_uris()), "this attempt's files are part of the table"
    assert _files(path, writes[0]), "the files were not written"
    assert "in no version" in caplog.text and "wavepipe table vacuum" in caplog.text


def test_a_commit_that_keeps_losing_is_tried_commit_tries_times_with_the_same_files(tmp_path, monkeypatch, writes):
    """Each try meets another commit of the group's id (an older run's): ``COMMIT_TRIES`` commits
    of the one write, then the conflict is raised; nothing of this run is in the table."""
    path = tmp_path / "waveforms"
    _other_writer(path, ["a"], (APP, 1))
    checked = DeltaTable(str(path)).version()
    real_commit, commits = tables.commit_files, []

    def commit_files(path_, folder, *args, **kwargs):
        commits.append(folder)
        _other_writer(path, [f"x{len(commits)}"], (APP, 1 + len(commits)))  # just before this one's
        real_commit(path_, folder, *args, **kwargs)

    monkeypatch.setattr(tables, "commit_files", commit_files)
    with pytest.raises(CommitFailedError):
        append_new(_Frame(["c"]), path, ["waveform_id"], ["date"], checked, Txn(APP, 9, "run 9"), ["c"])
    assert commits == writes * COMMIT_TRIES and len(writes) == 1
    assert "c" not in _ids(path)


def test_an_error_that_is_not_a_conflict_is_not_tried_again(tmp_path, monkeypatch, writes):
    path = tmp_path / "waveforms"
    _other_writer(path, ["a"], (APP, 1))
    commit_meanwhile(monkeypatch, lambda: _other_writer(path, ["b"], (APP, 2)))  # a conflict, then...

    def refused(*args, **kwargs):
        raise OSError("Generic LocalFileSystem error: permission denied")

    monkeypatch.setattr(tables, "_written_keys", refused)  # ...the retry cannot read the files
    with pytest.raises(OSError, match="permission denied"):
        append_new(_Frame(["c"]), path, ["waveform_id"], ["date"], 0, Txn(APP, 3, "run 3"), ["c"])
    assert len(writes) == 1 and _ids(path) == ["a", "b"]
