"""Waveforms back from a wavepipe output table, with delta-rs (no Spark): as numpy arrays, an obspy
``Stream`` or xarray ``DataArray``s.

``read_table`` selects by source (an ``fnmatch`` pattern) and by time (the waveforms that overlap
``[start, end)``); the table's files that cannot hold a match are skipped by their statistics
before any is read. Only this module's top imports run when ``wavepipe.recordings`` is imported:
deltalake, obspy and xarray are imported by the functions that need them.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from wavepipe.contracts.plan import parse_datetime
from wavepipe.contracts.protocol import MAX_TIME_US, Extension, end_us, epoch_ns, rebuild
from wavepipe.recordings.extras import require
from wavepipe.storage import delta_table

if TYPE_CHECKING:
    import pyarrow as pa

    from wavepipe.recordings import Recording

#: The table's columns a waveform is built from (those an older table lacks are read as null).
COLUMNS = (
    "waveform_id",
    "source",
    "start_time",
    "end_time",
    "dtype",
    "channels",
    "sample_rate",
    "n_samples",
    "payload",
    "channel_names",
    "units",
    "calibration",
    "baseline",
    "network",
    "station",
    "location",
    "format",
)
_LIST_FIELDS = ("channel_names", "units", "calibration", "baseline")
_TEXT_FIELDS = ("network", "station", "location", "format")
#: The greatest code point: every text that starts with a prefix sorts below prefix + it.
_MAX_CHAR = chr(0x10FFFF)


@dataclass(eq=False)
class Waveform:
    """One waveform of the table: ``samples`` (n_samples, channels) of the stored dtype, the
    first sample at ``start_ns`` (UTC epoch ns; the table keeps microseconds)."""

    waveform_id: str
    source: str
    start_ns: int
    sample_rate: float
    samples: np.ndarray
    extension: Extension = field(default_factory=Extension)

    @classmethod
    def from_recording(cls, recording: Recording) -> Waveform:
        """The waveform a table would give back for ``recording`` (no table needed)."""
        return cls(
            recording.waveform_id,
            recording.source,
            recording.start_ns,
            recording.sample_rate,
            recording.samples,
            recording.extension,
        )

    @property
    def n_samples(self) -> int:
        return self.samples.shape[0]

    @property
    def channels(self) -> int:
        return self.samples.shape[1]

    @property
    def end_ns(self) -> int:
        """The instant after the last sample (where a contiguous next waveform starts)."""
        return self.start_ns + round(self.n_samples * 1e9 / self.sample_rate)

    def channel_names(self) -> list[str]:
        """The channels' names: the extension's, else their numbers ``"0"``, ``"1"``, ..."""
        names = self.extension.channel_names
        return list(names) if names else [str(i) for i in range(self.channels)]

    def times(self) -> np.ndarray:
        """The UTC time of each sample, ``datetime64[ns]`` (sample i at start + round(i / rate))."""
        offsets = np.round(np.arange(self.n_samples, dtype=np.float64) * (1e9 / self.sample_rate)).astype(np.int64)
        return (self.start_ns + offsets).astype("datetime64[ns]")


def as_ns(when: datetime | str | int | None) -> int | None:
    """``when`` as UTC epoch ns: an aware datetime, ISO 8601 text (UTC when it has no offset) or
    epoch ns; None stays None."""
    if when is None or isinstance(when, int):
        return when
    return epoch_ns(parse_datetime(when) if isinstance(when, str) else when)


def _us_text(micros: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def literal_prefix(pattern: str) -> str:
    """The part of ``fnmatch`` pattern ``pattern`` before its first wildcard."""
    cut = min((i for i, ch in enumerate(pattern) if ch in "*?["), default=len(pattern))
    return pattern[:cut]


@dataclass(frozen=True)
class _Bounds:
    """What a row must satisfy, in the table's microseconds: ``start_time < end_us`` and
    ``end_time > start_us`` (None: unbounded), ``source`` within ``[prefix, prefix + max char)``."""

    prefix: str
    exact: bool
    start_us: int | None
    end_us: int | None

    @classmethod
    def of(cls, pattern: str, start_ns: int | None, end_ns: int | None) -> _Bounds:
        prefix = literal_prefix(pattern)
        start_us = None if start_ns is None else start_ns // 1000  # end_time*1000 > start_ns
        end_us = None if end_ns is None else -(-end_ns // 1000)  # start_time*1000 < end_ns
        return cls(prefix, prefix == pattern, start_us, end_us)

    def file_predicate(self, columns: set[str]) -> str | None:
        """A delta-rs SQL predicate for the files that may hold a match (min/max statistics, the
        date partition). SQL, not tuple filters: a file whose ``end_time``s are all null must be
        kept (its ends are computed), and tuple filters have no ``IS NULL``."""
        clauses = []
        if self.prefix:
            clauses.append(f"source >= {_sql_text(self.prefix)} AND source < {_sql_text(self.prefix + _MAX_CHAR)}")
        if self.end_us is not None:
            clauses.append(f"start_time < '{_us_text(self.end_us)}'")
            if "date" in columns:
                clauses.append(f"date <= '{_us_text(self.end_us - 1)[:10]}'")
        if self.start_us is not None and "end_time" in columns:
            clauses.append(f"(end_time > '{_us_text(self.start_us)}' OR end_time IS NULL)")
        return " AND ".join(clauses) or None

    def row_filter(self, columns: set[str]):
        """A pyarrow expression for the rows that may match (row groups skipped by statistics)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        stamp = pa.timestamp("us", tz="UTC")
        where = pc.scalar(True)
        if self.exact:
            where &= pc.field("source") == self.prefix
        elif self.prefix:
            where &= (pc.field("source") >= self.prefix) & (pc.field("source") < self.prefix + _MAX_CHAR)
        if self.end_us is not None:
            where &= pc.field("start_time") < pa.scalar(self.end_us, stamp)
        if self.start_us is not None and "end_time" in columns:
            where &= (pc.field("end_time") > pa.scalar(self.start_us, stamp)) | pc.field("end_time").is_null()
        return where

    def overlaps(self, start_us: int, end_us: int) -> bool:
        return (self.end_us is None or start_us < self.end_us) and (self.start_us is None or end_us > self.start_us)


def _open_table(table_uri: str, storage_options: dict[str, str] | None):
    if storage_options is None:
        return delta_table(table_uri)
    from deltalake import DeltaTable

    return DeltaTable(table_uri, storage_options=storage_options)


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table``'s rows as dicts, timestamps as epoch microseconds, absent ``COLUMNS`` as None."""
    import pyarrow as pa

    for name in ("start_time", "end_time"):
        if name in table.column_names:
            index = table.column_names.index(name)
            table = table.set_column(index, name, table.column(name).cast(pa.int64()))
    rows = table.to_pylist()
    return [{name: row.get(name) for name in COLUMNS} for row in rows]


def _waveform(row: dict[str, Any]) -> Waveform:
    ext = {name: tuple(row[name]) for name in _LIST_FIELDS if row[name] is not None}
    ext |= {name: row[name] for name in _TEXT_FIELDS if row[name] is not None}
    samples = rebuild(row["payload"], row["dtype"], row["channels"])
    return Waveform(
        row["waveform_id"], row["source"], row["start_time"] * 1000, row["sample_rate"], samples, Extension(**ext)
    )


def _end_us(row: dict[str, Any]) -> int:
    """The row's end_time, or for a row of an older table without one, as the table computes it."""
    if row["end_time"] is not None:
        return row["end_time"]
    computed = end_us(row["start_time"] * 1000, row["n_samples"], row["sample_rate"])
    return MAX_TIME_US if computed is None else computed


def read_table(
    table_uri: str,
    source: str = "*",
    start: datetime | str | int | None = None,
    end: datetime | str | int | None = None,
    storage_options: dict[str, str] | None = None,
) -> list[Waveform]:
    """The waveforms of the table at ``table_uri`` whose source matches ``source`` (``fnmatch``,
    case-sensitive) and that overlap ``[start, end)`` (their first sample before ``end``, the
    instant after their last after ``start``; None: unbounded), ordered by source and start.

    ``start``/``end``: aware datetimes, ISO 8601 text (UTC when it has no offset) or UTC epoch ns.
    ``storage_options``: delta-rs's, for the table's store (None: wavepipe's configured ones)."""
    bounds = _Bounds.of(source, as_ns(start), as_ns(end))
    table = _open_table(table_uri, storage_options)
    columns = {f.name for f in table.schema().fields}
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=bounds.file_predicate(columns))
    read = dataset.to_table(columns=[c for c in COLUMNS if c in columns], filter=bounds.row_filter(columns))
    rows = [
        row
        for row in _rows(read)
        if fnmatch.fnmatchcase(row["source"], source) and bounds.overlaps(row["start_time"], _end_us(row))
    ]
    rows.sort(key=lambda row: (row["source"], row["start_time"], row["waveform_id"]))
    return [_waveform(row) for row in rows]


def to_xarray(waveform: Waveform):
    """``waveform`` as an xarray ``DataArray`` of dims ``("time", "channel")``: coords ``time``
    (``datetime64[ns]``) and ``channel`` (names, or ``"0"``, ``"1"``...); attrs ``source``,
    ``waveform_id``, ``sample_rate`` and, where the table has them, ``units``, ``calibration``,
    ``baseline`` (lists, one per channel), ``network``, ``station``, ``location``, ``format``."""
    xarray = require("xarray")
    ext = waveform.extension
    attrs: dict[str, Any] = {
        "source": waveform.source,
        "waveform_id": waveform.waveform_id,
        "sample_rate": waveform.sample_rate,
    }
    attrs |= {name: list(getattr(ext, name)) for name in ("units", "calibration", "baseline") if getattr(ext, name)}
    attrs |= {name: getattr(ext, name) for name in _TEXT_FIELDS if getattr(ext, name) is not None}
    return xarray.DataArray(
        waveform.samples,
        dims=("time", "channel"),
        coords={"time": waveform.times(), "channel": waveform.channel_names()},
        attrs=attrs,
    )


def read(
    table_uri: str,
    source: str = "*",
    start: datetime | str | int | None = None,
    end: datetime | str | int | None = None,
    *,
    as_: str = "numpy",
    storage_options: dict[str, str] | None = None,
):
    """``read_table``'s waveforms as ``as_`` says: ``"numpy"`` the ``Waveform``s (``.samples``),
    ``"obspy"`` one ``obspy.Stream`` (a trace per channel, ``seismic.to_stream``), ``"xarray"`` a
    ``DataArray`` per waveform (``to_xarray``)."""
    if as_ not in ("numpy", "obspy", "xarray"):
        raise ValueError(f"as_ must be 'numpy', 'obspy' or 'xarray', not {as_!r}")
    waveforms = read_table(table_uri, source, start, end, storage_options=storage_options)
    if as_ == "obspy":
        from wavepipe.recordings.seismic import to_stream

        return to_stream(waveforms)
    if as_ == "xarray":
        return [to_xarray(w) for w in waveforms]
    return waveforms
