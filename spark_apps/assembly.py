"""Payload assembly: one waveform's chunks in, one checked output row out. Pure pyarrow.

No Spark here (``tests/unit/test_assembly.py`` checks that importing this module loads none): the
functions run wherever the bytes are, in a Spark engine's Python workers (``mapInArrow``,
``applyInArrow`` in ``reassemble.py``) or in the run's own process (the plot in ``validate.py``).

* ``assemble_file`` streams one staged file (one Kafka partition's chunks, as its reader wrote
  them) and joins the waveforms asked for, holding only those whose chunks are still arriving;
* ``assemble_arrow`` joins one waveform from its chunk rows wherever they were staged (in
  sequence order, the first copy of each chunk);
* every joined payload is hashed against its ``wp-checksum``: a mismatch gives a row with
  ``checksum_ok`` false and no payload, or (``strict``, bytes verified before) an error marked
  ``STAGED_CHANGED``: the staged file changed on disk since.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from wavepipe.contracts.config import Settings
from wavepipe.contracts.protocol import checksum, output_facts
from wavepipe.contracts.quality import QualityRule
from wavepipe.contracts.rows import QUALITY_FIELDS, ROW_FACTS
from wavepipe.delta_files import NULL_PARTITION
from wavepipe.faults import failpoint
from wavepipe.spark_apps.quality import batch_metrics, flags
from wavepipe.storage import (
    StoreOptions,
    arrow_filesystem,
    arrow_path,
    configured_options,
    files,
    is_remote,
    join,
    open_input,
    read_text,
)

#: The output table's columns (Spark's ``reassemble.OUTPUT_SCHEMA`` is made from these).
_CUT = ROW_FACTS.get_field_index("checksum") + 1
ARROW_OUTPUT_SCHEMA = pa.schema(
    [*list(ROW_FACTS)[:_CUT], pa.field("payload", pa.binary(), True), *list(ROW_FACTS)[_CUT:]]
    + [*QUALITY_FIELDS, pa.field("checksum_ok", pa.bool_(), False)]
)
#: The quality rules rows are flagged by (``contracts.quality``; empty: measured, not flagged).
Rules = tuple[QualityRule, ...]
#: Marks the error of a staged chunk file whose bytes changed after the reader hashed them.
STAGED_CHANGED = "wavepipe: staged chunks changed on disk"
#: The chunk columns every chunk of a waveform repeats (those of its output row).
_FACTS = ("waveform_id", "source", "dtype", "channels", "sample_rate", "start_ns", "checksum", "topic", "extension")
#: The chunk columns ``assemble_file`` reads.
_READ = (*_FACTS, "seq", "chunk_count", "offset", "partition")
_DEFAULT_BATCH_BYTES = Settings.model_fields["output_batch_bytes"].default


def output_row(
    facts: dict, payload: bytes, n_chunks: int, partition: int, first_offset: int, last_offset: int, keep: bool = True
) -> dict:
    """One output row (a dict in ARROW_OUTPUT_SCHEMA's order) for a joined payload; checksum
    verified, payload dropped (None) when it does not match, or when not ``keep`` (verified only)."""
    ok = checksum(payload) == facts["checksum"]
    row = output_facts(facts, len(payload), n_chunks, partition, first_offset, last_offset)
    return {**row, "payload": payload if ok and keep else None, "checksum_ok": ok}


def output_batch(rows: list[dict], quality: Rules | None = ()) -> pa.RecordBatch:
    """``output_row``s as one record batch of ARROW_OUTPUT_SCHEMA (times in microseconds, dates
    in days, as ``output_facts`` gives them), with the quality of each row that carries its
    payload measured and flagged by the rules ``quality`` (None: not measured; null)."""
    payload = _binary([r["payload"] for r in rows])
    measured = _quality(rows, payload, quality) if quality is not None else {}
    arrays = []
    for f in ARROW_OUTPUT_SCHEMA:
        values = measured[f.name] if f.name in measured else [r.get(f.name) for r in rows]
        if isinstance(values, pa.Array):
            arrays.append(values)
        elif pa.types.is_timestamp(f.type):
            arrays.append(pa.array(values, pa.int64()).cast(f.type))
        elif pa.types.is_list(f.type):
            arrays.append(pa.array(values, f.type))
        elif pa.types.is_date32(f.type):
            arrays.append(pa.array(values, pa.int32()).cast(f.type))
        elif f.name == "payload":
            arrays.append(payload)
        else:
            arrays.append(pa.array(values, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_OUTPUT_SCHEMA)


def _quality(rows: list[dict], payload: pa.BinaryArray, rules: Rules) -> dict[str, pa.Array]:
    """The quality columns (``rows.QUALITY_FIELDS``) of ``rows`` (``payload``: their payload
    column, ``_binary``'s): the samples' metrics where a row carries its payload, measured where
    the column holds them; its ``latency_s`` from its end to now; ``gap_s`` as the row has it
    (the run decided it: ``publish``); ``qc_flags``, the ``rules`` it breaks. Null where there
    is no payload."""
    _, offsets, data = payload.buffers()
    ends = np.frombuffer(offsets, np.int32)
    data = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    samples = [
        None if r["payload"] is None else data[ends[i] : ends[i + 1]].view(r["dtype"]).reshape(-1, r["channels"])
        for i, r in enumerate(rows)
    ]
    now_us = time.time_ns() // 1000
    latency = [None if r["payload"] is None or r["end_time"] is None else (now_us - r["end_time"]) / 1e6 for r in rows]
    columns = {
        **batch_metrics(samples),
        "latency_s": pa.array(latency, pa.float64()),
        "gap_s": pa.array([r.get("gap_s") for r in rows], pa.float64()),
    }
    flagged = flags(rules, [r["source"] for r in rows], columns)
    measured = pa.array([s is not None for s in samples])
    columns["qc_flags"] = pc.if_else(measured, flagged, pa.nulls(len(rows), flagged.type))
    return columns


def _binary(values: list[bytes | memoryview | None]) -> pa.Array:
    """Payloads (bytes, views of a staged row group, or None) as one binary array, each copied
    once. Not ``pa.array``: it keeps every view's buffer alive (pyarrow 26), so a worker would
    hold each staged row group it ever read."""
    sizes = np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} bytes of payload in one batch; a binary column holds less than 2 GiB")
    data = np.empty(int(offsets[-1]), np.uint8)
    for value, start, end in zip(values, offsets[:-1], offsets[1:], strict=True):
        if value is not None:
            data[start:end] = np.frombuffer(value, np.uint8)
    nulls = any(v is None for v in values)
    valid = pa.array([v is not None for v in values]).buffers()[1] if nulls else None
    buffers = [valid, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), len(values), buffers, null_count=sum(v is None for v in values))


def _changed(message: str, notes: str | None, reach: StoreOptions | None = None) -> RuntimeError:
    """The error of a staged file that changed since its reader hashed it; first a note of it in
    folder ``notes`` (the run's ``changed`` folder), which the publishing process reads: the error
    itself reaches it only as the text of a Spark failure."""
    text = f"{STAGED_CHANGED}: {message}"
    if notes is not None:
        leave_note(notes, text, reach)
    return RuntimeError(text)


def leave_note(folder: str, text: str, reach: StoreOptions | None = None) -> None:
    """``text`` as a new file in ``folder`` (local, or on an object store reached with ``reach``)."""
    _put(folder, f"{uuid.uuid4().hex}.txt", text.encode(), reach)


def _put(folder: str, name: str, data: bytes, reach: StoreOptions | None) -> None:
    """``data`` as file ``name`` in ``folder`` (local, or on an object store reached with ``reach``)."""
    if not is_remote(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_bytes(data)
        return
    filesystem = arrow_filesystem(reach or configured_options(folder))
    with filesystem.open_output_stream(arrow_path(join(folder, name))) as out:
        out.write(data)


@dataclass(frozen=True)
class Holding:
    """Rows a quarantining quality rule holds back from the output (``hold_apart``): the names of
    those rules, and the run's folder the rows go to instead (``publish.held_rejection`` puts
    them in the quarantine table), reached with ``reach``."""

    rules: frozenset[str]
    folder: str
    reach: StoreOptions | None = None


def hold_apart(batch: pa.RecordBatch, holding: Holding | None) -> pa.RecordBatch:
    """``batch`` (output rows, ``output_batch``'s) without the rows whose ``qc_flags`` name one
    of ``holding``'s rules: those are written, without their payload, as a Parquet file of their
    own in ``holding.folder``. None: every row kept."""
    if holding is None or not batch.num_rows:
        return batch
    flagged = batch.column(batch.schema.get_field_index("qc_flags"))
    hit = pc.is_in(pc.list_flatten(flagged), value_set=pa.array(sorted(holding.rules), pa.string()))
    held = np.zeros(batch.num_rows, bool)
    held[pc.list_parent_indices(flagged).to_numpy()[hit.to_numpy(zero_copy_only=False)]] = True
    if not held.any():
        return batch
    rows = pa.Table.from_batches([batch.filter(pa.array(held))]).drop_columns(["payload"])
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink)
    _put(holding.folder, f"held-{uuid.uuid4().hex}.parquet", sink.getvalue().to_pybytes(), holding.reach)
    return batch.filter(pa.array(~held))


def changed_notes(folder: str) -> list[str]:
    """The notes the assemblies left in ``folder`` (``_changed``), oldest name first; none: no
    staged file was found changed."""
    return [read_text(f) for f in files(folder, ".txt")]


def assemble_arrow(
    table: pa.Table,
    failpoints: str | None = None,
    scope: str = "",
    strict: bool = False,
    verify_only: bool = False,
    notes: str | None = None,
    quality: Rules | None = (),
) -> pa.Table:
    """One waveform's chunk rows -> one output row: chunks in sequence order (first copy of each),
    payload joined, checksum verified. Holds one waveform at a time. ``strict``: a waveform
    verified before (by an earlier assembly) that no longer hashes to its checksum raises an error
    marked ``STAGED_CHANGED`` and leaves a note of it in folder ``notes``, as in ``assemble_file``; ``verify_only``: the row comes back
    without its payload. ``failpoints``, ``scope``: the run's armed failpoints (``wavepipe.faults``).
    A ``gap_s`` column (the run's, ``publish``) is the row's; ``quality``: its metrics are measured."""
    seqs, partitions, offsets = (table[name].to_pylist() for name in ("seq", "partition", "offset"))
    order = sorted(range(table.num_rows), key=lambda i: (seqs[i], partitions[i], offsets[i]))
    picked, seen = [], set()
    for i in order:
        if seqs[i] not in seen:
            seen.add(seqs[i])
            picked.append(i)
    payload = b"".join(table["payload"][i].as_py() for i in picked)
    facts = {name: table[name][picked[0]].as_py() for name in _FACTS}
    first_chunk = min(range(table.num_rows), key=lambda i: (partitions[i], offsets[i]))
    first, last = offsets[first_chunk], max(offsets)
    row = output_row(facts, payload, len(picked), partitions[first_chunk], first, last, keep=not verify_only)
    if strict and not row["checksum_ok"]:
        raise _changed(f"the chunks of {facts['waveform_id']} no longer hash to {facts['checksum']}", notes)
    if "gap_s" in table.column_names:
        row["gap_s"] = table["gap_s"][0].as_py()
    failpoint("assemble.batch", failpoints, scope)
    return pa.Table.from_batches([output_batch([row], quality)])


class _Payloads:
    """The payload column of one record batch, handed out as spans of its data buffer (no copy).
    The batches of one staged row group are slices of one buffer: a span's ends are places in it."""

    def __init__(self, column: pa.BinaryArray):
        _, offsets, data = column.buffers()
        self.address = data.address if data is not None else 0
        self.data = memoryview(data) if data is not None else memoryview(b"")
        self.ends = np.frombuffer(offsets, dtype=np.int32)[column.offset : column.offset + len(column) + 1].tolist()

    def span(self, i: int) -> tuple[_Payloads, int, int]:
        """Chunk ``i``'s payload: (this column, where it starts and ends in the data buffer)."""
        return self, self.ends[i], self.ends[i + 1]


def joined(spans: list[tuple[_Payloads, int, int]]) -> memoryview | bytes:
    """Chunk payloads joined in the order given: a view of the staged row group's own buffer when
    they lie there one after the other, as a reader stages an in-order waveform; else one copy."""
    column, start, end = spans[0]
    for other, begins, ends in spans[1:]:
        if other.address != column.address or begins != end:
            return b"".join(c.data[s:e] for c, s, e in spans)
        end = ends
    return column.data[start:end]


class _FileJoin:
    """The wanted waveforms of one staged file being joined, fed one record batch at a time.
    ``wanted``: id -> ``wp-checksum`` (None: any); chunks of a wanted id under another checksum
    (another content under a reused id) are not used."""

    def __init__(
        self,
        path: str,
        wanted: dict[str, str | None],
        strict: bool,
        verify_only: bool,
        notes=None,
        reach=None,
        gaps=None,
    ):
        self.path, self.wanted, self.strict, self.keep = path, wanted, strict, not verify_only
        self.notes, self.reach, self.gaps = notes, reach, gaps or {}
        self.open: dict[str, dict] = {}  # id -> its facts, where it starts, its chunks so far
        self.done = 0

    @property
    def finished(self) -> bool:
        return self.done == len(self.wanted)

    def feed(self, batch: pa.RecordBatch) -> Iterator[dict]:
        """The output rows of the wanted waveforms whose last chunk is in ``batch``."""
        ids = batch.column("waveform_id").to_pylist()
        if self.wanted.keys().isdisjoint(ids):
            return
        cols = {name: batch.column(name).to_pylist() for name in _READ}  # a column at a time: fewer objects
        payloads = _Payloads(batch.column("payload"))
        for i, wid in enumerate(ids):
            if wid in self.wanted and self.wanted[wid] in (None, cols["checksum"][i]):
                parts = self._chunks_of(wid, cols, i)
                parts[cols["seq"][i]] = payloads.span(i)
                if len(parts) == cols["chunk_count"][i]:
                    yield self._joined(wid, cols["offset"][i])

    def _chunks_of(self, wid: str, cols: dict[str, list], i: int) -> dict[int, tuple]:
        if wid not in self.open:
            facts = {name: cols[name][i] for name in _FACTS}
            self.open[wid] = {
                "facts": facts,
                "partition": cols["partition"][i],
                "first": cols["offset"][i],
                "parts": {},
            }
        return self.open[wid]["parts"]

    def _joined(self, wid: str, last_offset: int) -> dict:
        w = self.open.pop(wid)
        payload = joined([w["parts"][k] for k in sorted(w["parts"])])
        row = output_row(w["facts"], payload, len(w["parts"]), w["partition"], w["first"], last_offset, self.keep)
        if self.strict and not row["checksum_ok"]:
            expected = w["facts"]["checksum"]
            raise _changed(
                f"{self.path}: the chunks of {wid} no longer hash to {expected}, as they did when they were read",
                self.notes,
                self.reach,
            )
        self.done += 1
        row["gap_s"] = self.gaps.get(wid)
        return row

    def check_complete(self) -> None:
        """An error when the file ended without what its classification promised."""
        if self.open:  # classify said these were complete in this file: the file changed under us
            detail = f"{self.path}: {len(self.open)} waveforms expected complete are not, e.g. {next(iter(self.open))}"
            if self.strict:
                raise _changed(detail, self.notes, self.reach)
            raise RuntimeError(f"staged chunks changed: {detail}")
        if self.strict and not self.finished:
            missing = len(self.wanted) - self.done
            raise _changed(
                f"{self.path}: {missing} waveforms it held when it was read are not in it", self.notes, self.reach
            )


def assemble_file(
    path: str,
    wanted: dict[str, str | None] | set[str],
    strict: bool = False,
    batch_bytes: int = _DEFAULT_BATCH_BYTES,
    verify_only: bool = False,
    reach: StoreOptions | None = None,
    notes: str | None = None,
    gaps: dict[str, float | None] | None = None,
    quality: Rules | None = (),
) -> Iterator[pa.RecordBatch]:
    """Whole waveforms from one staged file (``path``; on an object store reached with ``reach``), streamed: the ``wanted`` ids (id -> ``wp-checksum``,
    or a set: any checksum) must have every chunk carrying that checksum, once, in this file (one
    Kafka partition). Holds only the waveforms whose chunks are still arriving (with keyed
    producers, one or two) and one batch of output (``batch_bytes`` of payload, or one waveform);
    stops reading once every wanted one is out.

    ``strict`` (waveforms the reader verified as it staged them): a waveform that no longer hashes
    to its checksum, or is not in the file, raises an error marked ``STAGED_CHANGED`` (the file
    changed since it was read), and leaves a note of it in folder ``notes`` (``_changed``), instead
    of coming out with ``checksum_ok`` false. ``verify_only``:
    the rows come back without their payloads (a reassembly verifying them; publish writes them).
    ``gaps``: id -> ``gap_s`` (the run's, ``publish``); ``quality``: the rows' metrics are measured."""
    wanted = wanted if isinstance(wanted, dict) else dict.fromkeys(wanted)
    join = _FileJoin(path, wanted, strict, verify_only, notes, reach, gaps)
    rows: list[dict] = []
    buffered = 0
    source = path if reach is None else open_input(path, reach)
    staged = pq.ParquetFile(source, pre_buffer=False)  # pre-buffering would read the whole file ahead
    for index in range(staged.num_row_groups):  # one in memory at a time (``staging_flush_bytes``)
        if join.finished:
            break
        for batch in staged.read_row_group(index).to_batches(max_chunksize=256):
            if join.finished:
                break
            for row in join.feed(batch):
                rows.append(row)
                buffered += 0 if verify_only else row["size_bytes"]
                if buffered >= batch_bytes:
                    yield output_batch(rows, quality)
                    rows, buffered = [], 0
        if rows:  # their payloads are views of this row group: out before the next one is read
            yield output_batch(rows, quality)
            rows, buffered = [], 0
    join.check_complete()


def assemble_tasks(
    batches: Iterator[pa.RecordBatch],
    failpoints: str | None,
    scope: str,
    strict: bool,
    batch_bytes: int,
    verify: bool,
    reach: StoreOptions | None = None,
    notes: str | None = None,
    quality: Rules | None = (),
) -> Iterator[pa.RecordBatch]:
    """``assemble_file`` over tasks: record batches of (``path``, ``wanted``), one staged file and
    the file of the waveforms wanted from it (``write_wanted``) per row."""
    for batch in batches:
        for path, ids in zip(batch.column("path").to_pylist(), batch.column("wanted").to_pylist(), strict=True):
            wanted, gaps = read_wanted(ids, reach)
            for out in assemble_file(
                path, wanted, strict, batch_bytes, verify, reach, notes, gaps=gaps, quality=quality
            ):
                yield out
                failpoint("assemble.batch", failpoints, scope)


#: The waveforms a task assembles from one staged file (``write_wanted``).
WANTED_SCHEMA = pa.schema(
    [
        pa.field("waveform_id", pa.string(), False),
        pa.field("checksum", pa.string(), False),
        pa.field("gap_s", pa.float64(), True),  # the run's, for the published row (``publish``)
    ]
)


def write_wanted(ids: pa.Table, uri: str) -> None:
    """Write ``ids`` (``WANTED_SCHEMA``) at ``uri``, in the run's staging, for the worker that
    assembles them: a task names its file, so the engine's JVM carries one row per staged file,
    not one per waveform."""
    if "gap_s" not in ids.column_names:
        ids = ids.append_column("gap_s", pa.nulls(ids.num_rows, pa.float64()))
    ids = ids.select(WANTED_SCHEMA.names).cast(WANTED_SCHEMA)
    if is_remote(uri):
        pq.write_table(ids, arrow_path(uri), filesystem=arrow_filesystem(configured_options(uri)))
        return
    Path(uri).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(ids, uri)


def read_wanted(uri: str, reach: StoreOptions | None = None) -> tuple[dict[str, str], dict[str, float | None]]:
    """The waveforms ``write_wanted`` wrote at ``uri``: id -> ``wp-checksum``, and id -> ``gap_s``."""
    ids = pq.read_table(uri if reach is None else open_input(uri, reach))
    names = ids["waveform_id"].to_pylist()
    return dict(zip(names, ids["checksum"].to_pylist(), strict=True)), dict(
        zip(names, ids["gap_s"].to_pylist(), strict=True)
    )


# --- writing the output's Parquet files in the worker ----------------------------------------------

#: The columns of a published waveform row: the output's but ``checksum_ok``, and the run's id.
PUBLISHED_SCHEMA = pa.schema(
    [f for f in ARROW_OUTPUT_SCHEMA if f.name != "checksum_ok"] + [pa.field("run_id", pa.string(), False)]
)
#: zstd's level for the output's files: 1 compressed sampled float32 noise as tightly as pyarrow's
#: default (3) did (92.4% of its size) at 1.2-2.6x the speed on this machine; random bytes do not
#: compress at either.
ZSTD_LEVEL = 1
#: What a worker says of each Parquet file it wrote: its path under the table, and its rows.
WRITTEN_SCHEMA = pa.schema([pa.field("path", pa.string(), False), pa.field("rows", pa.int64(), False)])


@dataclass(frozen=True)
class FilesTarget:
    """Where workers write a publish's Parquet files: table ``table``'s new folder ``folder``,
    in Hive-style folders by ``partition_by`` (as Spark lays them out), each row with ``run_id``;
    on an object store reached with ``reach``. Picklable: it travels to Spark's Python workers."""

    table: str
    folder: str
    partition_by: tuple[str, ...]
    run_id: str
    reach: StoreOptions | None = None


def write_parquet(batches: Iterator[pa.RecordBatch], target: FilesTarget) -> Iterator[pa.RecordBatch]:
    """Write output rows (record batches of ``ARROW_OUTPUT_SCHEMA``) as Parquet files, one per
    partition value, each batch a row group of its own (``output_batch_bytes`` of payload, so a
    row group never holds more); yields one ``WRITTEN_SCHEMA`` batch once all are closed. The
    payload goes from the batch into the file: no copy through the JVM. zstd (``ZSTD_LEVEL``);
    no dictionary and no statistics for the payload (they would cost CPU and say nothing)."""
    writers: dict[tuple, tuple[str, pq.ParquetWriter]] = {}
    counts: dict[str, int] = {}
    filesystem = arrow_filesystem(target.reach or configured_options(target.table)) if is_remote(target.table) else None
    stored = pa.schema([f for f in PUBLISHED_SCHEMA if f.name not in target.partition_by])
    settings = {
        "compression": "zstd",
        "compression_level": ZSTD_LEVEL,
        "use_dictionary": [n for n in stored.names if n != "payload"],
        "write_statistics": [n for n in stored.names if n != "payload"],
        "filesystem": filesystem,
    }
    try:
        for batch in batches:
            table = _published(batch, target.run_id)
            for values, rows in _by_partition(table, target.partition_by):
                if values not in writers:
                    relative = _file_path(target, values)
                    writers[values] = (relative, pq.ParquetWriter(_where(target, relative), stored, **settings))
                relative, writer = writers[values]
                writer.write_table(rows.select(stored.names))
                counts[relative] = counts.get(relative, 0) + rows.num_rows
    finally:
        for _, writer in writers.values():
            writer.close()
    if counts:
        yield pa.RecordBatch.from_pydict({"path": list(counts), "rows": list(counts.values())}, schema=WRITTEN_SCHEMA)


def _published(batch: pa.RecordBatch, run_id: str) -> pa.Table:
    """Output rows as the published table holds them: verified ones only, with the run's id."""
    table = pa.Table.from_batches([batch]).cast(ARROW_OUTPUT_SCHEMA)  # Spark's time zone name aside, the same
    if not pc.all(table["checksum_ok"]).as_py():  # a strict assembly raised first; a defence only
        raise RuntimeError(f"{STAGED_CHANGED}: an unverified waveform reached the writer")
    table = table.drop_columns(["checksum_ok"])
    return table.append_column(PUBLISHED_SCHEMA.field("run_id"), pa.array([run_id] * table.num_rows, pa.string()))


def _by_partition(table: pa.Table, partition_by: tuple[str, ...]) -> Iterator[tuple[tuple, pa.Table]]:
    """``table``'s rows per combination of the ``partition_by`` columns' values (usually one)."""
    if not partition_by or table.num_rows == 0:
        yield (), table
        return
    keys = table.select(list(partition_by)).group_by(list(partition_by)).aggregate([]).to_pylist()
    for key in keys:
        where = None
        for name, value in key.items():
            match = pc.is_null(table[name]) if value is None else pc.equal(table[name], value)
            where = match if where is None else pc.and_(where, match)
        yield tuple(key[n] for n in partition_by), table.filter(where)


def _file_path(target: FilesTarget, values: tuple) -> str:
    """A new file's path under the table: the folder, then ``name=value`` folders (Spark's null
    name for a missing value), then a name no other writer uses."""
    folders = [
        f"{quote(name, safe='')}={NULL_PARTITION if v is None else quote(str(v), safe='')}"
        for name, v in zip(target.partition_by, values, strict=True)
    ]
    return "/".join([target.folder, *folders, f"part-{uuid.uuid4().hex}.zstd.parquet"])


def _where(target: FilesTarget, relative: str) -> str:
    """Where pyarrow opens ``relative`` (under the table): a local path (its folders made) or a
    bucket/key on the object store."""
    if not is_remote(target.table):
        path = Path(target.table) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        return str(path)
    return arrow_path(join(target.table, relative))
