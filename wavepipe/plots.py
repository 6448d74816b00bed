"""The plots in a run's report: a few of the waveforms a run publishes, read from their staged
chunks beside the publish and drawn once nothing waits for them (``spark_apps.describe``), and
the waveforms it published flagged, read from the table (no Spark job). They only describe the
run: whatever fails here becomes a line in the validation's ``notes``, never an error."""

from __future__ import annotations

import math
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from wavepipe import storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import RunPlan
from wavepipe.contracts.protocol import rebuild
from wavepipe.contracts.report import describe_safely
from wavepipe.contracts.runfiles import plot_path
from wavepipe.run_store import RunStore
from wavepipe.spark_apps.assembly import assemble_arrow, assemble_file
from wavepipe.spark_apps.reassemble import SHUFFLED, STAGED, chunk_files, staged_chunk_files
from wavepipe.spark_apps.tables import added_files

# matplotlib's warnings about a hostile waveform (e.g. identical axis limits of a one-sample one)
# say nothing the plot does not show. Filtered here once, not with warnings.catch_warnings(): the
# plot is drawn in a thread, and catch_warnings swaps the filters of the whole process.
warnings.filterwarnings("ignore", module=r"matplotlib(\.|$)")

#: Waveforms larger than this are not drawn (their bytes would be read only for a picture).
_PLOT_MAX_BYTES = 16 * 1024 * 1024


#: Channels drawn per waveform (a 12-lead ECG whole), and characters of an id or a source shown
#: in a plot's title.
PLOT_CHANNELS = 12
PLOT_TITLE_CHARS = 60


def _short(text: str, limit: int = PLOT_TITLE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _scale_exponent(peak: float) -> int:
    """0 for magnitudes a plot's axis handles as they are, else the power of ten to divide by."""
    return 0 if peak == 0 or 1e-6 <= peak < 1e6 else math.floor(math.log10(peak))


def plottable(samples: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``samples`` as float64 any plot can draw: complex as their real part, non-finite values as
    gaps (NaN), and values divided by ``10**e`` when their magnitude is beyond 1e-6..1e6 (so no
    axis range or tick computation overflows, e.g. from -1.7e308 to 1.7e308).
    Returns (values, e, non-finite count)."""
    if samples.dtype.kind == "c":
        samples = samples.real
    with np.errstate(all="ignore"):
        values = samples.astype(np.float64)
    bad = ~np.isfinite(values)
    values[bad] = np.nan
    finite = np.abs(values[~bad])
    e = _scale_exponent(float(finite.max()) if finite.size else 0.0)
    if e:  # two factors: 10**324 or 10**-324 alone is not a float
        values = values * 10.0 ** (-e // 2) * 10.0 ** (-e - (-e // 2))
    return values, e, int(bad.sum())


def time_axis(n: int, step: int, sample_rate: float) -> tuple[np.ndarray, int]:
    """The times of samples ``0, step, 2*step, ... < n`` at ``sample_rate`` Hz, in units of
    ``10**e`` seconds chosen so they are finite and moderate for any positive finite rate."""
    span = math.log10(max(n - 1, 1)) - math.log10(sample_rate)  # log10 of the duration in seconds
    e = 0 if -6 <= span < 6 else math.floor(span)
    per_sample = 10.0 ** (-math.log10(sample_rate) - e)
    return np.arange(0, n, step, dtype=np.float64) * per_sample, e


def stacked(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Several channels drawn as lanes one under another (as seismograms and ECGs are read):
    each channel centred on its own mean and moved down by its index times the spacing, the
    largest peak-to-peak of any channel (1 when all are flat or empty). Returns (lanes, spacing);
    a lane's centre is ``-index * spacing``. Non-finite values stay gaps."""
    finite = np.isfinite(values)
    counts = finite.sum(axis=0)
    sums = np.where(finite, values, 0.0).sum(axis=0)
    means = np.divide(sums, counts, out=np.zeros(values.shape[1]), where=counts > 0)
    low = np.where(finite, values, np.inf).min(axis=0, initial=np.inf)
    high = np.where(finite, values, -np.inf).max(axis=0, initial=-np.inf)
    spans = np.where(counts > 0, high - low, 0.0)
    spacing = float(spans.max()) if spans.size and np.isfinite(spans.max()) and spans.max() > 0 else 1.0
    return values - means - np.arange(values.shape[1]) * spacing, spacing


#: Columns of a plot: a waveform with more than twice as many samples is drawn as the lowest and
#: highest value of each column's samples (``envelope``), not squeezed sample by sample.
PLOT_COLUMNS = 800

#: Absolute (UTC) times on the x axis for waveforms at least this long (a shorter one, or one of
#: no known start, is drawn against seconds after its start).
_ABSOLUTE_FROM_S = 1e-3


def envelope(samples: np.ndarray, columns: int = PLOT_COLUMNS) -> tuple[np.ndarray, np.ndarray, int]:
    """The lowest and highest sample of each run of ``k`` consecutive samples of ``samples``
    (samples x channels, any real dtype, NaN ignored), with ``k`` chosen so at most ``columns``
    runs cover them: every peak and trough stays visible, unlike every k-th sample. Returns
    (lows, highs, k); at most two samples per column: the samples themselves, k = 1."""
    n = len(samples)
    if n <= 2 * columns:
        return samples, samples, 1
    k = math.ceil(n / columns)
    starts = np.arange(0, n, k)
    return np.fmin.reduceat(samples, starts, axis=0), np.fmax.reduceat(samples, starts, axis=0), k


def calibrated(lows: np.ndarray, highs: np.ndarray, row: dict, shown: list[int]) -> tuple[np.ndarray, np.ndarray, bool]:
    """``lows``/``highs`` (float64) in the physical units of the row's channels, where it carries
    a calibration (``(sample - baseline) * calibration``, the protocol's ``wp-calibration`` and
    ``wp-baseline``; a negative factor swaps them). Returns (lows, highs, whether any changed)."""
    gains, bases = row.get("calibration") or [], row.get("baseline") or []
    factor, offset = np.ones(len(shown)), np.zeros(len(shown))
    for i, c in enumerate(shown):
        if c < len(gains) and gains[c] is not None and math.isfinite(gains[c]) and gains[c] != 0:
            factor[i] = gains[c]
            base = bases[c] if c < len(bases) and bases[c] is not None else 0.0
            offset[i] = base if math.isfinite(base) else 0.0
    if (factor == 1).all() and (offset == 0).all():
        return lows, highs, False
    a, b = (lows - offset) * factor, (highs - offset) * factor
    return np.fmin(a, b), np.fmax(a, b), True


def _draw(ax, t: np.ndarray, lows: np.ndarray, highs: np.ndarray, labels: list[str]) -> float | None:
    """One waveform's channels on ``ax``, each in a colour of its own; several channels as lanes
    labelled ``labels`` on the y axis. ``lows`` is ``highs`` for samples drawn one by one (a line),
    else each time ``t`` is a column from ``lows`` to ``highs``. Returns the lane spacing (None:
    one channel)."""
    from matplotlib import colormaps

    n = lows.shape[1]
    tab20 = colormaps["tab20"]  # pairs of a hue, dark then light: all ten hues first, then the light ones
    palette = colormaps["tab10"] if n <= 10 else (lambda c: tab20((2 * c) % 20 + (2 * c) // 20))
    one_by_one = lows is highs
    both = lows if one_by_one else np.concatenate([lows, highs])
    lanes, spacing = stacked(both) if n > 1 else (both, 0.0)
    low_lanes, high_lanes = (lanes, lanes) if one_by_one else (lanes[: len(lows)], lanes[len(lows) :])
    for c in range(n):
        if one_by_one:
            ax.plot(
                t, low_lanes[:, c], linewidth=0.6, color=palette(c), marker="." if len(t) < 50 else None, markersize=3
            )
        else:
            ax.vlines(t, low_lanes[:, c], high_lanes[:, c], colors=[palette(c)], linewidth=0.8)
    if n == 1:
        ax.set_ylabel(labels[0], fontsize=7)
        return None
    ax.set_yticks([-c * spacing for c in range(n)], labels)
    for label, c in zip(ax.get_yticklabels(), range(n), strict=True):
        label.set_color(palette(c))
    return spacing


def channel_labels(row: dict, shown: list[int]) -> list[str]:
    """The names of a row's ``shown`` channels (``channel_names``, else ch 1, ch 2, ...), with
    their units where the row has them."""
    names, units = row.get("channel_names") or [], row.get("units") or []
    labels = []
    for c in shown:
        name = names[c] if c < len(names) and names[c] else f"ch {c + 1}"
        unit = units[c] if c < len(units) and units[c] else ""
        labels.append(_short(f"{name} ({unit})" if unit else name, 24))
    return labels


def _shared_unit(row: dict, shown: list[int]) -> str | None:
    units = row.get("units") or []
    found = {units[c] if c < len(units) else None for c in shown}
    return found.pop() if len(found) == 1 and None not in found and "" not in found else None


_KINDS = {"i": "integers", "u": "unsigned integers", "f": "floats", "c": "complex numbers"}


def sample_words(dtype: np.dtype) -> str:
    """A sample type as a reader says it: ``<i2`` is "16-bit integers"."""
    return f"{8 * dtype.itemsize}-bit {_KINDS.get(dtype.kind, dtype.kind)}"


def duration_words(seconds: float) -> str:
    """A duration as a reader says it: 44.0 s, 12 min 5 s, 3.2 h, 2.5 days, 250 ms, 40 µs."""
    if not math.isfinite(seconds) or seconds < 0:
        return "unknown duration"
    if seconds >= 86400 * 1000 or (0 < seconds < 1e-6):
        return f"{seconds:.3g} s"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.3g} days"
    if seconds >= 3 * 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 3600:
        hours, rest = divmod(round(seconds / 60), 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    if seconds >= 120:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} \u00b5s" if seconds else "0 s"


def _start(start):
    """A row's ``start_time`` (a datetime, or epoch microseconds) as an aware UTC datetime; None:
    none, or none a plot can place."""
    from datetime import UTC, datetime

    try:
        if start is None:
            return None
        if not isinstance(start, datetime):
            start = datetime.fromtimestamp(start / 1e6, UTC)
        return start.astimezone(UTC) if start.tzinfo else start.replace(tzinfo=UTC)
    except (OverflowError, OSError, ValueError, TypeError):
        return None


def _title(row: dict, n: int, shown: list[int], facts: list[str]) -> str:
    """Two lines a domain reader reads: what was recorded, where, when and how (source, start
    in UTC, duration, channels and sample rate), then how it is drawn."""
    channels = row["channels"]
    rate = float(row["sample_rate"])
    with np.errstate(all="ignore"):
        seconds = float(np.float64(n) / rate) if rate > 0 else float("inf")
    start = _start_text(row.get("start_time"))
    what = [
        _short(str(row.get("source") or "unknown source"), 30),
        f"from {start.replace('T', ' ').removesuffix('Z')} UTC" if start else "start unknown",
        duration_words(seconds),
        f"{channels} channel{'s' if channels != 1 else ''} at {rate:g} Hz",
    ]
    said = f"{row['why']}: " if row.get("why") else ""
    how = [f"id {_short(row['waveform_id'], 40)}", *facts]
    return f"{said}{', '.join(what)}\n{'; '.join(how)}"


def plot_waveforms(rows: list, path: Path, rule: str | None = None) -> Path:
    """``waveforms_figure`` of ``rows`` as a small PNG at ``path``, its words also in the PNG's
    text (``Title``: the rule; ``Description``: ``figure_words``), for a reader that cannot see it
    and for a test."""
    fig = waveforms_figure(rows, rule)
    path.parent.mkdir(parents=True, exist_ok=True)
    with np.errstate(all="ignore"):
        fig.savefig(path, dpi=80, metadata={"Title": rule or "", "Description": figure_words(fig)})
    return path


def figure_words(fig) -> str:
    """What a figure says in words, one line each: each panel's title, its channels' labels and
    its x axis."""
    lines = []
    for ax in fig.axes:
        lines.append(ax.get_title(loc="left"))
        labels = [ax.get_ylabel()] if ax.get_ylabel() else [t.get_text() for t in ax.get_yticklabels()]
        lines.append("channels: " + ", ".join(labels))
        lines.append(f"x axis: {ax.get_xlabel()}")
    return "\n".join(lines)


def waveforms_figure(rows: list, rule: str | None = None):
    """A figure of a few reassembled waveforms, up to ``PLOT_CHANNELS`` channels each, in
    their physical units where the row carries a calibration, against UTC time (seconds after the
    start for a waveform shorter than a millisecond or of no known start); a long one as the
    lowest and highest value per pixel column (``envelope``), said in its title. A row's
    ``shown``: those channels only, its ``why``: said first in its title; ``rule``: how the
    waveforms were picked, the figure's heading. Any waveform the protocol allows can be drawn:
    non-finite samples are left out, extreme magnitudes and times are drawn in powers of ten, long
    ids are cut."""
    from matplotlib import dates as mdates
    from matplotlib.figure import Figure

    shown = [(r.get("shown") or list(range(r["channels"])))[:PLOT_CHANNELS] for r in rows]
    heights = [2.2 if len(s) <= 2 else 1.4 + 0.3 * len(s) for s in shown]
    fig = Figure(figsize=(8, sum(heights) + (0.4 if rule else 0)))
    axes = fig.subplots(len(rows), 1, squeeze=False, height_ratios=heights)
    with np.errstate(all="ignore"):
        for ax, row, channels in zip(axes[:, 0], rows, shown, strict=True):
            raw = rebuild(bytes(row["payload"]), row["dtype"], row["channels"])
            picked = raw[:, channels]
            facts = [sample_words(raw.dtype)]
            if raw.dtype.kind == "c":
                picked = picked.real
                facts.append("real part drawn")
            bad = int(np.count_nonzero(~np.isfinite(picked))) if picked.dtype.kind == "f" else 0
            lows, highs, k = envelope(picked)
            lows, highs, physical = calibrated(lows.astype(np.float64), highs.astype(np.float64), row, channels)
            both, y_exp, _ = plottable(lows if k == 1 else np.concatenate([lows, highs]))
            lows, highs = (both, both) if k == 1 else (both[: len(lows)], both[len(lows) :])
            if k == 1:
                highs = lows  # drawn as a line
            t, t_exp = time_axis(len(raw), k, float(row["sample_rate"]))
            start = _start(row.get("start_time"))
            seconds = float(np.float64(len(raw)) / float(row["sample_rate"]))
            absolute = start is not None and not t_exp and seconds >= _ABSOLUTE_FROM_S
            if absolute:
                try:
                    t = mdates.date2num(start) + t / 86400.0
                except (OverflowError, ValueError):
                    absolute = False
            spacing = _draw(ax, t, lows, highs, channel_labels(row, channels))
            if len(channels) < row["channels"]:
                facts.append(f"{len(channels)} of {row['channels']} channels")
            if physical:
                facts.append("calibrated")
            if y_exp:
                facts.append(f"values x 1e{y_exp}")
            if bad:
                facts.append(f"{bad:,} non-finite samples not drawn")
            if k > 1:
                facts.append(f"each column: lowest to highest of {k:,} samples")
            if spacing is not None:
                unit = _shared_unit(row, channels)
                facts.append(f"lanes {spacing:.3g}{' ' + unit if unit else ''} apart")
            ax.set_title(_title(row, len(raw), channels, facts), fontsize=8, loc="left")
            if absolute:
                locator = mdates.AutoDateLocator(tz=mdates.UTC)
                ax.xaxis.set_major_locator(locator)
                ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=mdates.UTC))
                ax.set_xlabel("time (UTC)", fontsize=7)
            else:
                since = _start_text(row.get("start_time"))
                unit = "seconds" if not t_exp else f"seconds x 1e{t_exp}"
                ax.set_xlabel(f"{unit} after {since}" if since else unit, fontsize=7)
            ax.tick_params(labelsize=7)
            ax.xaxis.get_offset_text().set_fontsize(7)
        if rule:
            fig.suptitle(textwrap.fill(rule, 110), fontsize=8, x=0.01, ha="left")
        fig.tight_layout()
    return fig


def _start_text(start) -> str | None:
    """A row's ``start_time`` (a datetime, or epoch microseconds) as UTC ISO text; None: none."""
    start = _start(start)
    return None if start is None else start.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Picked:
    """The waveforms the run's plot draws, assembled from its staged chunks, and the rule that
    picked them (``pick_rule``): read while the staged files are there, drawn later."""

    rows: list[dict] = field(default_factory=list)
    rule: str = ""


def read_picks(checked: pd.DataFrame, store: RunStore, plan: RunPlan, notes: list[str]) -> Picked:
    """The waveforms the run's plot draws, picked by ``plot_picks``' rule (the longest of each
    source among each partition's first ``PLOT_CANDIDATES``, so their bytes are near the start of
    its staged file), read from the staged chunks. The plot only describes the run: whatever fails
    here becomes a line in ``notes`` (then nothing is drawn), never an error."""
    picks = describe_safely(notes, "choosing waveforms to plot", plot_picks, checked) or []
    rows = []
    for read in (_staged_rows, _shuffled_rows):
        rows += describe_safely(notes, "fetching waveforms to plot", read, picks, store, plan) or []
    order = {p["waveform_id"]: i for i, p in enumerate(picks)}
    rows.sort(key=lambda r: order.get(r["waveform_id"], len(order)))
    return Picked(rows, pick_rule(len(rows), len(checked)))


def plot_picked(picked: Picked, settings: Settings, run_id: str, notes: list[str]) -> str | None:
    """The run's plot of ``picked`` (``plot_rows``): its path, or None (``notes`` says why)."""
    return plot_rows(picked.rows, plot_path(settings, run_id), notes, picked.rule)


_PLOT_PICK_COLUMNS = [
    "waveform_id",
    "source",
    "dtype",
    "channels",
    "sample_rate",
    "checksum",
    "partition",
    "written_from",
]

#: Waveforms the run's plot draws, and the waveforms of each partition (its earliest by offset)
#: it picks them from: reading them stops that far into the partition's staged file.
PLOT_PICKS = 3
PLOT_CANDIDATES = 16


def plot_picks(checked: pd.DataFrame, limit: int = PLOT_PICKS) -> list[dict]:
    """The run's plot's waveforms (``output_checks``' rows, small enough to draw), by a rule the
    figure states (``pick_rule``): among the first ``PLOT_CANDIDATES`` of each partition, the
    longest of each source, the longest first (ties: the earliest), then the next longest of any
    source, up to ``limit``."""
    small = checked[checked["size_bytes"] <= _PLOT_MAX_BYTES].sort_values(["partition", "first_offset"])
    small = small.reset_index(drop=True)
    early = small.groupby("partition", sort=False).head(PLOT_CANDIDATES)
    duration = early["duration_s"] if "duration_s" in early else early["size_bytes"]
    ranked = early.assign(_long=pd.to_numeric(duration, errors="coerce").fillna(-1.0)).sort_values(
        ["_long", "partition", "first_offset"], ascending=[False, True, True], kind="stable"
    )
    firsts = ranked.drop_duplicates("source")
    picked = pd.concat([firsts, ranked.drop(firsts.index)]).head(limit)
    return picked[[c for c in _PLOT_PICK_COLUMNS if c in picked]].to_dict("records")


def pick_rule(drawn: int, published: int) -> str:
    """The run's plot's heading: which waveforms it shows and why (``plot_picks``)."""
    return (
        f"{drawn} of {published:,} waveforms published: the longest of each source, longest first "
        f"(among each partition's first {PLOT_CANDIDATES}); the flagged ones are in the flagged plot"
    )


def _staged_rows(picks: list[dict], store: RunStore, plan: RunPlan) -> list[dict]:
    """The picked waveforms written from the staged chunks, read here with pyarrow: no Spark job."""
    rows = []
    staged = [r for r in picks if r["written_from"] == STAGED]
    for partition in {int(r["partition"]) for r in staged}:
        mine = {r["waveform_id"]: r["checksum"] for r in staged if int(r["partition"]) == partition}
        path = chunk_files(store, plan)[partition]
        reach = storage.configured_options(path)
        for batch in assemble_file(
            path, mine, strict=True, batch_bytes=store.settings.output_batch_bytes, reach=reach, quality=None
        ):
            rows += [r for r in batch.to_pylist() if r["checksum_ok"]]
    return rows


def _shuffled_rows(picks: list[dict], store: RunStore, plan: RunPlan) -> list[dict]:
    """The picked waveforms whose chunks lie in several staged files (or repeat), read here with
    pyarrow (only their chunks) and assembled by ``assemble_arrow``: no Spark job."""
    picked = {r["waveform_id"]: r["checksum"] for r in picks if r["written_from"] == SHUFFLED}
    if not picked:
        return []
    chunks = storage.parquet_dataset(staged_chunk_files(store, plan))
    chunks = chunks.to_table(filter=pc.field("waveform_id").isin(list(picked)))
    rows = []
    for wid, checksum in picked.items():
        mine = chunks.filter((pc.field("waveform_id") == wid) & (pc.field("checksum") == checksum))
        rows += [r for r in assemble_arrow(mine, quality=None).to_pylist() if r["checksum_ok"]]
    return rows


#: The columns the flagged plot reads of the published rows (their payload only for those drawn).
_FLAGGED_COLUMNS = [
    "waveform_id",
    "source",
    "start_time",
    "dtype",
    "channels",
    "sample_rate",
    "channel_names",
    "units",
    "qc_flags",
    "qc_dead",
    "qc_clipped_share",
    "qc_nan_share",
    "qc_spikes",
    "gap_s",
    "latency_s",
]


def flagged_picks(rows: pa.Table, limit: int = 3) -> list[int]:
    """Up to ``limit`` of ``rows`` (``waveform_id``, ``source``, ``start_time``, ``qc_flags``,
    ``size_bytes``) to draw, as their places: for each rule the rows break, the most broken first,
    the first row by source and start that breaks it and is not picked yet, small enough to draw.
    Arrow and NumPy: a run that flagged every one of 65,536 waveforms costs milliseconds."""
    keys = [("source", "ascending"), ("start_time", "ascending"), ("waveform_id", "ascending")]
    rank = np.empty(rows.num_rows, np.int64)
    rank[pc.sort_indices(rows, keys).to_numpy()] = np.arange(rows.num_rows)
    small = pc.less_equal(rows["size_bytes"], _PLOT_MAX_BYTES).to_numpy(zero_copy_only=False)
    flags = rows["qc_flags"].combine_chunks()
    names = pc.list_flatten(flags).to_numpy(zero_copy_only=False).astype(str)
    parents = pc.list_parent_indices(flags).to_numpy()
    rules, counts = np.unique(names, return_counts=True)
    picks: list[int] = []
    for rule in rules[np.lexsort((rules, -counts))]:
        breaking = np.unique(parents[names == rule])
        breaking = breaking[small[breaking] & ~np.isin(breaking, picks)]
        if len(breaking) and len(picks) < limit:
            picks.append(int(breaking[np.argmin(rank[breaking])]))
    return picks


def flagged_channels(row: dict, rules) -> list[int]:
    """The channels of a flagged ``row`` that break one of its rules (``rules``: the run's, by
    name): those that a per channel rule names; every channel when it breaks only rules of the
    whole waveform (a gap, latency)."""
    broken = [rules[name] for name in row["qc_flags"] if name in rules]
    shown = sorted(
        {c for rule in broken if isinstance(row.get(rule.metric), list) for c in rule.breaking(row[rule.metric])}
    )
    return shown or list(range(row["channels"]))


def plot_flagged(settings: Settings, run_id: str, version: int) -> str | None:
    """A PNG of up to three waveforms run ``run_id``'s commit (version ``version`` of the output
    table) published flagged, one per rule broken most (``flagged_picks``), each drawn with the
    channels that break it (``flagged_channels``) and the rules in its title; read from the files
    that commit added (only the row groups that hold them: no Spark job). Returns its path (None:
    none to draw)."""
    table = settings.output_table
    index = []
    for f in added_files(table, version):
        uri = storage.join(table, f)
        part = storage.read_parquet(uri, ["waveform_id", "source", "start_time", "qc_flags", "size_bytes"])
        index.append(part.append_column("file", pa.array([uri] * part.num_rows, pa.string())))
    index = pa.concat_tables(index) if index else None
    picks = flagged_picks(index) if index else []
    if not picks:
        return None
    files = {index["waveform_id"][i].as_py(): index["file"][i].as_py() for i in picks}
    rules = {r.name: r for r in settings.quality() or ()}
    rows = [row for row in (_published_row(uri, wid) for wid, uri in files.items()) if row is not None]
    rows = [{**row, "shown": flagged_channels(row, rules), "why": ", ".join(row["qc_flags"])} for row in rows]
    return str(plot_waveforms(rows, flagged_plot_path(settings, run_id), FLAGGED_RULE)) if rows else None


#: The flagged plot's heading: which waveforms it shows and why (``flagged_picks``).
FLAGGED_RULE = (
    "Flagged waveforms: one per quality rule, the rules broken most first; for each, the earliest by "
    "source and start time, drawn with the channels that break it"
)


def _published_row(uri: str, waveform_id: str) -> dict | None:
    """The row of ``waveform_id`` in the published file ``uri``, its payload too: only the row
    group that holds it is read (None: not there)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(storage.open_input(uri)) as parquet:
        for group in range(parquet.num_row_groups):
            at = pc.index(parquet.read_row_group(group, columns=["waveform_id"])["waveform_id"], waveform_id).as_py()
            if at >= 0:
                there = [c for c in [*_FLAGGED_COLUMNS, "payload"] if c in parquet.schema_arrow.names]
                return parquet.read_row_group(group, columns=there).slice(at, 1).to_pylist()[0]
    return None


def flagged_plot_path(settings: Settings, run_id: str) -> Path:
    return settings.reports_dir / run_id / "flagged.png"


def plot_rows(rows: list, path: Path, notes: list[str], rule: str | None = None) -> str | None:
    """``plot_waveforms`` of ``rows`` to ``path`` (``rule``: how they were picked); returns the
    path, or None when there is nothing to plot or the plot failed (then ``notes`` says why; it
    never raises an ``Exception``)."""
    if not rows:
        return None
    done = describe_safely(notes, "the waveform plot", plot_waveforms, rows, path, rule)
    return None if done is None else str(done)
