"""The quality metrics against NumPy's own, on signals whose faults are known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from wavepipe.contracts.rows import QC_NAMES
from wavepipe.spark_apps.quality import (
    MEDIAN_SAMPLES,
    batch_metrics,
    channel_metrics,
    gaps_to_previous,
)

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dtype", ["<f4", ">f8", "<i2", "<i4", "<u1"])
def test_statistics_are_numpys(dtype):
    n = 5000
    x = (RNG.normal(50, 20, (n, 3))).clip(0, 120).astype(dtype)
    m = channel_metrics(x)
    as64 = x.astype(np.float64)
    np.testing.assert_allclose(m["qc_min"], as64.min(axis=0))
    np.testing.assert_allclose(m["qc_max"], as64.max(axis=0))
    np.testing.assert_allclose(m["qc_mean"], as64.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(m["qc_rms"], np.sqrt((as64**2).mean(axis=0)), rtol=1e-6)
    np.testing.assert_allclose(m["qc_std"], as64.std(axis=0), rtol=1e-5)
    step = n // MEDIAN_SAMPLES  # estimated from evenly spaced samples: NumPy's median of those
    np.testing.assert_array_equal(m["qc_median"], np.median(as64[::step], axis=0))
    assert m["qc_nan_share"] == [0.0, 0.0, 0.0] and m["qc_dead"] == [False] * 3


def test_a_short_channels_median_is_exact():
    x = RNG.normal(size=(MEDIAN_SAMPLES - 1, 2))
    assert channel_metrics(x)["qc_median"] == np.median(x, axis=0).tolist()


def test_nan_share_and_the_finite_samples_statistics():
    x = RNG.normal(size=(1000, 2)).astype(np.float32)
    x[:600, 1] = np.nan
    x[5, 0] = np.inf
    m = channel_metrics(x)
    assert m["qc_nan_share"] == [0.0, 0.6]
    finite = x[np.isfinite(x[:, 0]), 0].astype(np.float64)
    assert m["qc_max"][0] == finite.max() and m["qc_mean"][0] == pytest.approx(finite.mean())
    everything_nan = channel_metrics(np.full((10, 1), np.nan))
    assert everything_nan["qc_nan_share"] == [1.0] and everything_nan["qc_mean"] == [None]


def test_clipping_at_the_integer_types_extremes():
    lead = (RNG.normal(0, 8000, 10_000)).astype(np.int16)
    lead[100:250] = 32767  # saturated for 150 samples
    lead[400:450] = -32768
    floats = RNG.normal(size=10_000)
    m = channel_metrics(np.column_stack([lead, lead // 4]))
    assert m["qc_clipped_share"] == [0.02, 0.0]
    assert channel_metrics(floats[:, None])["qc_clipped_share"] == [0.0], "floats have no extremes of their own"


def test_a_dead_channel_is_constant_or_toggles_one_step():
    constant = np.full(2000, 812, np.int32)
    toggling = 812 + (RNG.random(2000) > 0.5).astype(np.int32)
    two_apart = 812 + 2 * (RNG.random(2000) > 0.5).astype(np.int32)
    live = RNG.normal(size=2000).astype(np.int32)
    m = channel_metrics(np.column_stack([constant, toggling, two_apart, live]))
    assert m["qc_dead"] == [True, True, False, False]
    extremes = np.iinfo(np.int64)
    swinging = np.where(np.arange(2000) % 2, extremes.max, extremes.min).astype(np.int64)  # full scale, not dead
    stuck = np.where(np.arange(2000) % 2, extremes.max, extremes.max - 1).astype(np.int64)
    assert channel_metrics(np.column_stack([swinging, stuck]))["qc_dead"] == [False, True]
    flat_float = np.full((500, 1), 1.25e-3)
    flat_float[::7] = np.nextafter(1.25e-3, 1)
    assert channel_metrics(flat_float)["qc_dead"] == [True]


def test_spikes_are_counted_as_runs_far_from_the_median():
    x = RNG.normal(0, 1, 20_000)
    x[1000] = 40.0  # one sample
    x[5000:5003] = -35.0  # one spike of three samples
    x[9000] = 9.0  # within 10 scaled MADs: not a spike
    x[0] = 50.0  # at the start
    x[12000:12040] = 30.0  # 40 samples: an excursion of the signal (an arrival, a QRS complex), not a spike
    assert channel_metrics(x[:, None])["qc_spikes"] == [3]
    assert channel_metrics(np.zeros((100, 1)))["qc_spikes"] == [0], "no spread, no spikes"


def test_a_batch_is_each_waveform_alone():
    waveforms = [RNG.normal(size=(256, 1)).astype(np.float32) for _ in range(7)]
    waveforms += [RNG.integers(-5, 5, size=(100, 3)).astype(np.int16), RNG.normal(size=(256, 1)).astype(np.float32)]
    waveforms[2][10, 0] = np.nan
    together = batch_metrics(list(waveforms))
    for i, w in enumerate(waveforms):
        alone = channel_metrics(w)
        assert {name: together[name][i].as_py() for name in QC_NAMES} == alone, i
    missing = batch_metrics([None, waveforms[0]])
    assert missing["qc_mean"][0].as_py() is None and missing["qc_mean"][1].as_py() == together["qc_mean"][0].as_py()


def _times(rows):
    stamp = pa.timestamp("us", tz="UTC")
    return pa.table(
        {
            "waveform_id": [r[0] for r in rows],
            "source": [r[1] for r in rows],
            "start_time": pa.array([r[2] * 1_000_000 for r in rows], pa.int64()).cast(stamp),
            "end_time": pa.array([None if r[3] is None else r[3] * 1_000_000 for r in rows], pa.int64()).cast(stamp),
        }
    )


def test_gaps_to_the_previous_waveform_of_the_source_in_the_run_or_before_it():
    earlier = _times([("old", "st-1", 0, 100), ("older", "st-2", 0, None)])
    run = _times(
        [
            ("a", "st-1", 110, 200),  # 10 s after the table's
            ("b", "st-1", 195, 300),  # overlaps a by 5 s
            ("late", "st-1", 50, 90),  # arrived late: after the table's "old", which it overlaps
            ("c", "st-2", 30, 60),  # its predecessor has no end_time: unknown
            ("d", "st-3", 0, 10),  # the first of its source
        ]
    )
    assert gaps_to_previous(run, earlier) == {"a": 20.0, "b": -5.0, "late": -50.0, "c": None, "d": None}


def test_rules_flag_rows_by_source_and_threshold():
    from wavepipe.contracts.quality import DEFAULT_RULES, parse_rules
    from wavepipe.spark_apps.quality import flags

    rules = parse_rules([*DEFAULT_RULES, {"name": "late_iu", "metric": "latency_s", "above": 300, "sources": "IU.*"}])
    waveforms = [
        np.column_stack([np.full(100, 7, np.int16), RNG.integers(-9, 9, 100).astype(np.int16)]),  # a dead lead
        np.where(np.arange(100) < 5, 32767, RNG.integers(-9, 9, 100)).astype(np.int16)[:, None],  # 5% clipped
        RNG.normal(size=(100, 1)),
        None,  # not measured
    ]
    columns = {
        **batch_metrics(waveforms),
        "gap_s": pa.array([0.0, 12.5, -3.0, None]),
        "latency_s": pa.array([400.0, 400.0, 10.0, None]),
    }
    got = flags(rules, ["ward-1", "IU.ANMO.00.BHZ", "IU.COR.00.BHZ", "IU.X"], columns).to_pylist()
    assert got == [["dead_channel"], ["clipped", "gap", "late_iu"], ["overlap"], []]


@pytest.mark.parametrize(
    "entry,says",
    [
        ({"name": "x", "metric": "qc_mena", "above": 1}, "metric must be one of"),
        ({"name": "Bad Name", "metric": "qc_mean", "above": 1}, "name must be"),
        ({"name": "x", "metric": "qc_mean"}, "needs a threshold"),
        ({"name": "x", "metric": "qc_dead", "above": 1}, "takes no above or below"),
        ({"name": "x", "metric": "gap_s", "above": "10"}, "above must be a finite number"),
        ({"name": "x", "metric": "gap_s", "above": 10, "severity": "page"}, "unknown keys ['severity']"),
    ],
)
def test_a_wrong_rule_is_refused_saying_what_is_wrong(entry, says):
    from wavepipe.contracts.quality import parse_rules

    with pytest.raises(ValueError, match="rule 1") as caught:
        parse_rules([entry])
    assert says in str(caught.value)
    with pytest.raises(ValueError, match="used twice"):
        parse_rules([{"name": "g", "metric": "gap_s", "above": 1}] * 2)


def test_a_runs_summary_puts_the_most_flagged_source_first():
    from wavepipe.contracts.quality import DEFAULT_RULES, parse_rules
    from wavepipe.spark_apps.quality import summarize

    rows = pa.table(
        {
            "source": ["a", "a", "b", "b", "b", "c"],
            "qc_flags": [[], ["gap"], ["dead_channel", "gap"], ["dead_channel"], [], None],
            "gap_s": [None, 12.0, 30.0, -2.0, 0.0, 100.0],
            "latency_s": [5.0, 6.0, 7.0, 8.0, 9.0, None],
            "qc_dead": [[False], [False], [True, False], [True, True], [False, False], None],
            "qc_spikes": [[0], [2], [1, 0], [0, 0], [0, 3], None],
            "qc_clipped_share": [[0.0], [0.02], [0.0, 0.0], [0.0, 0.5], [0.0, 0.0], None],
        }
    )
    summary = summarize(rows, parse_rules(DEFAULT_RULES))
    assert (summary["measured"], summary["flagged"], summary["sources_total"]) == (5, 3, 2), "c was not measured"
    assert summary["by_rule"] == {"gap": 2, "dead_channel": 2}
    b, a = summary["sources"]
    assert b == {
        "source": "b", "waveforms": 3, "flagged": 2, "flags": {"dead_channel": 2, "gap": 1}, "max_gap_s": 30.0,
        "max_overlap_s": 2.0, "dead_channels": 3, "spikes": 4, "max_clipped_share": 0.5, "max_latency_s": 9.0,
    }  # fmt: skip
    assert (a["flagged"], a["flags"], a["max_overlap_s"], a["spikes"]) == (1, {"gap": 1}, None, 2)
    assert [r["name"] for r in summary["rules"]][:2] == ["dead_channel", "clipped"]
