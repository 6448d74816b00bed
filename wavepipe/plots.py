"""The plot in a run's report: a few of the waveforms a run publishes, drawn from their staged
chunks in a thread beside the expectations and the publish (no Spark job). It only describes the
run: whatever fails here becomes a line in the validation's ``notes``, never an error."""

from __future__ import annotations

import math
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from wavepipe import storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import RunPlan
from wavepipe.contracts.report import describe_safely
from wavepipe.contracts.runfiles import RunStore, plot_path
from wavepipe.spark_apps.assembly import assemble_arrow, assemble_file
from wavepipe.spark_apps.reassemble import SHUFFLED, STAGED, chunk_files, staged_chunk_files

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


def _draw(ax, t: np.ndarray, values: np.ndarray, labels: list[str]) -> str | None:
    """One waveform's channels on ``ax``, each in a colour of its own; several channels as lanes
    labelled ``labels`` on the y axis. Returns what the title must add (the lane spacing)."""
    from matplotlib import colormaps

    n = values.shape[1]
    tab20 = colormaps["tab20"]  # pairs of a hue, dark then light: all ten hues first, then the light ones
    palette = colormaps["tab10"] if n <= 10 else (lambda c: tab20((2 * c) % 20 + (2 * c) // 20))
    lanes, spacing = stacked(values) if n > 1 else (values, 0.0)
    for c in range(n):
        ax.plot(t, lanes[:, c], linewidth=0.6, color=palette(c), marker="." if len(t) < 50 else None, markersize=3)
    if n == 1:
        ax.set_ylabel(labels[0], fontsize=7)
        return None
    ax.set_yticks([-c * spacing for c in range(n)], labels)
    for label, c in zip(ax.get_yticklabels(), range(n), strict=True):
        label.set_color(palette(c))
    return f"channels stacked {spacing:.3g} apart"


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


def plot_waveforms(rows: list, path: Path) -> Path:
    """A small PNG of a few reassembled waveforms (decimated to about 2000 points each, up to
    ``PLOT_CHANNELS`` channels; a row's ``shown``: those channels only, its ``why``: said first in
    its title). Any waveform the protocol allows can be drawn: non-finite samples are left out,
    extreme magnitudes and times are drawn in powers of ten, long ids are cut."""
    from matplotlib.figure import Figure

    from wavepipe.contracts.protocol import rebuild

    shown = [(r.get("shown") or list(range(r["channels"])))[:PLOT_CHANNELS] for r in rows]
    heights = [1.9 if len(s) <= 2 else 1.1 + 0.3 * len(s) for s in shown]
    fig = Figure(figsize=(8, sum(heights)))
    axes = fig.subplots(len(rows), 1, squeeze=False, height_ratios=heights)
    with np.errstate(all="ignore"):
        for ax, row, channels in zip(axes[:, 0], rows, shown, strict=True):
            raw = rebuild(bytes(row["payload"]), row["dtype"], row["channels"])
            step = max(1, len(raw) // 2000)
            values, y_exp, bad = plottable(raw[::step][:, channels])
            t, t_exp = time_axis(len(raw), step, row["sample_rate"])
            lanes = _draw(ax, t, values, channel_labels(row, channels))
            facts = [f"{row['dtype']} x {row['channels']}", f"{row['sample_rate']:g} Hz"]
            if raw.dtype.kind == "c":
                facts.append("real part")
            if len(channels) < row["channels"]:
                facts.append(f"{len(channels)} of {row['channels']} channels")
            if y_exp:
                facts.append(f"values x 1e{y_exp}")
            if bad:
                facts.append(f"{bad} non-finite samples not drawn")
            if lanes:
                facts.append(lanes)
            said = f"{row['why']}: " if row.get("why") else ""
            ax.set_title(
                f"{said}{_short(row['source'], 30)}  ({_short(row['waveform_id'])}, {', '.join(facts)})", fontsize=8
            )
            since = _start_text(row.get("start_time"))
            unit = "seconds" if not t_exp else f"seconds x 1e{t_exp}"
            ax.set_xlabel(f"{unit} after {since}" if since else unit, fontsize=7)
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=80)
    return path


def _start_text(start) -> str | None:
    """A row's ``start_time`` (a datetime, or epoch microseconds) as UTC ISO text; None: none."""
    from datetime import UTC, datetime

    if start is None:
        return None
    if not isinstance(start, datetime):
        start = datetime.fromtimestamp(start / 1e6, UTC)
    return start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def start_plot(
    checked: pd.DataFrame,
    store: RunStore,
    plan: RunPlan,
    settings: Settings,
    notes: list[str],
):
    """Begin the plot of the first few waveforms the run publishes (the earliest of one partition,
    so their bytes are near the start of its staged file); returns a function that waits for it
    and gives the plot's path. Reading the staged chunks and drawing go on in a thread, beside the
    expectations and publishing. The plot only describes the run: whatever fails here becomes a
    line in ``notes`` (then the path is None), never an error."""
    picks = describe_safely(notes, "choosing waveforms to plot", _plot_picks, checked) or []
    drawn: dict = {}

    def draw() -> None:
        began = time.monotonic()
        rows = []
        for fetch in (_staged_rows, _shuffled_rows):
            rows += describe_safely(notes, "fetching waveforms to plot", fetch, picks, store, plan) or []
        drawn["path"] = plot_rows(sorted(rows, key=lambda r: r["waveform_id"]), plot_path(settings, plan.run_id), notes)
        drawn["s"] = time.monotonic() - began

    thread = threading.Thread(target=draw, name=f"wavepipe-plot-{plan.run_id}", daemon=True)
    thread.start()

    def wait() -> tuple[str | None, float]:
        thread.join()
        return drawn.get("path"), drawn.get("s", 0.0)

    return wait


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


def _plot_picks(checked: pd.DataFrame) -> list[dict]:
    """Up to three of the run's new waveforms (``output_checks``'s rows), the earliest first."""
    small = checked[checked["size_bytes"] <= _PLOT_MAX_BYTES].sort_values(["partition", "first_offset"])
    return small.head(3)[_PLOT_PICK_COLUMNS].to_dict("records")


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
    from wavepipe.spark_apps.tables import added_files

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
    return str(plot_waveforms(rows, flagged_plot_path(settings, run_id))) if rows else None


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


def plot_rows(rows: list, path: Path, notes: list[str]) -> str | None:
    """``plot_waveforms`` of ``rows`` to ``path``; returns the path, or None when there is nothing
    to plot or the plot failed (then ``notes`` says why; it never raises an ``Exception``)."""
    if not rows:
        return None
    done = describe_safely(notes, "the waveform plot", plot_waveforms, rows, path)
    return None if done is None else str(done)
