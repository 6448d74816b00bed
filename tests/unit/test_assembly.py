"""The payload assembly (``spark_apps/assembly.py``): pure pyarrow, tested without Spark."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import START, chunk_rows, waveform_records
from wavepipe.consumers.staging import CHUNK_SCHEMA
from wavepipe.contracts.protocol import split_waveform
from wavepipe.contracts.rows import QUALITY_NAMES
from wavepipe.spark_apps.assembly import ARROW_OUTPUT_SCHEMA, STAGED_CHANGED, assemble_arrow, assemble_file


def test_the_assembly_imports_no_spark():
    """It runs in Spark's Python workers and in the run's process alike: it must not need Spark."""
    code = "import sys, wavepipe.spark_apps.assembly; print(sorted(m for m in sys.modules if 'pyspark' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_spark_output_schema_is_the_arrow_one():
    from wavepipe.spark_apps.reassemble import OUTPUT_SCHEMA
    from wavepipe.spark_apps.tables import arrow_schema

    assert arrow_schema(OUTPUT_SCHEMA).equals(ARROW_OUTPUT_SCHEMA)
    assert [f.name for f in OUTPUT_SCHEMA.fields if not f.nullable] == [
        f.name for f in ARROW_OUTPUT_SCHEMA if not f.nullable
    ]


def test_assemble_arrow_orders_by_sequence_and_skips_repeated_chunks():
    records, expected = waveform_records("w", 4, seed=9)
    shuffled = [records[2], records[0], records[3], records[1], records[0]]  # out of order, one repeated
    table = pa.Table.from_pylist(chunk_rows(shuffled, partition=2, first_offset=100), schema=CHUNK_SCHEMA)
    (row,) = assemble_arrow(table).to_pylist()
    assert row["checksum_ok"] and row["checksum"] == expected
    assert (row["n_chunks"], row["partition"], row["first_offset"], row["last_offset"]) == (4, 2, 100, 104)
    assert row["payload"] == b"".join(v for _, _, v in records)


def test_assemble_arrow_flags_a_corrupt_payload_without_spark():
    records, _ = waveform_records("w", 2, seed=3)
    rows = chunk_rows(records)
    rows[1]["payload"] = bytes(len(rows[1]["payload"]))
    out = assemble_arrow(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA)).to_pylist()[0]
    assert out["checksum_ok"] is False and out["payload"] is None


def test_assemble_file_streams_interleaved_waveforms_without_spark(tmp_path):
    """The shuffle-free path: waveforms interleaved in one staged file, only the wanted ones."""
    a, a_sum = waveform_records("a", 3, seed=1)
    b, b_sum = waveform_records("b", 2, seed=2)
    c, _ = waveform_records("c", 2, seed=3)
    order = [a[0], b[0], c[0], a[1], b[1], c[1], a[2]]
    rows = chunk_rows(order, partition=1, first_offset=10)
    rows[5]["payload"] = bytes(len(rows[5]["payload"]))  # c is corrupt but not wanted here
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA), path)
    out = {r["waveform_id"]: r for batch in assemble_file(str(path), {"a", "b"}) for r in batch.to_pylist()}
    assert set(out) == {"a", "b"}
    assert out["a"]["payload"] == b"".join(v for _, _, v in a) and out["a"]["checksum"] == a_sum
    assert out["b"]["payload"] == b"".join(v for _, _, v in b) and out["b"]["checksum"] == b_sum
    assert (out["a"]["partition"], out["a"]["first_offset"], out["a"]["last_offset"], out["a"]["n_chunks"]) == (
        1,
        10,
        16,
        3,
    )
    assert all(r["checksum_ok"] for r in out.values())
    # output_batch_bytes: a batch closes once it holds that many payload bytes (at least one waveform)
    assert [batch.num_rows for batch in assemble_file(str(path), {"a", "b"})] == [2]
    assert [batch.num_rows for batch in assemble_file(str(path), {"a", "b"}, batch_bytes=1)] == [1, 1]


def test_assemble_file_refuses_a_wanted_waveform_that_is_not_complete_in_the_file(tmp_path):
    a, _ = waveform_records("a", 3, seed=1)
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(chunk_rows(a[:2]), schema=CHUNK_SCHEMA), path)
    with pytest.raises(RuntimeError, match="expected complete are not"):
        list(assemble_file(str(path), {"a"}))


def test_assemble_file_strict_refuses_a_changed_or_missing_waveform_and_stops_after_the_last_wanted(tmp_path):
    """At publish, the readers' hashes are checked again as the bytes are written: a staged file
    changed since (a zeroed chunk, a waveform gone) is an error marked STAGED_CHANGED, not a row."""
    a, a_sum = waveform_records("a", 2, seed=1)
    b, b_sum = waveform_records("b", 2, seed=2)
    rows = chunk_rows([*a, *b])
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA), path, row_group_size=2)
    # only the first row group is needed for a: the damaged second one is never read
    damaged = [dict(r) for r in rows]
    damaged[3]["payload"] = bytes(len(damaged[3]["payload"]))
    pq.write_table(pa.Table.from_pylist(damaged, schema=CHUNK_SCHEMA), path, row_group_size=2)
    (out,) = [r for batch in assemble_file(str(path), {"a": a_sum}, strict=True) for r in batch.to_pylist()]
    assert out["waveform_id"] == "a" and out["checksum_ok"]
    with pytest.raises(RuntimeError, match=f"{STAGED_CHANGED}: .*b no longer hash to {b_sum}"):
        list(assemble_file(str(path), {"a": a_sum, "b": b_sum}, strict=True))
    with pytest.raises(RuntimeError, match=f"{STAGED_CHANGED}: .*1 waveforms it held when it was read are not in it"):
        list(assemble_file(str(path), {"a": a_sum, "gone": a_sum}, strict=True))
    assert [r["checksum_ok"] for batch in assemble_file(str(path), {"b": b_sum}) for r in batch.to_pylist()] == [False]


def test_a_verifying_assembly_brings_rows_back_without_payloads_and_publish_refuses_changed_chunks(tmp_path):
    """A reassembly verifies out-of-order waveforms without keeping their bytes (``verify_only``:
    the row and ``checksum_ok``, no payload); publish assembles them again strictly, so chunks
    damaged since are an error marked STAGED_CHANGED, never a row, in both assemblies."""
    a, a_sum = waveform_records("a", 3, seed=3)
    rows = chunk_rows([a[2], a[0], a[1]])  # out of order in its one staged file
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA), path)
    (verified,) = [r for b in assemble_file(str(path), {"a": a_sum}, verify_only=True) for r in b.to_pylist()]
    assert verified["checksum_ok"] and verified["payload"] is None and verified["size_bytes"] > 0
    (written,) = [r for b in assemble_file(str(path), {"a": a_sum}, strict=True) for r in b.to_pylist()]
    assert written["payload"] is not None and written["qc_mean"] is not None and verified["qc_mean"] is None
    measured = ["payload", *QUALITY_NAMES]  # measured from the payload, which a verifying assembly does not keep
    assert {**written, **dict.fromkeys(measured)} == verified
    table = pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA)
    assert assemble_arrow(table, verify_only=True).to_pylist() == [verified]
    damaged = table.set_column(
        table.schema.get_field_index("payload"),
        "payload",
        pa.array([bytes(len(r["payload"])) for r in rows], pa.binary()),
    )
    assert assemble_arrow(damaged).to_pylist()[0]["checksum_ok"] is False
    with pytest.raises(RuntimeError, match=f"{STAGED_CHANGED}: the chunks of a no longer hash to {a_sum}"):
        assemble_arrow(damaged, strict=True)


def test_a_strict_assembly_that_finds_a_staged_file_changed_leaves_a_note_for_the_publishing_process(tmp_path):
    """The error crosses Spark only as text: the note in the run's staging is what the publish
    reads to know the staged chunks changed (``changed_notes``), with the error's own words."""
    from wavepipe.spark_apps.assembly import changed_notes

    a, a_sum = waveform_records("a", 2, seed=1)
    rows = chunk_rows(a)
    rows[1] = {**rows[1], "payload": bytes(len(rows[1]["payload"]))}
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA), path)
    notes = tmp_path / "staging" / "changed"
    assert changed_notes(str(notes)) == []  # no folder: nothing changed
    with pytest.raises(RuntimeError, match=STAGED_CHANGED):
        list(assemble_file(str(path), {"a": a_sum}, strict=True, notes=str(notes)))
    (note,) = changed_notes(str(notes))
    assert note.startswith(STAGED_CHANGED) and f"a no longer hash to {a_sum}" in note
    list(assemble_file(str(path), {"a": a_sum}, notes=str(notes)))  # not strict: a row, no note
    assert len(changed_notes(str(notes))) == 1


def test_the_workers_parquet_files_hold_the_published_rows_laid_out_by_date(tmp_path):
    """``write_parquet``: the rows as the output table holds them (no ``checksum_ok``, the run's
    id), one file per date in Spark's ``date=...`` folders, every batch a row group, payloads
    unchanged; the files' names and row counts come back for the commit."""
    from wavepipe.delta_files import partition_values
    from wavepipe.spark_apps.assembly import PUBLISHED_SCHEMA, FilesTarget, write_parquet

    a, _ = waveform_records("a", 3, seed=4)
    samples = np.random.default_rng(5).normal(size=(64, 2)).astype("<f4")
    b = split_waveform(
        samples, waveform_id="b", sample_rate=100.0, start_time=START + timedelta(days=1), source="s", chunk_size=256
    )
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(chunk_rows([*a, *b]), schema=CHUNK_SCHEMA), path)
    out = assemble_file(str(path), {"a": None, "b": None}, strict=True)
    batches = [batch.slice(i, 1) for batch in out for i in range(batch.num_rows)]  # a row group each
    assembled = [r for batch in batches for r in batch.to_pylist()]
    target = FilesTarget(str(tmp_path / "table"), "wavepipe-append-x", ("date",), "run-1")
    (written,) = write_parquet(iter(batches), target)
    files = written.to_pylist()
    assert sorted(f["rows"] for f in files) == [1, 1] and len({f["path"] for f in files}) == 2
    for f in files:
        stored = pq.ParquetFile(tmp_path / "table" / f["path"])
        (date,) = partition_values(Path(f["path"]).relative_to("wavepipe-append-x")).values()
        (row,) = stored.read().to_pylist()
        mine = next(r for r in assembled if r["waveform_id"] == row["waveform_id"])
        assert str(mine["date"]) == date and row["payload"] == mine["payload"] and row["run_id"] == "run-1"
        assert stored.schema_arrow.names == [n for n in PUBLISHED_SCHEMA.names if n != "date"]
    unverified = batches[0].set_column(
        batches[0].schema.get_field_index("checksum_ok"), "checksum_ok", pa.array([False])
    )
    with pytest.raises(RuntimeError, match=STAGED_CHANGED):  # an unverified row never reaches a file
        list(write_parquet(iter([unverified]), target))


def test_in_order_chunks_join_as_a_view_of_the_staged_buffer_and_others_are_copied_once():
    from wavepipe.spark_apps.assembly import _Payloads, joined

    column = pa.array([b"ab", b"cd", b"ef", b"gh"], pa.binary())
    payloads = _Payloads(column.slice(1))  # a batch of a row group is a slice of its buffers
    view = joined([payloads.span(0), payloads.span(1)])
    assert isinstance(view, memoryview) and bytes(view) == b"cdef"
    assert joined([payloads.span(1), payloads.span(0)]) == b"efcd"  # out of order: a copy, right order
    other = _Payloads(pa.array([b"ij"], pa.binary()))
    assert joined([payloads.span(2), other.span(0)]) == b"ghij"


def test_output_payloads_are_copied_out_of_the_staged_row_group_which_is_then_freed():
    """pa.array over views would keep each staged row group alive for the worker's life."""
    from wavepipe.spark_apps.assembly import _binary

    pool = pa.default_memory_pool()
    before = pool.bytes_allocated()
    staged = pa.array([bytes(range(256)) * 4096] * 4, pa.binary())  # 4 MiB in the pool
    data = memoryview(staged.buffers()[2])
    out = _binary([data[: 1 << 20], None, b"xyz", data[1 << 20 : 3 << 20]])
    assert out.to_pylist() == [bytes(data[: 1 << 20]), None, b"xyz", bytes(data[1 << 20 : 3 << 20])]
    assert out.null_count == 1
    del staged, data
    assert pool.bytes_allocated() - before < 1024  # the copy is numpy's: of the staged 4 MiB nothing is held
    assert out[3].as_py()[:3] == bytes(range(3))


def test_a_waveform_whose_chunks_cross_batches_and_row_groups_is_joined_whole(tmp_path):
    """Readers flush row groups by size, so an in-order waveform can start in one and end in the
    next; the batches a file is fed in (256 rows) split waveforms too."""
    records = [waveform_records(f"w{i}", 7, seed=i) for i in range(80)]  # 560 chunks
    rows = chunk_rows([r for recs, _ in records for r in recs])
    path = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA), path, row_group_size=100)
    wanted = {f"w{i}": s for i, (_, s) in enumerate(records)}
    out = [r for batch in assemble_file(str(path), wanted, strict=True) for r in batch.to_pylist()]
    assert [r["waveform_id"] for r in out] == [f"w{i}" for i in range(80)]
    for (recs, _), row in zip(records, out, strict=True):
        assert row["payload"] == b"".join(v for _, _, v in recs) and row["checksum_ok"]


def test_a_task_names_the_file_of_its_wanted_ids_and_the_worker_reads_them_from_it(tmp_path):
    """The JVM carries one row per staged file: (its path, the path of its wanted ids)."""
    from wavepipe.spark_apps.assembly import assemble_tasks, read_wanted, write_wanted

    a, a_sum = waveform_records("a", 3, seed=1)
    b, _ = waveform_records("b", 2, seed=2)
    staged = tmp_path / "staged.parquet"
    pq.write_table(pa.Table.from_pylist(chunk_rows([*a, *b]), schema=CHUNK_SCHEMA), staged)
    ids = tmp_path / "wanted" / "run" / "p0.parquet"
    write_wanted(pa.table({"checksum": [a_sum], "waveform_id": ["a"], "partition": [0], "gap_s": [-1.5]}), str(ids))
    assert read_wanted(str(ids)) == ({"a": a_sum}, {"a": -1.5})
    task = pa.RecordBatch.from_pydict({"path": [str(staged)], "wanted": [str(ids)]})
    out = [r for batch in assemble_tasks(iter([task]), None, "", True, 1 << 20, False) for r in batch.to_pylist()]
    assert [r["waveform_id"] for r in out] == ["a"] and out[0]["payload"] == b"".join(v for _, _, v in a)
    assert out[0]["gap_s"] == -1.5, "the run's gap of the waveform is its row's"
    write_wanted(pa.table({"checksum": [a_sum], "waveform_id": ["a"]}), str(ids))  # none decided: null
    assert read_wanted(str(ids)) == ({"a": a_sum}, {"a": None})
