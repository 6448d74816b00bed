"""A waveform's quality metrics, computed from its samples where its row is made. Pure NumPy.

Per channel, on the samples as stored (counts, not physical units):

* ``qc_min``, ``qc_max``, ``qc_mean``, ``qc_median``, ``qc_rms`` (sqrt of the mean square, MUSTANG's
  ``sample_rms``), ``qc_std`` (RMS about the mean: SeisComP scqc's ``rms``; the mean is its
  ``offset``, the DC offset): over the finite samples (NaN and infinities left out);
* ``qc_nan_share``: the share of samples that are NaN (float types; 0 for integers);
* ``qc_clipped_share``: the share at the type's extremes (integer types: a digitizer or an
  amplifier saturating at its range); floats have none of their own;
* ``qc_dead``: constant or near-constant: every sample one of at most two adjacent values (one
  quantization step: the least significant bit toggling on a dead channel);
* ``qc_spikes``: discrete spikes, runs of consecutive samples further than ``SPIKE_MADS`` scaled
  median absolute deviations from the median (a MAD rule as MUSTANG's ``num_spikes``, over the
  whole waveform rather than its rolling 41-sample Hampel window; none when the MAD is 0).

``qc_median`` and the MAD are estimated from ``MEDIAN_SAMPLES`` evenly spaced samples of a longer
channel (exact for a channel that short): an exact median partitions every sample, about 25 ns a
sample with its MAD on this machine (6 s per GiB of float32), more than all the other metrics
together (about 1 ms per MiB). The other metrics are exact. Waveforms of one shape and dtype are
computed together (``batch_metrics``): a batch of small ones costs a few NumPy calls, not a few
per waveform.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wavepipe.contracts.quality import QualityRule
from wavepipe.contracts.rows import QC_FIELDS, QC_NAMES

#: A spike is further than this many scaled MADs (1.4826 x MAD: a normal distribution's sigma)
#: from the median.
SPIKE_MADS = 10.0
#: A spike lasts at most this many samples; a longer excursion is the signal's.
SPIKE_MAX_SAMPLES = 3
#: The MAD of normally distributed samples times this is their standard deviation.
MAD_SCALE = 1.4826
#: Samples a channel's median and MAD are estimated from (all of a shorter channel).
MEDIAN_SAMPLES = 256

_NUMPY = {pa.float64(): np.float64, pa.bool_(): np.bool_, pa.int64(): np.int64}
#: How far before a run's first waveform of a source its predecessor is looked for.
GAP_LOOKBACK_S = 86_400


def channel_metrics(samples: np.ndarray) -> dict[str, list]:
    """``QC_NAMES`` -> one value per channel of ``samples`` ((n, channels), any numeric dtype)."""
    return {name: values[0].as_py() for name, values in batch_metrics([samples]).items()}


def batch_metrics(waveforms: list[np.ndarray | None]) -> dict[str, pa.ListArray]:
    """``QC_NAMES`` -> for each of ``waveforms`` ((n, channels) arrays; None: not measured, a
    null) its per-channel values (``channel_metrics``), as the Arrow column of a row. Waveforms
    of one shape and dtype are measured together; one holding NaN or infinities alone, over its
    finite samples."""
    channels = np.array([0 if w is None else w.shape[1] for w in waveforms], np.int64)
    offsets = np.zeros(len(waveforms) + 1, np.int64)
    np.cumsum(channels, out=offsets[1:])
    flat = {f.name: np.zeros(offsets[-1], _NUMPY[f.type.value_type]) for f in QC_FIELDS}
    groups: dict[tuple, list[int]] = {}
    for i, w in enumerate(waveforms):
        if w is not None:
            groups.setdefault((w.shape, w.dtype.str), []).append(i)
    for members in groups.values():
        size = waveforms[members[0]].size
        per_block = _BLOCK_SAMPLES // size if size <= _SMALL else 1
        for start in range(0, len(members), per_block):
            rows = members[start : start + per_block]
            _fill(flat, offsets[rows], _block([waveforms[i] for i in rows]))
    missing = pa.array([w is None for w in waveforms])
    return {
        f.name: pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(flat[f.name], f.type.value_type, from_pandas=True), mask=missing
        )
        for f in QC_FIELDS
    }


#: Samples (all channels) of the small waveforms (up to ``_SMALL`` samples) whose metrics are
#: computed together, copied into one block; a larger waveform is measured where it lies.
_BLOCK_SAMPLES, _SMALL = 1 << 20, 1 << 16


def _block(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` (of one shape and dtype) as one (waveforms, n, channels) array: a view where
    they lie one after another in one buffer (the rows of one output batch's payload column),
    else a copy."""
    first = arrays[0]
    if len(arrays) == 1:
        return first[None]
    start, step = first.__array_interface__["data"][0], first.nbytes
    adjacent = first.flags.c_contiguous and all(
        a.__array_interface__["data"][0] == start + k * step for k, a in enumerate(arrays)
    )
    if not adjacent:
        return np.stack(arrays)
    return np.lib.stride_tricks.as_strided(first, (len(arrays), *first.shape), (step, *first.strides), writeable=False)


def _fill(flat: dict[str, np.ndarray], starts: np.ndarray, block: np.ndarray) -> None:
    """The metrics of ``block`` ((waveforms, n, channels)) into ``flat``, each waveform's
    channels from its place in ``starts`` on (a NaN float: no value, a null)."""
    if block.dtype.kind == "c":  # complex: judged by magnitude
        block = np.abs(block)
    waveforms, n, channels = block.shape
    series = np.ascontiguousarray(block.transpose(0, 2, 1)).reshape(waveforms * channels, n)  # one row a channel
    lo, hi = series.min(axis=1), series.max(axis=1)  # NaN and infinities show here: no pass of their own
    if block.dtype.kind == "f" and not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        finite = (np.isfinite(lo) & np.isfinite(hi)).reshape(waveforms, channels).all(axis=1)
        for r in np.flatnonzero(~finite):
            for name, values in _with_non_finite(block[r]).items():
                flat[name][starts[r] : starts[r] + channels] = [np.nan if v is None else v for v in values]
        keep = np.repeat(finite, channels)
        starts, series, lo, hi = starts[finite], series[keep], lo[keep], hi[keep]
    if not len(starts):
        return
    places = (starts[:, None] + np.arange(channels)).ravel()
    for name, values in _block_metrics(series, lo, hi).items():
        flat[name][places] = values


def _block_metrics(series: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
    """``QC_NAMES`` -> one value per row of ``series`` ((channels, n): a channel a row, finite;
    ``lo`` and ``hi`` its rows' minimum and maximum)."""
    n = series.shape[1]
    mean = np.add.reduce(series, axis=1, dtype=np.float64) / n
    square = _mean_square(series)
    median, mad = _median_and_mad(series)
    return {
        "qc_min": lo.astype(np.float64),
        "qc_max": hi.astype(np.float64),
        "qc_mean": mean,
        "qc_median": median,
        "qc_rms": np.sqrt(square),
        "qc_std": np.sqrt(np.maximum(square - mean * mean, 0.0)),
        "qc_nan_share": np.zeros_like(mean),
        "qc_clipped_share": _clipped(series) / n,
        "qc_dead": _dead(series, lo, hi),
        "qc_spikes": _spikes(series, median, mad, lo, hi),
    }


def _mean_square(series: np.ndarray) -> np.ndarray:
    """Each row's mean square, accumulated in float64 (cast in einsum's buffers: no float64 copy)."""
    return np.einsum("rn,rn->r", series, series, dtype=np.float64) / series.shape[1]


def _with_non_finite(w: np.ndarray) -> dict[str, list]:
    """Per-channel metrics of a float waveform ((n, channels)) holding NaN or infinities: each
    channel over its finite samples, its NaN share over all."""
    per_channel = []
    for c in range(w.shape[1]):
        x = w[:, c]
        finite = x[np.isfinite(x)]
        if len(finite):
            row = finite[None, :]
            one = {name: values[0].item() for name, values in _block_metrics(row, row.min(1), row.max(1)).items()}
            one["qc_clipped_share"] *= len(finite) / len(x)
        else:
            one = dict.fromkeys(QC_NAMES) | {"qc_dead": False, "qc_spikes": 0, "qc_clipped_share": 0.0}
        one["qc_nan_share"] = float(np.count_nonzero(np.isnan(x))) / len(x)
        per_channel.append(one)
    return {name: [m[name] for m in per_channel] for name in QC_NAMES}


def _median_and_mad(series: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    step = max(1, series.shape[1] // MEDIAN_SAMPLES)
    sample = series[:, ::step].astype(np.float64)
    median = _middle(sample)
    return median, _middle(np.abs(sample - median[:, None]))


def _middle(rows: np.ndarray) -> np.ndarray:
    """Each row's median (as ``np.median``: the mean of the two middle values of an even count),
    by a sort: for rows this short, several times faster than ``np.median``'s partition."""
    ordered = np.sort(rows, axis=1)
    m = rows.shape[1]
    return (ordered[:, (m - 1) // 2] + ordered[:, m // 2]) / 2


def _clipped(series: np.ndarray) -> np.ndarray:
    """Samples at the integer type's extremes, per row."""
    if series.dtype.kind not in "iu":
        return np.zeros(len(series), np.float64)
    info = np.iinfo(series.dtype)
    return np.count_nonzero((series == info.min) | (series == info.max), axis=1).astype(np.float64)


def _dead(series: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Constant, or two adjacent values only (one step of the type: 1 for integers, one float
    spacing)."""
    if series.dtype.kind in "iu":
        # modulo 2**64 the difference is exact for every integer type (int64's extremes overflow int64)
        near = hi.astype(np.uint64) - lo.astype(np.uint64) <= 1
    else:
        near = (hi - lo) <= np.spacing(np.maximum(np.abs(lo), np.abs(hi)))
    dead = lo == hi
    if (near & ~dead).any():  # two adjacent values: is every sample one of them?
        edges = np.count_nonzero((series == lo[:, None]) | (series == hi[:, None]), axis=1)
        dead |= near & (edges == series.shape[1])
    return dead


def _spikes(series: np.ndarray, median: np.ndarray, mad: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, the runs of at most ``SPIKE_MAX_SAMPLES`` consecutive samples further than
    ``SPIKE_MADS`` scaled MADs from the median (none where the MAD is 0): a glitch, not an
    excursion of the signal (an earthquake's arrival, an ECG's QRS complex), which lasts longer.
    Only rows whose extremes reach that far are looked through."""
    threshold = np.where(mad > 0, SPIKE_MADS * MAD_SCALE * mad, np.inf)
    above, below = median + threshold, median - threshold
    reach = np.flatnonzero((hi > above) | (lo < below))
    counts = np.zeros(len(series), np.int64)
    if not len(reach):
        return counts
    far = (series[reach] > above[reach, None]) | (series[reach] < below[reach, None])
    edges = np.diff(far.astype(np.int8), axis=1, prepend=0, append=0)
    start_rows, start_cols = np.nonzero(edges == 1)
    _, end_cols = np.nonzero(edges == -1)  # row-major: the n-th end closes the n-th start
    narrow = (end_cols - start_cols) <= SPIKE_MAX_SAMPLES
    counts[reach] = np.bincount(start_rows[narrow], minlength=len(reach))
    return counts


def gaps_to_previous(run: pa.Table, earlier: pa.Table) -> dict[str, float | None]:
    """``gap_s`` of each waveform of ``run`` (``waveform_id``, ``source``, ``start_time``,
    ``end_time``, times in microseconds): its start minus the end of the waveform of its source
    that starts last before it, among ``run`` and ``earlier`` (the table's, same columns); None
    where there is none. Waveforms starting together are taken in id order."""
    import pyarrow.compute as pc

    columns = ["waveform_id", "source", "start_time", "end_time"]
    both = pa.concat_tables(
        [
            earlier.select(columns).append_column("mine", pa.repeat(False, earlier.num_rows)),
            run.select(columns).append_column("mine", pa.repeat(True, run.num_rows)),
        ],
        promote_options="permissive",
    )
    order = pc.sort_indices(both, [("source", "ascending"), ("start_time", "ascending"), ("waveform_id", "ascending")])
    both = both.take(order)
    source = both["source"].to_numpy(zero_copy_only=False)
    start = both["start_time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    end = both["end_time"].cast(pa.int64()).fill_null(np.iinfo(np.int64).min).to_numpy(zero_copy_only=False)
    follows = np.zeros(len(source), bool)
    follows[1:] = (source[1:] == source[:-1]) & (end[:-1] != np.iinfo(np.int64).min)
    gap = np.full(len(source), np.nan)
    gap[1:] = (start[1:] - end[:-1]) / 1e6
    mine = both["mine"].to_numpy(zero_copy_only=False)
    ids = both["waveform_id"].to_pylist()
    return {ids[i]: (float(gap[i]) if follows[i] else None) for i in np.flatnonzero(mine)}


#: Sources a run's quality summary lists (the worst first); the counts cover all.
SUMMARY_SOURCES = 50
#: The columns ``summarize`` reads of the rows a run published.
SUMMARY_COLUMNS = ["source", "qc_flags", "gap_s", "latency_s", "qc_dead", "qc_spikes", "qc_clipped_share"]


def summarize(rows: pa.Table, rules: tuple = ()) -> dict:
    """What a run's published rows (``SUMMARY_COLUMNS``) say of their quality: how many were
    measured and flagged, per rule; per source (the ``SUMMARY_SOURCES`` most flagged first): its
    waveforms, flags per rule, the largest gap and overlap (seconds), dead channels, spikes, the
    largest clipped share and latency. Computed by Arrow and NumPy: a run of 65,536 waveforms
    costs milliseconds."""
    import pyarrow.compute as pc

    rows = rows.filter(pc.is_valid(rows["qc_flags"]))  # measured
    n = rows.num_rows
    names = pc.list_flatten(rows["qc_flags"]).to_numpy(zero_copy_only=False).astype(str)
    named_rows = pc.list_parent_indices(rows["qc_flags"]).to_numpy()
    gap = rows["gap_s"].fill_null(0.0).to_numpy(zero_copy_only=False)
    per_row = {
        "source": rows["source"],
        "waveforms": np.ones(n, np.int64),
        "flagged": np.bincount(named_rows, minlength=n) > 0,
        "max_gap_s": np.where(gap > 0, gap, np.nan),
        "max_overlap_s": np.where(gap < 0, -gap, np.nan),
        "dead_channels": _per_row(rows["qc_dead"], n, np.add),
        "spikes": _per_row(rows["qc_spikes"], n, np.add),
        "max_clipped_share": _per_row(rows["qc_clipped_share"], n, np.maximum),
        "max_latency_s": rows["latency_s"].fill_null(np.nan).to_numpy(zero_copy_only=False),
    }
    rule_names = sorted(set(names.tolist()))
    for name in rule_names:
        per_row[f"flag:{name}"] = np.bincount(named_rows[names == name], minlength=n)
    table = pa.table({k: pa.array(v, from_pandas=True) if isinstance(v, np.ndarray) else v for k, v in per_row.items()})
    sums = [
        c
        for c in table.column_names
        if c in ("waveforms", "flagged", "dead_channels", "spikes") or c.startswith("flag:")
    ]
    maxima = [c for c in table.column_names if c.startswith("max_")]
    grouped = table.group_by("source").aggregate([(c, "sum") for c in sums] + [(c, "max") for c in maxima])
    sources = [_source_entry(r, rule_names) for r in grouped.to_pylist()]
    worst = sorted(sources, key=lambda s: (-s["flagged"], -s["dead_channels"], s["source"]))
    return {
        "measured": n,
        "flagged": int(per_row["flagged"].sum()),
        "by_rule": {name: int((names == name).sum()) for name in sorted(rule_names, key=lambda m: -(names == m).sum())},
        "rules": [
            {"name": r.name, "when": r.describe(), "sources": r.sources, "quarantine": r.quarantine} for r in rules
        ],
        "sources": worst[:SUMMARY_SOURCES],
        "sources_total": len(sources),
    }


def _per_row(column: pa.Array, n: int, how: np.ufunc) -> np.ndarray:
    """A per channel list column reduced to one number a row (``np.add``: the sum, ``np.maximum``)."""
    import pyarrow.compute as pc

    out = np.zeros(n, np.float64)
    values = pc.list_flatten(column).cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
    how.at(out, pc.list_parent_indices(column).to_numpy(), values)
    return out


def _source_entry(grouped: dict, rule_names: list[str]) -> dict:
    def number(key: str):
        value = grouped[key]
        return None if value is None or value != value else value  # NaN: none

    return {
        "source": grouped["source"],
        "waveforms": int(grouped["waveforms_sum"]),
        "flagged": int(grouped["flagged_sum"]),
        "flags": {n: int(grouped[f"flag:{n}_sum"]) for n in rule_names if grouped[f"flag:{n}_sum"]},
        "max_gap_s": number("max_gap_s_max"),
        "max_overlap_s": number("max_overlap_s_max"),
        "dead_channels": int(grouped["dead_channels_sum"]),
        "spikes": int(grouped["spikes_sum"]),
        "max_clipped_share": number("max_clipped_share_max") or 0.0,
        "max_latency_s": number("max_latency_s_max"),
    }


def flags(rules: Sequence[QualityRule], sources: Sequence[str], columns: Mapping[str, pa.Array]) -> pa.ListArray:
    """Per row (of ``sources`` and the quality ``columns``: name -> its Arrow column), the names of
    the ``rules`` it breaks, in the rules' order (a row not measured: an empty list)."""
    hits = np.zeros((len(sources), len(rules)), bool)  # a row per row, a column per rule
    for i, rule in enumerate(rules):
        hits[:, i] = _matching(rule.sources, sources) & _breaks(rule, columns[rule.metric])
    offsets = np.zeros(len(sources) + 1, np.int32)
    np.cumsum(hits.sum(axis=1), out=offsets[1:])
    names = np.array([rule.name for rule in rules] or [""], object)[np.nonzero(hits)[1]]  # row by row, in rule order
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(names, pa.string()))


def _matching(pattern: str, sources: Sequence[str]) -> np.ndarray:
    if pattern == "*":
        return np.ones(len(sources), bool)
    matches = {s: fnmatch.fnmatchcase(s, pattern) for s in set(sources)}
    return np.array([matches[s] for s in sources], bool)


def _breaks(rule: QualityRule, column: pa.Array) -> np.ndarray:
    """Per row of ``column`` (a per channel list, or one value a row), whether any value breaks
    ``rule``; a null breaks nothing."""
    rows = np.zeros(len(column), bool)
    if pa.types.is_list(column.type):
        parents = pc.list_parent_indices(column).to_numpy()
        values = pc.list_flatten(column)
    else:
        parents, values = np.arange(len(column)), column
    if rule.boolean:
        hit = values.fill_null(False).to_numpy(zero_copy_only=False)
    else:
        v = values.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        hit = np.zeros(len(v), bool)
        if rule.above is not None:
            hit |= v > rule.above
        if rule.below is not None:
            hit |= v < rule.below
    rows[parents[hit]] = True
    return rows
