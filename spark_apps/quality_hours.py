"""Quality per source and hour: the rows of the ``qc`` table (docs/quality.md, "The qc table").

A row is recomputed whole from the waveforms table's rows that cover its hour, never added to:
it says the same whichever runs published its waveforms and in which order, and a retried or
replayed update writes the same row again. The measures follow MUSTANG's daily metrics, per hour:

* ``waveforms``: the waveforms covering some of the hour;
* ``availability_pct``: the share of the hour the waveforms' samples cover (their union, so two
  overlapping waveforms count once), of the whole hour, also while it is still going on;
* ``gaps``, ``max_gap_s``, ``overlaps``, ``max_overlap_s``: the gaps and overlaps (``gap_s`` of
  the waveform after them) longer than half a sample, counted in the hour the waveform after them
  starts in; a gap to a waveform of an earlier hour is counted too;
* ``spikes``: the waveforms' spikes (every channel's), in the hour each waveform starts in;
* ``dead_minutes``: the minutes of the hour covered by waveforms with a dead channel;
* ``flagged``: the waveforms starting in the hour that break a quality rule.

Pure pandas and NumPy; the reading and the commit are ``publish.update_qc``'s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

HOUR_US = 3_600_000_000
_STAMP = pa.timestamp("us", tz="UTC")

#: The ``qc`` table's columns; a row per (``source``, ``hour``), the hour by its start.
QC_TABLE_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), False),
        pa.field("hour", _STAMP, False),
        pa.field("waveforms", pa.int64(), False),
        pa.field("availability_pct", pa.float64(), False),
        pa.field("gaps", pa.int64(), False),
        pa.field("max_gap_s", pa.float64(), True),
        pa.field("overlaps", pa.int64(), False),
        pa.field("max_overlap_s", pa.float64(), True),
        pa.field("spikes", pa.int64(), False),
        pa.field("dead_minutes", pa.float64(), False),
        pa.field("flagged", pa.int64(), False),
        pa.field("run_id", pa.string(), False),
    ]
)
QC_KEYS = ["source", "hour"]
#: The waveforms table's columns a row is computed from.
READ_COLUMNS = [
    "source",
    "start_time",
    "end_time",
    "n_samples",
    "sample_rate",
    "gap_s",
    "qc_spikes",
    "qc_dead",
    "qc_flags",
]


def touched_hours(rows: pd.DataFrame) -> pd.DataFrame:
    """``source``, ``hour`` (epoch microseconds of its start) of every hour ``rows`` (``source``,
    ``start_time``, ``end_time`` as epoch microseconds) cover some of; a waveform without duration
    touches the hour it starts in. Each once, sorted."""
    if rows.empty:
        return pd.DataFrame({"source": pd.Series(dtype=object), "hour": pd.Series(dtype=np.int64)})
    cover = _hour_pieces(rows)
    return cover[QC_KEYS].drop_duplicates().sort_values(QC_KEYS, ignore_index=True)


def epoch_times(times: pa.Table) -> pd.DataFrame:
    """``source``, ``start_time``, ``end_time`` (Arrow timestamps; an end missing: the start) as
    ``touched_hours`` takes them."""
    import pyarrow.compute as pc

    start = times["start_time"].cast(pa.int64())
    end = pc.coalesce(times["end_time"].cast(pa.int64()), start)
    return pd.DataFrame(
        {
            "source": times["source"].to_numpy(zero_copy_only=False),
            "start_time": start.to_numpy(),
            "end_time": end.to_numpy(),
        }
    )


def _hour_pieces(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` cut at the hours' edges: per row and hour it covers, ``row`` (its position),
    ``source``, ``hour`` and the piece's ``begin``, ``end`` (epoch microseconds)."""
    start = rows["start_time"].to_numpy(np.int64)
    end = np.maximum(rows["end_time"].to_numpy(np.int64), start)
    first, last = start // HOUR_US, np.maximum(end - 1, start) // HOUR_US
    counts = last - first + 1
    row = np.repeat(np.arange(len(rows)), counts)
    hour = (first[row] + np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)) * HOUR_US
    return pd.DataFrame(
        {
            "row": row,
            "source": rows["source"].to_numpy(object)[row],
            "hour": hour,
            "begin": np.maximum(start[row], hour),
            "end": np.minimum(end[row], hour + HOUR_US),
        }
    )


def as_rows(table: pa.Table) -> pd.DataFrame:
    """The waveforms table's ``READ_COLUMNS`` as ``hourly`` takes them: times as epoch
    microseconds (a row without ``end_time``, written before it, ends after its samples), per row
    its spikes, whether a channel is dead and whether it is flagged."""
    import pyarrow.compute as pc

    start = table["start_time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    samples_us = (
        pc.divide(table["n_samples"].cast(pa.float64()), table["sample_rate"]).to_numpy(zero_copy_only=False) * 1e6
    )
    end = table["end_time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    end = np.where(np.isnan(end.astype(float)), start + np.round(samples_us), end).astype(np.int64)
    parents = pc.list_parent_indices(table["qc_spikes"]).to_numpy()
    spikes = np.bincount(parents, pc.list_flatten(table["qc_spikes"]).to_numpy(), minlength=table.num_rows)
    dead_parents = pc.list_parent_indices(table["qc_dead"]).to_numpy()
    dead_values = pc.list_flatten(table["qc_dead"]).to_numpy(zero_copy_only=False).astype(bool)
    dead = np.bincount(dead_parents, dead_values, minlength=table.num_rows) > 0
    flagged = pc.fill_null(pc.list_value_length(table["qc_flags"]), 0).to_numpy() > 0
    return pd.DataFrame(
        {
            "source": table["source"].to_numpy(zero_copy_only=False),
            "start_time": start,
            "end_time": end,
            "sample_rate": table["sample_rate"].to_numpy(zero_copy_only=False),
            "gap_s": table["gap_s"].to_numpy(zero_copy_only=False).astype(float),
            "spikes": spikes.astype(np.int64),
            "dead": dead,
            "flagged": flagged,
        }
    )


def hourly(rows: pd.DataFrame, hours: pd.DataFrame, run_id: str) -> pa.Table:
    """The ``qc`` table's row of each of ``hours`` (``touched_hours``), from ``rows`` (``as_rows``:
    every waveform of those sources that covers some of those hours, and those starting in them;
    others are ignored). An hour no waveform covers any more gets a row of zeros. ``run_id``: the
    run that computed them."""
    pieces = _hour_pieces(rows).merge(hours, on=QC_KEYS)
    pieces = pieces.sort_values(["source", "hour", "begin"], ignore_index=True)
    reached = pieces.groupby(QC_KEYS)["end"].cummax()
    before = reached.groupby([pieces["source"], pieces["hour"]]).shift(1).fillna(np.iinfo(np.int64).min)
    pieces["covered"] = (pieces["end"] - np.maximum(pieces["begin"], before.astype(np.int64))).clip(lower=0)
    pieces["dead_us"] = np.where(rows["dead"].to_numpy()[pieces["row"]], pieces["end"] - pieces["begin"], 0)
    cover = pieces.groupby(QC_KEYS).agg(
        waveforms=("row", "nunique"), covered=("covered", "sum"), dead_us=("dead_us", "sum")
    )
    starting = rows.assign(hour=rows["start_time"] // HOUR_US * HOUR_US)
    half = 0.5 / starting["sample_rate"].where(starting["sample_rate"] > 0)
    starting["gap"] = starting["gap_s"].where(starting["gap_s"] > half)
    starting["overlap"] = (-starting["gap_s"]).where(starting["gap_s"] < -half)
    counted = starting.groupby(QC_KEYS).agg(
        gaps=("gap", "count"),
        max_gap_s=("gap", "max"),
        overlaps=("overlap", "count"),
        max_overlap_s=("overlap", "max"),
        spikes=("spikes", "sum"),
        flagged=("flagged", "sum"),
    )
    out = hours.join(cover, on=QC_KEYS).join(counted, on=QC_KEYS)
    zeros = ["waveforms", "covered", "dead_us", "gaps", "overlaps", "spikes", "flagged"]
    out[zeros] = out[zeros].fillna(0)
    return pa.table(
        {
            "source": out["source"].astype(str),
            "hour": pa.array(out["hour"].astype(np.int64), pa.int64()).cast(_STAMP),
            "waveforms": out["waveforms"].astype(np.int64),
            "availability_pct": out["covered"].astype(float) / HOUR_US * 100,
            "gaps": out["gaps"].astype(np.int64),
            "max_gap_s": pa.array(out["max_gap_s"].astype(float), pa.float64(), from_pandas=True),
            "overlaps": out["overlaps"].astype(np.int64),
            "max_overlap_s": pa.array(out["max_overlap_s"].astype(float), pa.float64(), from_pandas=True),
            "spikes": out["spikes"].astype(np.int64),
            "dead_minutes": out["dead_us"].astype(float) / 60e6,
            "flagged": out["flagged"].astype(np.int64),
            "run_id": [run_id] * len(out),
        },
        schema=QC_TABLE_SCHEMA,
    )
