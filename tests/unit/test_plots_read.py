"""Plots a domain reader reads: titles in words (source, start in UTC, duration, channels and
sample rate; no NumPy type codes), channels by name in their physical units, UTC time on the x
axis, the rule that picked the waveforms in the figure, and a long waveform drawn as the lowest
and highest value per column, so no peak is lost and no trace is squeezed."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from wavepipe import plots

LEADS = ["I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"]


def _ecg(seconds: float = 44.0, rate: float = 500.0) -> dict:
    """A 12-lead ECG in ADC counts of 5 µV (0.005 mV per count), as WFDB records carry it."""
    t = np.arange(int(seconds * rate)) / rate
    beat = np.exp(-(((t % 0.8) - 0.3) ** 2) / 0.0004) + 0.1 * np.sin(2 * np.pi * 0.3 * t)
    counts = np.column_stack([beat * (1 + 0.1 * i) * 200 for i in range(12)]).astype("<i2")
    return {
        "waveform_id": "ecg-ward-1-0001",
        "source": "ward-1",
        "dtype": "<i2",
        "channels": 12,
        "sample_rate": rate,
        "payload": counts.tobytes(),
        "start_time": datetime(2026, 11, 27, 10, 0, tzinfo=UTC),
        "channel_names": LEADS,
        "units": ["mV"] * 12,
        "calibration": [0.005] * 12,
        "baseline": [0] * 12,
    }


def test_a_long_waveform_keeps_every_peak_as_the_lowest_and_highest_value_per_column():
    samples = np.zeros((1_000_003, 2), "<f4")
    samples[123_457, 0] = 9.0  # one spike: every k-th sample would miss it
    samples[999_999, 1] = -4.0
    samples[5, 1] = np.nan  # a gap inside a column: the column's other samples still count
    lows, highs, k = plots.envelope(samples, columns=800)
    assert k == 1251 and len(lows) == len(highs) == 800
    assert highs[:, 0].max() == 9.0 and highs[123_457 // k, 0] == 9.0
    assert lows[:, 1].min() == -4.0 and lows[0, 1] == 0.0
    short = np.arange(10.0)[:, None]
    assert plots.envelope(short, columns=800) == (short, short, 1)  # drawn sample by sample


def test_samples_are_drawn_in_their_physical_units_where_the_row_carries_a_calibration():
    lows, highs = np.array([[100.0, 100.0, 100.0]]), np.array([[200.0, 200.0, 200.0]])
    row = {"calibration": [0.005, -2.0], "baseline": [0, 150]}
    low, high, changed = plots.calibrated(lows, highs, row, [0, 1, 2])
    assert changed and low.tolist() == [[0.5, -100.0, 100.0]] and high.tolist() == [[1.0, 100.0, 200.0]]
    assert plots.calibrated(lows, highs, {}, [0, 1, 2])[2] is False
    assert plots.calibrated(lows, highs, {"calibration": [float("nan"), 0.0]}, [0, 1])[2] is False


def test_titles_say_source_start_duration_channels_and_rate_in_words():
    ecg = _ecg()
    title = plots._title(ecg, 22_000, list(range(12)), ["16-bit integers"])
    first, second = title.split("\n")
    assert first == "ward-1, from 2026-11-27 10:00:00.000 UTC, 44.0 s, 12 channels at 500 Hz", first
    assert second == "id ecg-ward-1-0001; 16-bit integers"
    assert plots._title({**ecg, "start_time": None, "why": "dead"}, 10, [0], []).startswith(
        "dead: ward-1, start unknown"
    )
    assert plots.sample_words(np.dtype(">i2")) == "16-bit integers"
    assert plots.sample_words(np.dtype("<c16")) == "128-bit complex numbers"
    words = [plots.duration_words(s) for s in (44.0, 725.0, 3600.0, 5 * 3600, 3 * 86400, 0.25, 4e-5, float("inf"))]
    assert words == ["44.0 s", "12 min 5 s", "1 h", "5 h", "3 days", "250 ms", "40 \u00b5s", "unknown duration"]


def test_the_figure_reads_in_leads_and_units_against_utc_time_with_its_rule_said():
    from matplotlib.dates import ConciseDateFormatter

    rule, ecg = plots.pick_rule(1, 40), _ecg()
    fig = plots.waveforms_figure([ecg], rule)
    (ax,) = fig.axes
    assert fig.get_suptitle().replace("\n", " ") == rule
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{lead} (mV)" for lead in LEADS]
    assert ax.get_xlabel() == "time (UTC)" and isinstance(ax.xaxis.get_major_formatter(), ConciseDateFormatter)
    title = ax.get_title(loc="left")
    assert "ward-1, from 2026-11-27 10:00:00.000 UTC, 44.0 s, 12 channels at 500 Hz" in title
    assert "<i2" not in title and "16-bit integers" in title and "calibrated" in title
    assert "each column: lowest to highest of 28 samples" in title
    lanes = float(title.split("lanes ")[1].split(" mV apart")[0])
    swing = np.ptp(np.frombuffer(ecg["payload"], "<i2").reshape(-1, 12), axis=0).max() * 0.005
    assert lanes == pytest.approx(swing, rel=0.01)  # the largest lead's swing, in mV (not in ADC counts)
    # drawn as columns, not 22,000 points squeezed together
    assert not ax.get_lines() and len(ax.collections) == 12
    start, end = ax.get_xlim()
    assert end - start == pytest.approx(44 / 86400, rel=0.1)  # days: matplotlib's dates


def test_a_waveform_of_no_known_start_is_drawn_against_seconds():
    row = {**_ecg(seconds=2.0), "start_time": None, "units": None, "channel_names": None, "calibration": None}
    (ax,) = plots.waveforms_figure([row]).axes
    assert ax.get_xlabel() == "seconds"
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["ch 1", "ch 2"]
    assert "lanes" in ax.get_title(loc="left") and " mV " not in ax.get_title(loc="left")


def test_the_png_carries_its_rule_and_words_for_a_reader_that_cannot_see_it(tmp_path):
    from PIL import Image

    rule = plots.pick_rule(1, 1)
    path = plots.plot_waveforms([_ecg(seconds=10.0)], tmp_path / "p.png", rule)
    text = Image.open(path).text
    assert text["Title"] == rule
    assert text["Description"].split("\n") == [
        "ward-1, from 2026-11-27 10:00:00.000 UTC, 10.0 s, 12 channels at 500 Hz",
        "id ecg-ward-1-0001; 16-bit integers; calibrated; each column: lowest to highest of 7 samples; "
        + text["Description"].split("samples; ")[1].split("\n")[0],
        "channels: " + ", ".join(f"{lead} (mV)" for lead in LEADS),
        "x axis: time (UTC)",
    ]


def test_a_waveform_of_up_to_two_samples_per_column_is_drawn_sample_by_sample():
    samples = np.arange(2 * plots.PLOT_COLUMNS, dtype="<f4")[:, None]
    assert plots.envelope(samples)[2] == 1
    assert plots.envelope(np.vstack([samples, samples[:1]]))[2] == 3
