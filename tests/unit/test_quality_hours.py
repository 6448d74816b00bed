"""The qc table's rows per source and hour, from waveform rows (pure; the commit is tested with
real runs in tests/integration/test_recordings.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from wavepipe.spark_apps.quality_hours import HOUR_US, QC_TABLE_SCHEMA, as_rows, hourly, touched_hours

H0 = 1_700_000_000 // 3600 * HOUR_US  # an hour's start
MIN = 60_000_000


def _rows(*waveforms) -> pd.DataFrame:
    """(source, start minutes after H0, minutes long, gap_s, spikes, dead, flagged)"""
    return pd.DataFrame(
        [
            {
                "source": s,
                "start_time": H0 + int(a * MIN),
                "end_time": H0 + int((a + n) * MIN),
                "sample_rate": 100.0,
                "gap_s": np.nan if gap is None else gap,
                "spikes": spikes,
                "dead": dead,
                "flagged": flagged,
            }
            for s, a, n, gap, spikes, dead, flagged in waveforms
        ]
    )


def _by_hour(table: pa.Table) -> dict:
    assert table.schema == QC_TABLE_SCHEMA
    return {(r["source"], r["hour"].timestamp()): r for r in table.to_pylist()}


def test_contiguous_waveforms_cover_the_hour_once_and_a_long_one_every_hour_it_spans():
    rows = _rows(
        ("a", 0, 30, None, 0, False, False), ("a", 30, 30, 0.0, 2, False, False), ("b", 50, 70, None, 0, False, False)
    )
    hours = touched_hours(rows)
    assert list(zip(hours["source"], hours["hour"] - H0, strict=True)) == [("a", 0), ("b", 0), ("b", HOUR_US)]
    got = _by_hour(hourly(rows, hours, "r1"))
    a = got[("a", H0 / 1e6)]
    assert (a["waveforms"], a["availability_pct"], a["gaps"], a["overlaps"], a["spikes"]) == (2, 100.0, 0, 0, 2)
    assert a["max_gap_s"] is None and a["run_id"] == "r1"
    b0, b1 = got[("b", H0 / 1e6)], got[("b", H0 / 1e6 + 3600)]
    assert round(b0["availability_pct"], 6) == round(10 / 60 * 100, 6) and b1["availability_pct"] == 100.0
    assert b0["waveforms"] == b1["waveforms"] == 1


def test_gaps_and_overlaps_count_in_the_hour_after_them_and_overlapping_samples_count_once():
    rows = _rows(
        ("a", 0, 10, None, 0, False, False),
        ("a", 10 + 40 / 60, 10, 40.0, 0, False, True),  # a 40 s gap
        ("a", 20, 10, -20.0, 0, False, False),  # starts 20 s before the one before it ends
        ("a", 30, 0.001, 0.004, 0, False, False),  # 4 ms after: under half a sample (5 ms) is no gap
    )
    got = _by_hour(hourly(rows, touched_hours(rows), "r"))[("a", H0 / 1e6)]
    assert (got["gaps"], got["max_gap_s"], got["overlaps"], got["max_overlap_s"]) == (1, 40.0, 1, 20.0)
    covered_s = 30 * 60 - 40 + 0.06
    assert abs(got["availability_pct"] - covered_s / 3600 * 100) < 1e-9
    assert got["flagged"] == 1


def test_dead_minutes_and_an_hour_left_without_waveforms():
    rows = _rows(("a", 45, 30, None, 0, True, True))
    hours = pd.concat([touched_hours(rows), pd.DataFrame({"source": ["gone"], "hour": [H0]})], ignore_index=True)
    got = _by_hour(hourly(rows, hours, "r"))
    assert got[("a", H0 / 1e6)]["dead_minutes"] == 15.0 and got[("a", H0 / 1e6 + 3600)]["dead_minutes"] == 15.0
    assert got[("a", H0 / 1e6)]["flagged"] == 1 and got[("a", H0 / 1e6 + 3600)]["flagged"] == 0
    gone = got[("gone", H0 / 1e6)]
    assert (gone["waveforms"], gone["availability_pct"], gone["gaps"], gone["spikes"]) == (0, 0.0, 0, 0)


def test_rows_read_from_a_table_count_spikes_of_every_channel_and_end_after_their_samples_without_end_time():
    stamp = pa.timestamp("us", tz="UTC")
    table = pa.table(
        {
            "source": ["a", "a"],
            "start_time": pa.array([H0, H0 + MIN], pa.int64()).cast(stamp),
            "end_time": pa.array([H0 + MIN, None], pa.int64()).cast(stamp),
            "n_samples": [6000, 3000],
            "sample_rate": [100.0, 100.0],
            "gap_s": [None, 0.0],
            "qc_spikes": [[1, 2], None],
            "qc_dead": [[False, True], None],
            "qc_flags": [["dead_channel"], None],
        }
    )
    rows = as_rows(table)
    assert rows["end_time"].tolist() == [H0 + MIN, H0 + MIN + 30_000_000]
    assert rows["spikes"].tolist() == [3, 0] and rows["dead"].tolist() == [True, False]
    assert rows["flagged"].tolist() == [True, False]


def test_the_times_of_a_replaced_file_are_read_without_its_payload_also_from_an_earlier_layout(tmp_path):
    """A window run's replaced rows touch the qc table's hours too: their times come from the
    files its commit removed; a file of a table partitioned by source names it in its folder, a
    file written before ``end_time`` existed ends its rows at their start."""
    import pyarrow.parquet as pq

    from wavepipe.spark_apps.publish import _file_times

    stamp = pa.timestamp("us", tz="UTC")
    (tmp_path / "source=a%2Fb").mkdir()
    old = pa.table({"start_time": pa.array([H0, H0 + MIN], stamp), "payload": [b"x", b"y"]})
    pq.write_table(old, tmp_path / "source=a%2Fb" / "f.parquet")
    times = _file_times(str(tmp_path), "source=a%2Fb/f.parquet")
    assert times.column_names == ["source", "start_time", "end_time"]
    assert times["source"].to_pylist() == ["a/b", "a/b"] and times["end_time"] == times["start_time"]
