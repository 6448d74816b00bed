"""Steps that only describe a run (the waveform plot, the run's page, Data Docs, the trend) never
fail it: hostile waveforms are drawn, and any failure becomes a note in the report."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime

import numpy as np
import pytest

from tests.unit.test_report import CONSUMED, PLAN, _reassembled, validated
from wavepipe import plots, report_html
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.report import build_report, describe_safely
from wavepipe.contracts.runfiles import html_path, json_path
from wavepipe.spark_apps import validate

I64 = np.iinfo(np.int64)
#: name -> (samples (samples,) or (samples, channels), sample rate in Hz); all follow the protocol
HOSTILE = {
    "huge_range": (np.array([1.7e308, -1.7e308, 0, 1], "<f8"), 1.0),  # issue 15: the tick locator's arange
    "constant_huge": (np.full(8, 1.7e308, "<f8"), 1.0),
    "nan_and_inf": (np.array([np.nan, np.inf, -np.inf, 1.0, 2.0], "<f8"), 1.0),
    "all_nan": (np.full(4, np.nan, "<f4"), 1.0),
    "constant": (np.full(100, 3.0, "<f4"), 100.0),
    "one_sample": (np.array([5.0], "<f4"), 1.0),
    "denormal": (np.array([5e-324, -5e-324, 0.0], "<f8"), 1.0),
    "rate_1e-9": (np.arange(4.0), 1e-9),
    "rate_1e9": (np.arange(4.0), 1e9),
    "rate_smallest": (np.arange(4.0), 5e-324),
    "rate_largest": (np.arange(4.0), 1.7e308),
    "int64_extremes": (np.array([I64.min, I64.max, 0, -1], "<i8"), 1.0),
    "uint64_max": (np.array([0, 2**64 - 1], "<u8"), 1.0),
    "big_endian": (np.array([1, -1, 7], ">i2"), 1.0),
    "complex128": (np.array([1 + 2j, np.inf + 0j, 1.7e308 - 1.7e308j, 0], "<c16"), 1.0),
    "float16_inf": (np.array([65504, -65504, np.inf], "<f2"), 1.0),
    "channels_64": (np.random.default_rng(0).normal(size=(5000, 64)), 250.0),
    "channels_12_one_all_nan": (
        np.column_stack([np.full(100, np.nan), *np.random.default_rng(1).normal(size=(11, 100))]),
        500.0,
    ),
    "channels_3_flat": (np.zeros((50, 3)), 100.0),
    "channels_2_no_samples": (np.zeros((0, 2), "<f4"), 100.0),
    # long ones, drawn as lowest and highest per column: gaps, infinities and extremes inside runs
    "long_nan_inf": (
        np.where(np.arange(20_000) % 7 == 0, np.nan, np.where(np.arange(20_000) % 11 == 0, np.inf, 1.0)),
        50.0,
    ),
    "long_all_nan": (np.full((5000, 2), np.nan, "<f4"), 100.0),
    "long_int64_extremes": (np.tile(np.array([I64.min, I64.max], "<i8"), 3000), 1.0),
    "long_complex": (np.exp(1j * np.linspace(0, 100, 10_000)).astype("<c8"), 1e6),
}


#: Starts a plot may meet: none, epoch microseconds, a datetime, one before 1900, one no clock has.
STARTS = [None, 1_795_800_000_000_000, datetime(2026, 11, 27, 10, tzinfo=UTC), datetime(1677, 9, 22, tzinfo=UTC), 2**62]


def _row(name: str, samples: np.ndarray, rate: float, waveform_id: str | None = None, **more) -> dict:
    samples = samples if samples.ndim == 2 else samples[:, None]
    return {
        "waveform_id": waveform_id or name,
        "source": "s" * 500,
        "dtype": samples.dtype.str,
        "channels": samples.shape[1],
        "sample_rate": rate,
        "payload": samples.tobytes(),
        **more,
    }


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_plot_draws_every_waveform_the_protocol_allows(name, tmp_path):
    samples, rate = HOSTILE[name]
    notes: list[str] = []
    start = STARTS[sorted(HOSTILE).index(name) % len(STARTS)]
    row = _row(name, samples, rate, waveform_id="x" * 1000, start_time=start, calibration=[-1e300, 0.0])
    path = plots.plot_rows([row], tmp_path / "p.png", notes, rule="r" * 500)
    assert notes == []
    assert path == str(tmp_path / "p.png") and (tmp_path / "p.png").stat().st_size > 0


def test_plot_values_and_times_stay_finite_and_moderate():
    values, e, bad = plots.plottable(np.array([[1.7e308], [-1.7e308], [np.inf], [5e-324]]))
    assert e == 308 and bad == 1
    assert np.nanmax(np.abs(values)) < 10 and np.isnan(values[2, 0])
    values, e, _ = plots.plottable(np.array([[5e-324], [0.0]]))
    assert e == -324 and 1 <= values[0, 0] < 10
    for rate in (5e-324, 1e-9, 1.0, 1e9, 1.7e308):
        t, _ = plots.time_axis(4000, 2, rate)
        assert np.isfinite(t).all() and t[-1] < 1e6


def test_channels_are_stacked_in_lanes_that_do_not_overlap():
    rng = np.random.default_rng(2)
    # a 12-lead ECG's leads: near-identical shapes and levels, which drawn over each other are one blur
    base = np.sin(np.linspace(0, 20, 1000))
    leads = np.column_stack([base * (1 + 0.05 * i) + 0.02 * rng.normal(size=1000) + 3.0 for i in range(12)])
    lanes, spacing = plots.stacked(leads)
    assert spacing == pytest.approx(np.ptp(leads, axis=0).max())
    for c in range(12):
        assert np.abs(lanes[:, c] + c * spacing).max() <= spacing  # inside its own band, centred on it
        assert np.ptp(lanes[:, c]) == pytest.approx(np.ptp(leads[:, c]))  # shape and scale kept
    flat, spacing = plots.stacked(np.array([[np.nan, 1.0], [np.nan, 1.0]]))
    assert spacing == 1.0 and np.isnan(flat[:, 0]).all() and (flat[:, 1] == -1.0).all()


def test_each_channel_has_a_colour_and_a_label_of_its_own():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    labels = plots.channel_labels({"channels": 12}, list(range(12)))
    values = np.random.default_rng(3).normal(size=(100, 12))
    spacing = plots._draw(ax, np.arange(100.0), values, values, labels)
    colours = {line.get_color() for line in ax.get_lines()}
    assert len(ax.get_lines()) == 12 and len(colours) == 12
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"ch {c}" for c in range(1, 13)]
    assert spacing == pytest.approx(np.ptp(values, axis=0).max())
    ax = Figure().subplots()
    one = np.arange(5.0)[:, None]
    assert plots._draw(ax, np.arange(5.0), one, one, ["ch 1"]) is None  # one channel: its values


def test_channels_are_labelled_with_their_names_and_units_where_the_row_has_them():
    row = {"channels": 3, "channel_names": ["I", None, "V1"], "units": ["mV", "mV", None]}
    assert plots.channel_labels(row, [0, 1, 2]) == ["I (mV)", "ch 2 (mV)", "V1"]
    assert plots.channel_labels(row, [2]) == ["V1"]


def test_the_flagged_plot_picks_one_waveform_per_rule_and_the_channels_that_break_it():
    import pyarrow as pa

    from wavepipe.contracts.quality import parse_rules

    rows = pa.table(
        {
            "waveform_id": ["a", "b", "c", "d", "e"],
            "source": ["s2", "s1", "s1", "s3", "s4"],
            "start_time": [1, 2, 1, 1, 1],
            "qc_flags": [["dead"], ["dead", "gap"], ["gap"], [], ["late"]],
            "size_bytes": [10, 10, 10, 10, 64 * 1024 * 1024],
        }
    )
    # the most broken rule first (dead and gap twice each: by name), its first waveform by source;
    # then one not picked yet per rule; one too large to draw is left out
    ids = rows["waveform_id"].to_pylist()
    assert [ids[i] for i in plots.flagged_picks(rows)] == ["b", "c"]
    assert [ids[i] for i in plots.flagged_picks(rows, limit=1)] == ["b"]
    rules = {
        r.name: r
        for r in parse_rules([{"name": "dead", "metric": "qc_dead"}, {"name": "gap", "metric": "gap_s", "above": 10}])
    }
    row = {"channels": 3, "qc_flags": ["dead", "gap"], "qc_dead": [False, True, True], "gap_s": 40.0}
    assert plots.flagged_channels(row, rules) == [1, 2]
    assert plots.flagged_channels({**row, "qc_flags": ["gap"]}, rules) == [0, 1, 2], "a gap: the whole waveform"


def test_a_failing_plot_becomes_a_note_and_the_run_goes_on(tmp_path, monkeypatch):
    def broken(rows, path, rule=None):
        raise ValueError("arange: cannot compute length")

    monkeypatch.setattr(plots, "plot_waveforms", broken)
    notes: list[str] = []
    samples, rate = HOSTILE["huge_range"]
    assert plots.plot_rows([_row("h", samples, rate)], tmp_path / "p.png", notes) is None
    assert notes == ["the waveform plot failed: arange: cannot compute length"]


def test_the_guard_records_exceptions_and_lets_interrupts_through():
    notes: list[str] = []

    def fails():
        raise RuntimeError("first line\nsecond line")

    assert describe_safely(notes, "the thing", fails) is None
    assert describe_safely(notes, "the thing", lambda: 7) == 7
    assert notes == ["the thing failed: first line"]

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        describe_safely(notes, "the thing", interrupted)


def test_validation_notes_reach_the_report_and_its_page():
    validation = validated(notes=["the waveform plot failed: boom"])
    report = build_report(PLAN, CONSUMED, _reassembled(dead_letter=1), {}, validation=validation)
    assert report["notes"] == ["the waveform plot failed: boom"]
    assert "<li>the waveform plot failed: boom</li>" in report_html.render(report, trend=[])


def test_a_failing_page_or_trend_becomes_a_note_with_a_plain_page(tmp_path, monkeypatch):
    from wavepipe import pipeline

    settings = load_settings(home=tmp_path / "home")
    report = build_report(
        PLAN,
        CONSUMED,
        _reassembled(dead_letter=1),
        {},
        validation=validated(notes=["plot failed: x"]),
    )

    def broken(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(pipeline, "validation_trend", broken)
    monkeypatch.setattr(report_html, "write", broken)
    page = pipeline._write_report(settings, report)
    assert page == html_path(settings, PLAN.run_id) and page.exists()
    notes = json.loads(json_path(settings, PLAN.run_id).read_text())["notes"]
    assert notes == [
        "plot failed: x",
        "the validation trend failed: no space left on device",
        "the run's page failed: no space left on device",
    ]
    assert "the run's page failed" in html.unescape(page.read_text())
    assert "Error" not in " ".join(notes)


def test_the_plot_picks_the_longest_of_each_source_among_each_partitions_first_waveforms(monkeypatch):
    import pandas as pd

    checked = pd.DataFrame(
        {
            "waveform_id": ["late", "big", "first", "second", "other-partition", "far"],
            "source": ["a", "a", "a", "b", "c", "c"],
            "dtype": "<f4",
            "channels": 1,
            "sample_rate": 1.0,
            "checksum": "sha256:x",
            "written_from": "staged",
            "partition": [0, 0, 0, 0, 1, 1],
            "first_offset": [90, 1, 5, 7, 0, 10_000],
            "duration_s": [30.0, 99.0, 30.0, 10.0, 20.0, 500.0],
            "size_bytes": [10, plots._PLOT_MAX_BYTES + 1, 10, 10, 10, 10],
            "in_table": [False, True, False, False, False, False],
        },
        index=[7, 3, 9, 1, 4, 2],
    )
    picks = [p["waveform_id"] for p in plots.plot_picks(checked)]
    # c's longest (500 s), a's longest that can be drawn (30 s: the earliest of two), b's only one
    assert picks == ["far", "first", "second"]
    picks = [p["waveform_id"] for p in plots.plot_picks(checked, limit=5)]
    assert picks == ["far", "first", "second", "late", "other-partition"]  # then the next longest of any source
    assert plots.plot_picks(checked.iloc[:0]) == []
    monkeypatch.setattr(plots, "PLOT_CANDIDATES", 1)  # each partition's first only: its staged file read no further
    assert [p["waveform_id"] for p in plots.plot_picks(checked)] == ["first", "other-partition"]
    rule = plots.pick_rule(3, 1200)
    assert "3 of 1,200 waveforms" in rule and "longest of each source" in rule and "flagged" in rule
    assert validate._output_counts(checked) == {"rows": 6, "in_table": 1, "bytes": plots._PLOT_MAX_BYTES + 51}
