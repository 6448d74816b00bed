"""A run's chunk metadata, worked on in this process: where each waveform ends, and why.

The metadata of a run's staged chunks (no payload: some hundred bytes a chunk) is read here with
pyarrow and classified with pandas, once: which waveforms are complete, pending, quarantined or
another window's; how each new one is verified and written (``route``); where every staged record
ends (``accounting``); the quarantine table's rows. No Spark job runs for any of it: a Spark job
costs tenths of a second whatever it carries, and a run's metadata is small (1 GiB of 16 KiB
waveforms is 65,536 rows). Spark reads and writes the payloads and the tables.

Guarantees, the same as the reassembly's (``spark_apps/reassemble.py``): duplicate chunks (same
waveform and sequence number) count once, the lowest (partition, offset) wins; chunks of an id
that the output holds under another checksum are another content (``split_conflicts``); a waveform
quarantined once stays quarantined (``final_status``); every staged record is accounted once.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa

from wavepipe import storage

PENDING = "pending"
CANDIDATE = "candidate"
QUARANTINED = "quarantined"
OUTPUT = "output"
#: In a time-window run: a waveform whose first chunk is outside the window (another window's).
OTHER_WINDOW = "other_window"

META_COLUMNS = [
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "waveform_id",
    "seq",
    "chunk_count",
    "total_size",
    "checksum",
    "dtype",
    "channels",
    "sample_rate",
    "start_ns",
    "source",
    "chunk_len",
    "extension",
]
#: Chunks that must agree for a waveform to be one content.
_FACTS = ["total_size", "checksum", "dtype", "channels", "sample_rate", "start_ns", "source", "extension"]

#: Routes of a new candidate waveform (``route``): how its bytes are verified and written.
DIGEST, LOCAL, SHUFFLE = "digest", "local", "shuffle"

#: The quarantine table's columns and types (one row per quarantined waveform and reason).
QUARANTINE_SCHEMA = pa.schema(
    [
        ("waveform_id", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("records", pa.int64()),
        ("chunk_count", pa.int32()),
        ("total_size", pa.int64()),
        ("source", pa.string()),
        ("checksum", pa.string()),
        ("output_checksum", pa.string()),
        ("run_id", pa.string()),
        ("quarantined_at", pa.timestamp("us", tz="UTC")),
    ]
)


def read_meta(files: Iterable[str]) -> pd.DataFrame:
    """The metadata columns of staged chunk ``files`` (Parquet; the payload column is not read)."""
    tables = [storage.read_parquet(f, columns=META_COLUMNS) for f in files]
    if not tables:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in META_COLUMNS})
    return pa.concat_tables(tables).to_pandas()


def _per(values: dict[int, int] | None, partitions: pd.Series) -> pd.Series:
    """``values[partition]`` of each row, NaN where not given."""
    return partitions.map(values or {}).astype("float64")


def _text(value) -> str:
    """A value as Spark's ``format_string`` wrote it (``null`` for a missing one)."""
    return "null" if value is None or (isinstance(value, float) and np.isnan(value)) else str(int(value))


def classify(
    meta: pd.DataFrame,
    *,
    max_waveform_bytes: int = 0,
    ends: dict[int, int] | None = None,
    newest_ms: dict[int, int] | None = None,
    incomplete_after_offsets: int = 0,
    incomplete_after_ms: int = 0,
    window: dict[int, tuple[int, int]] | None = None,
) -> pd.DataFrame:
    """Per waveform, from chunk metadata only: its status, reason and detail.

    ``candidate``: every chunk present, chunks agree, sizes add up (checksum still to verify);
    ``pending``: chunks missing; ``quarantined``: chunks disagree (``chunk_count_mismatch``,
    ``metadata_mismatch``), sizes do not add up (``size_mismatch``) or the waveform is larger
    than ``max_waveform_bytes`` by its header or its chunks (``too_large``, at any completeness).
    ``checksum`` is the chunks' ``wp-checksum`` (the smallest, where they disagree).

    ``expired`` marks a pending waveform no chunk of which arrived in the last
    ``incomplete_after_offsets`` offsets (before ``ends[partition]``) or ``incomplete_after_ms``
    of record time (before ``newest_ms[partition]``) of its partition: it is no longer expected
    to complete (``final_status`` quarantines it as ``incomplete`` unless it is a leftover).

    ``window`` (a time-window run: per partition ``[from, to)`` offsets): a waveform whose first
    chunk (``seq`` 0) is not among those offsets, or not read at all, is ``other_window``."""
    m = meta.sort_values(["waveform_id", "seq", "partition", "offset"], kind="stable")
    unique = ~m.duplicated(["waveform_id", "seq"])
    m = m.assign(
        unique=unique,
        unique_len=np.where(unique, m["chunk_len"], 0),
        offsets_since=_per(ends, m["partition"]) - m["offset"],
        ms_since=_per(newest_ms, m["partition"]) - m["timestamp_ms"],
    )
    g = m.groupby("waveform_id", sort=True)
    per = pd.DataFrame(
        {
            "records": g.size(),
            "distinct_chunks": g["unique"].sum(),
            "counts_differ": g["chunk_count"].nunique(dropna=False) > 1,
            "chunk_count": g["chunk_count"].max(),
            "facts_differ": (g[_FACTS].nunique(dropna=False) > 1).any(axis=1),
            "unique_bytes": g["unique_len"].sum(),
            "total_size": g["total_size"].max(),
            "partition": g["partition"].min(),
            "one_partition": g["partition"].nunique() == 1,
            "offsets_since": g["offsets_since"].min(),
            "ms_since": g["ms_since"].min(),
        }
    )
    per["checksum"], per["checksum_max"] = _text_extremes(m["checksum"], m["waveform_id"], per.index)
    seq0 = m[m["seq"] == 0].drop_duplicates("waveform_id").set_index("waveform_id")  # sorted: lowest first
    per["outside"] = False
    if window is not None:
        p0, o0 = seq0["partition"].reindex(per.index), seq0["offset"].reindex(per.index)
        starts = p0.map({p: a for p, (a, _) in window.items()})
        stops = p0.map({p: b for p, (_, b) in window.items()})
        per["outside"] = ~((o0 >= starts) & (o0 < stops)).fillna(False).astype(bool)
    return _statuses(per.reset_index(), max_waveform_bytes, incomplete_after_offsets, incomplete_after_ms)


def _text_extremes(values: pd.Series, keys: pd.Series, index: pd.Index) -> tuple[pd.Series, pd.Series]:
    """The smallest and largest of ``values`` (text) per key, for ``index``'s keys (None where a
    key has none). Through the values' sorted codes: pandas takes a text column's minimum per
    group one group at a time in Python (seconds at 65,536 waveforms), a code's in one pass."""
    codes, uniques = pd.factorize(values, sort=True)  # a missing value: code -1
    codes = pd.Series(np.where(codes < 0, np.nan, codes), index=values.index)
    g = codes.groupby(keys.to_numpy(), sort=True)
    names = np.append(np.asarray(uniques, dtype=object), None)

    def named(found: pd.Series) -> pd.Series:
        at = found.reindex(index).fillna(len(uniques)).astype(np.int64).to_numpy()
        return pd.Series(names[at], index=index, dtype=object)

    return named(g.min()), named(g.max())


def _statuses(per: pd.DataFrame, max_bytes: int, after_offsets: int, after_ms: int) -> pd.DataFrame:
    """``classify``'s per-waveform facts -> status, reason, detail, expired (first rule wins)."""
    too_large = (
        (per["total_size"] > max_bytes) | (per["unique_bytes"] > max_bytes)
        if max_bytes
        else pd.Series(False, per.index)
    )
    missing = per["distinct_chunks"] < per["chunk_count"]
    stalled = pd.Series(False, per.index)
    if after_offsets:
        stalled |= (per["offsets_since"] > after_offsets).fillna(False)
    if after_ms:
        stalled |= (per["ms_since"] > after_ms).fillna(False)
    ragged = per["unique_bytes"] != per["total_size"]
    rules = [
        (per["outside"], OTHER_WINDOW, None),
        (per["counts_differ"], QUARANTINED, "chunk_count_mismatch"),
        (per["facts_differ"], QUARANTINED, "metadata_mismatch"),
        (too_large, QUARANTINED, "too_large"),
        (missing, PENDING, None),
        (ragged, QUARANTINED, "size_mismatch"),
    ]
    conditions = [c.to_numpy(dtype=bool) for c, _, _ in rules]
    status = np.select(conditions, [s for _, s, _ in rules], default=CANDIDATE)
    reason = np.select(conditions, [r or "" for _, _, r in rules], default="")
    rule = np.select(conditions, list(range(len(rules))), default=-1)
    details = [_detail(int(k), row, max_bytes) for k, row in zip(rule, per.itertuples(index=False), strict=True)]
    return pd.DataFrame(
        {
            "waveform_id": per["waveform_id"],
            "records": per["records"],
            "distinct_chunks": per["distinct_chunks"],
            "chunk_count": per["chunk_count"],
            "total_size": per["total_size"],
            "unique_bytes": per["unique_bytes"],
            "partition": per["partition"],
            "one_partition": per["one_partition"],
            "checksum": per["checksum"],
            "status": status,
            "reason": pd.Series(np.where(reason == "", None, reason), index=per.index, dtype=object),
            "detail": details,
            "expired": (~per["outside"] & missing & ~too_large & stalled).to_numpy(dtype=bool),
        }
    )


def _detail(rule: int, w, max_bytes: int) -> str | None:
    """The detail of the first rule (``_statuses``) that placed waveform ``w``."""
    disagree = ""
    if w.checksum != w.checksum_max:
        disagree = (
            f"; its chunks carry wp-checksum {w.checksum} and {w.checksum_max} "
            "(an id used for two contents in one run, or damaged chunks)"
        )
    if rule == 0:
        return "its first chunk is outside the window"
    if rule == 1:
        return "chunks disagree on wp-count" + disagree
    if rule == 2:
        return "chunks disagree on wp-size, wp-checksum or the waveform's metadata" + disagree
    if rule == 3:
        return f"{w.total_size} bytes by header, {w.unique_bytes} in chunks; the maximum is {max_bytes}"
    if rule == 4:
        seconds = None if np.isnan(w.ms_since) else int(w.ms_since / 1000)
        return (
            f"{w.distinct_chunks} of {w.chunk_count} chunks; none in the last {_text(w.offsets_since)} offsets "
            f"({_text(seconds)} s) of its partition"
        )
    if rule == 5:
        return f"chunks hold {w.unique_bytes} bytes, wp-size says {w.total_size}"
    return None


def route(candidates: pd.DataFrame, digests: pd.DataFrame | None) -> pd.DataFrame:
    """The candidates with ``route`` and ``digest_ok``. ``digest``: its chunks are all in one
    staged file, each once, and the reader hashed them in order as it staged them (one row of
    ``digests`` for the id, with the same checksum, chunk count and partition): verified from
    that hash (``digest_ok``), no payload read now. ``local``: one staged file, not in order:
    assembled and verified from that file. ``shuffle``: chunks over partitions or repeated."""
    simple = candidates["one_partition"] & (candidates["records"] == candidates["distinct_chunks"])
    out = candidates.assign(route=np.where(simple, LOCAL, SHUFFLE), digest_ok=None)
    if digests is None or digests.empty:
        return out
    once = digests[~digests.duplicated("waveform_id", keep=False)].set_index("waveform_id")
    d = once.reindex(out["waveform_id"])
    has = (
        simple.to_numpy()
        & (d["checksum"].to_numpy() == out["checksum"].to_numpy())
        & (d["n_chunks"].to_numpy() == out["chunk_count"].to_numpy())
        & (d["partition"].to_numpy() == out["partition"].to_numpy())
    )
    out["route"] = np.where(has, DIGEST, out["route"])
    out["digest_ok"] = pd.Series(
        np.where(has, d["digest"].to_numpy() == out["checksum"].to_numpy(), None), index=out.index, dtype=object
    )
    return out


def split_conflicts(meta: pd.DataFrame, known: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the chunks of the waveforms as the output knows them, the conflicting chunks).

    ``known``: ``waveform_id`` and ``checksum`` of the output table's rows with the run's ids. A
    chunk whose id is in the output under another ``wp-checksum`` is another content under a
    reused id: a conflict (with ``output_checksum``), never a chunk of the waveform already
    written."""
    owners = known.drop_duplicates("waveform_id").set_index("waveform_id")["checksum"]
    output_checksum = meta["waveform_id"].map(owners)
    conflict = (output_checksum.notna() & (meta["checksum"] != output_checksum)).to_numpy()
    return meta[~conflict], meta[conflict].assign(output_checksum=output_checksum[conflict])


def final_status(
    classified: pd.DataFrame, before: set[str], after: set[str], quarantined: dict[str, str]
) -> pd.DataFrame:
    """Per waveform, where it ended: ``output`` (written now or already before), ``pending``, or
    ``quarantined`` with a reason. ``before``/``after``: the output's ids before and after this
    run's write; ``quarantined``: id -> reason of the waveforms quarantined earlier.

    A waveform quarantined earlier (and not in the output) stays quarantined with its reason,
    whatever chunks arrive later, also a complete set. A candidate absent from the output after
    the write failed its checksum. An incomplete set of chunks of a waveform that is already in
    the output is a leftover of a run that started inside it: it is accounted with that waveform
    and does not hold the commit back. Any other incomplete waveform stays pending until
    ``expired``, then is quarantined as ``incomplete``."""
    ids = classified["waveform_id"]
    was_there, is_there = ids.isin(before).to_numpy(), ids.isin(after).to_numpy()
    q_reason = ids.map(quarantined)
    status = classified["status"].to_numpy()
    candidate, stale = status == CANDIDATE, status == PENDING
    expired = classified["expired"].to_numpy(dtype=bool)
    earlier = (candidate | stale) & ~was_there & q_reason.notna().to_numpy()
    failed = candidate & ~is_there & ~earlier
    leftover = stale & was_there & ~earlier
    timed_out = stale & ~was_there & expired & ~earlier
    out = pd.DataFrame(
        {"waveform_id": ids, "status": status, "reason": classified["reason"], "detail": classified["detail"]}
    )
    out.loc[candidate & is_there & ~earlier, "status"] = OUTPUT
    out.loc[leftover, ["status", "reason"]] = [OUTPUT, None]
    out.loc[failed, ["status", "reason", "detail"]] = [
        QUARANTINED,
        "checksum_mismatch",
        "the joined chunks' sha256 differs from wp-checksum",
    ]
    out.loc[timed_out, ["status", "reason"]] = [QUARANTINED, "incomplete"]
    out.loc[earlier, "status"] = QUARANTINED
    out.loc[earlier, "reason"] = q_reason[earlier]
    out.loc[earlier, "detail"] = "chunks of a waveform quarantined earlier"
    out["already_written"] = was_there
    out["output_checksum"] = None
    return out


def conflict_status(conflicts: pd.DataFrame, window: dict[int, tuple[int, int]] | None = None) -> pd.DataFrame:
    """Per waveform id, where its conflicting chunks (``split_conflicts``) end: quarantined as
    ``id_conflict``, the output's and their own checksums in the detail and in
    ``output_checksum``; in a time-window run, ``other_window`` when their first chunk is another
    window's. Columns as ``final_status``'s."""
    placed = classify(conflicts[META_COLUMNS], window=window)
    owners = conflicts.drop_duplicates("waveform_id").set_index("waveform_id")["output_checksum"]
    other = (placed["status"] == OTHER_WINDOW).to_numpy()
    output_checksum = placed["waveform_id"].map(owners)
    detail = [
        "its first chunk is outside the window"
        if o
        else f"wp-id {w} is in the output with wp-checksum {oc}; these chunks carry wp-checksum {c} "
        "(another content under the same id)"
        for o, w, oc, c in zip(other, placed["waveform_id"], output_checksum, placed["checksum"], strict=True)
    ]
    return pd.DataFrame(
        {
            "waveform_id": placed["waveform_id"],
            "status": np.where(other, OTHER_WINDOW, QUARANTINED),
            "reason": [None if o else "id_conflict" for o in other],
            "detail": detail,
            "already_written": False,
            "output_checksum": output_checksum,
        }
    )


def quarantine_rows(meta: pd.DataFrame, status: pd.DataFrame, run_id: str, now: datetime | None = None) -> pa.Table:
    """One row per quarantined waveform and reason (``QUARANTINE_SCHEMA``): what the quarantine
    table holds. ``checksum``: the chunks' ``wp-checksum`` (the smallest where they disagree);
    ``output_checksum``: for an ``id_conflict``, the checksum of the output's waveform with that id."""
    placed = status[status["status"] == QUARANTINED][["waveform_id", "reason", "detail", "output_checksum"]]
    rows = (
        meta[META_COLUMNS].merge(placed, on="waveform_id").sort_values(["waveform_id", "reason", "partition", "offset"])
    )
    g = rows.groupby(["waveform_id", "reason"], sort=True)
    first = g.first()
    out = pd.DataFrame(
        {
            "detail": first["detail"],
            "topic": first["topic"],
            "partition": first["partition"],
            "first_offset": first["offset"],
            "last_offset": g["offset"].max(),
            "records": g.size(),
            "chunk_count": g["chunk_count"].max(),
            "total_size": g["total_size"].max(),
            "source": first["source"],
            "checksum": g["checksum"].min(),
            "output_checksum": first["output_checksum"],
        }
    ).reset_index()
    out["run_id"] = run_id
    out["quarantined_at"] = pd.Timestamp(now or datetime.now(UTC))
    return pa.Table.from_pandas(out, schema=QUARANTINE_SCHEMA, preserve_index=False)


def accounting(meta: pd.DataFrame, status: pd.DataFrame) -> list[dict]:
    """Per partition and final status: records, payload bytes and first offset (dicts with
    ``partition``, ``status``, ``reason``, ``already_written``, ``records``, ``bytes``,
    ``min_offset``)."""
    keys = ["partition", "status", "reason", "already_written"]
    joined = meta[["waveform_id", "partition", "offset", "chunk_len"]].merge(
        status[["waveform_id", "status", "reason", "already_written"]], on="waveform_id", how="left"
    )
    g = joined.groupby(keys, dropna=False, sort=True)
    counted = pd.DataFrame({"records": g.size(), "bytes": g["chunk_len"].sum(), "min_offset": g["offset"].min()})
    return [_plain(r) for r in counted.reset_index().to_dict("records")]


def by_waveform(placed: pd.DataFrame) -> list[dict]:
    """Waveforms by final status: dicts with ``status``, ``reason``, ``already_written``, ``count``."""
    g = placed.groupby(["status", "reason", "already_written"], dropna=False, sort=True).size()
    return [_plain({**dict(zip(g.index.names, k, strict=True)), "count": n}) for k, n in g.items()]


def _plain(row: dict) -> dict:
    """numpy scalars and NaN -> Python values and None (for JSON and Spark-free comparisons)."""
    out = {}
    for k, v in row.items():
        if v is None or (isinstance(v, float) and np.isnan(v)):
            out[k] = None
        elif hasattr(v, "item"):
            out[k] = v.item()
        else:
            out[k] = v
    return out


def inside_window(frame: pd.DataFrame, topic: str, window: dict[int, tuple[int, int]], column: str) -> pd.Series:
    """Rows of ``topic`` whose ``column`` (an offset) is in the window's ``[from, to)`` of their
    partition (``tables.window_predicate``, in this process)."""
    starts = frame["partition"].map({p: a for p, (a, _) in window.items()})
    stops = frame["partition"].map({p: b for p, (_, b) in window.items()})
    return ((frame["topic"] == topic) & (frame[column] >= starts) & (frame[column] < stops)).fillna(False).astype(bool)
