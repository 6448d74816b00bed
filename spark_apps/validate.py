"""Validation gate: the run's new waveforms (its manifest: every output column but the payload)
through Great Expectations. A waveform that fails a per-waveform expectation is quarantined with
the expectation's name (``rejections``); the rest is published if (and only if) every run-level
expectation holds.

Guarantees: a run whose validation fails changes no published table and records which
expectations failed, with counts and examples, in its ``validate`` step and in the validation
history; the step can be retried (after the data is fixed, or a threshold relaxed) and then
publishes. Publishing writes each new waveform's bytes once, into the output table (from the
staged chunks, checked against its checksum again as it is written; or from the run's candidate
waveform table), and appends only keys not yet in each table, in one Delta commit per table that
carries the group's transaction (``wavepipe.delta_txn``), so a retry adds nothing twice.
Only the data path and the expectations decide the outcome: what merely describes it (the
waveform plot, Data Docs, the history line) degrades to a line in the result's ``notes``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from wavepipe import delta_txn, expectations, storage
from wavepipe import pages as run_pages
from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import RunPlan, utc_now
from wavepipe.contracts.report import append_validation_history, describe_safely, failed_expectations
from wavepipe.contracts.runfiles import RunStore, Step, plot_path
from wavepipe.contracts.steps import Reassembled, Validated, ValidatedRows, WindowRows, settled
from wavepipe.delta_protocol import repair_schema
from wavepipe.delta_txn import Txn
from wavepipe.faults import failpoint
from wavepipe.maintenance import table_paths
from wavepipe.offline_docs import localize_site
from wavepipe.spark import phase
from wavepipe.spark_apps.app import load_run, output_lock
from wavepipe.spark_apps.assembly import STAGED_CHANGED, assemble_arrow, assemble_file
from wavepipe.spark_apps.reassemble import (
    MANIFEST_COLUMNS,
    MANIFEST_SCHEMA,
    SHUFFLED,
    STAGED,
    assemble,
    assemble_local,
    chunk_files,
    earlier_rows,
    staged_chunk_files,
    wanted_waveforms,
)
from wavepipe.spark_apps.rejections import Rejection, rejection
from wavepipe.spark_apps.tables import (
    TABLE_KEYS,
    append_new,
    append_rows,
    commit_metric,
    delta_row_count,
    delta_version,
    delta_writer,
    read_delta,
    replace_predicate,
    window_predicate,
    with_txn,
)

log = logging.getLogger("wavepipe.validate")
# matplotlib's warnings about a hostile waveform (e.g. identical axis limits of a one-sample one)
# say nothing the plot does not show. Filtered here once, not with warnings.catch_warnings(): the
# plot is drawn in a thread, and catch_warnings swaps the filters of the whole process.
warnings.filterwarnings("ignore", module=r"matplotlib(\.|$)")
# Great Expectations logs some 200 INFO lines about its own API docs when it is imported: in a
# run's process (attached to the engine), that would be most of the run's output and task log
logging.getLogger("great_expectations").setLevel(logging.WARNING)

#: Validation results the Data Docs index lists (newest first); older pages stay on disk.
DATA_DOCS_INDEX_RESULTS = 200
_PLOT_MAX_BYTES = 16 * 1024 * 1024


# --- pure transformations ------------------------------------------------------------------------


#: The manifest's columns the suites and the plot look at (the payload is not among them).
CHECKED_COLUMNS = [*MANIFEST_COLUMNS, "run_id"]


def output_checks(manifest: pd.DataFrame, published: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """The run's new waveforms (its manifest: one row each, no payload) with the columns the
    per-waveform suite checks. ``published``: (waveform_id, run_id) of the output table's rows
    with the run's ids."""
    itemsize = pd.to_numeric(manifest["dtype"].str.extract(r"(\d+)$")[0], errors="coerce")  # numpy dtype.str: "<f4"
    expected = manifest["n_samples"] * itemsize * manifest["channels"]
    by_other = published["run_id"].notna() & (published["run_id"] != run_id)
    other_ids, in_table = set(published.loc[by_other, "waveform_id"]), set(published["waveform_id"])
    return manifest[CHECKED_COLUMNS].assign(
        expected_size_bytes=expected if expected.isna().any() else expected.astype("int64"),
        numbers_finite=np.isfinite(manifest["sample_rate"].astype(float))
        & np.isfinite(manifest["duration_s"].astype(float)),
        published_by_other_run=manifest["waveform_id"].isin(other_ids),
        in_table=manifest["waveform_id"].isin(in_table),
        written_from=manifest["written_from"],
    )


def run_frame(waveforms: dict[str, int], judged_from: int) -> pd.DataFrame:
    """The run-level suite's one row, from the run's waveform counts once validation quarantined
    what failed a per-waveform expectation (``steps.settled``): the waveforms judged (new and
    quarantined; re-deliveries and pending ones are not judged), the quarantined ones, and their
    share, None (not judged) below ``judged_from`` waveforms."""
    quarantined = sum(n for k, n in waveforms.items() if k.startswith("quarantined"))
    judged = waveforms.get("output_new", 0) + quarantined
    share = quarantined / judged if judged and judged >= judged_from else None
    return pd.DataFrame(
        {"waveforms_judged": [judged], "quarantined": [quarantined], "quarantined_share": [share]},
        columns=list(expectations.RUN_COLUMNS),
    ).astype({"quarantined_share": "float64"})


# --- Great Expectations ----------------------------------------------------------------------------


def _jsonable(value):
    if isinstance(value, np.generic):  # from a frame validated in the client (pandas)
        value = value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _exception_message(info) -> str | None:
    """GX puts an expectation's own error at the top level of ``exception_info``; a metric that
    failed to compute appears as ``{metric id: {...}}`` instead."""
    if not info:
        return None
    entries = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    messages = [str(e.get("exception_message")) for e in entries if e.get("raised_exception")]
    return "; ".join(messages) or None


def _summarize_result(name: str, result, docs_url: str | None) -> dict:
    failed = []
    for r in result.results:
        if r.success:
            continue
        config = r.expectation_config
        kwargs = {k: v for k, v in config.kwargs.items() if k in ("column", "column_A", "column_B", "column_list")}
        res = r.result or {}
        failed.append(
            {
                "expectation": config.type,
                **_jsonable(kwargs),
                "description": config.description,
                "unexpected_count": res.get("unexpected_count"),
                "unexpected_percent": None
                if res.get("unexpected_percent") is None
                else round(res["unexpected_percent"], 4),
                "examples": _jsonable((res.get("partial_unexpected_list") or [])[:3]),
                "error": _exception_message(r.exception_info),
            }
        )
    stats = result.statistics
    return {
        "suite": name,
        "success": bool(result.success),
        "evaluated": stats["evaluated_expectations"],
        "failed_count": stats["unsuccessful_expectations"],
        "failed": failed,
        # every expectation's outcome (what lineage carries as data-quality assertions)
        "checks": [
            {
                "expectation": r.expectation_config.type,
                "column": r.expectation_config.kwargs.get("column"),
                "success": bool(r.success),
            }
            for r in result.results
        ],
        "data_docs": docs_url,
    }


def run_suites(
    settings: Settings,
    run_id: str,
    checked: pd.DataFrame,
    judge_run,
    now: datetime,
    notes: list[str] | None = None,
) -> tuple[list[dict], dict[str, dict], Callable[[], str]]:
    """The per-waveform suite on ``checked`` (the run's new waveforms), then the run-level suite
    on the one-row frame ``judge_run(rejected)`` makes, each through a GX checkpoint (results
    stored), in this process.
    Returns the per-suite summaries, the rejected waveforms (``rejections.rejected_waveforms``)
    and ``describe``: it builds the results' Data Docs (they only describe the run, so a caller
    publishes first), puts each page's link in its summary and returns the index URL. When
    building them fails, ``notes`` gets a line and the links are left out."""
    import great_expectations as gx

    from wavepipe.spark_apps.rejections import INDEX_COLUMNS, rejected_waveforms

    context = gx.get_context(mode="file", project_root_dir=str(settings.gx_dir.parent))  # GX adds "gx/"
    _without_config_variables(context)
    context.variables.progress_bars = {"globally": False}
    notes = [] if notes is None else notes
    describe_safely(notes, "configuring Great Expectations Data Docs", _bound_docs_index, context)
    (waveform_suite, per_waveform), (run_suite, per_run) = expectations.suites(settings, now).items()
    # failing waveforms are listed whole (their ids say what to quarantine); a failing run in a summary
    complete = {"result_format": "COMPLETE", "unexpected_index_column_names": list(INDEX_COLUMNS)}
    first = _check(context, waveform_suite, per_waveform, checked, run_id, complete)
    rejected = rejected_waveforms(first[0])
    second = _check(context, run_suite, per_run, judge_run(rejected), run_id, _SUMMARY)
    checks = [(waveform_suite, *first), (run_suite, *second)]
    out = [
        {
            **_summarize_result(name, result, None),
            "validated_in": "client",
            "gates_run": expectations.gates_the_run(name),
        }
        for name, result, *_ in checks
    ]

    def describe() -> str:
        docs = describe_safely(
            notes,
            "Great Expectations Data Docs",
            _build_docs,
            context,
            [shown for *_, shown, _ in checks],
            [i for *_, stored in checks for i in stored],
        ) or ([], "", [])
        if docs[2]:
            describe_safely(
                notes,
                "keeping the Data Docs in the run state",
                run_pages.keep_data_docs,
                RunStore(settings),
                run_id,
                docs[2][0].parent,
                docs[2],
                catching=storage.STORAGE_ERRORS,
            )
        for summary, page in zip(out, docs[0] or [None] * len(out), strict=True):
            summary["data_docs"] = page
        return docs[1]

    return out, rejected, describe


_SUMMARY = {"result_format": "SUMMARY", "partial_unexpected_count": 5}


def _check(context, name: str, expectation_list: list, frame, run_id: str, on_failure: dict):
    """Suite ``name`` on ``frame`` (pandas): pass/fail first; only if one fails, again with
    ``on_failure``'s result format (counts, examples, failing rows). Returns (the last result,
    its identifier, every stored result's identifier): each pass is stored and gets its Data
    Docs page."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    source = _data_source(context)
    try:
        asset = source.get_asset(name)
    except LookupError:
        asset = source.add_dataframe_asset(name=name)
    try:
        batch = asset.get_batch_definition("run")
    except (KeyError, LookupError):
        batch = asset.add_batch_definition_whole_dataframe("run")
    suite = context.suites.add_or_update(
        gx.ExpectationSuite(
            name=name, expectations=expectation_list, meta={"wavepipe_suite_version": expectations.SUITE_VERSION}
        )
    )
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=name, data=batch, suite=suite)
    )
    stored = {}
    for result_format in ({"result_format": "BOOLEAN_ONLY"}, on_failure):
        checkpoint = context.checkpoints.add_or_update(
            gx.Checkpoint(name=name, validation_definitions=[definition], result_format=result_format)
        )
        outcome = checkpoint.run(
            batch_parameters={"dataframe": frame}, run_id=RunIdentifier(run_name=run_id, run_time=datetime.now(UTC))
        )
        stored.update(outcome.run_results)
        if outcome.success:
            break
    ((identifier, result),) = list(outcome.run_results.items())[-1:]
    return result, identifier, list(stored)


def _data_source(context):
    """The GX data source of the run's frames: pandas frames, validated in this process."""
    try:
        return context.data_sources.get("wavepipe_in_client")
    except (KeyError, ValueError, LookupError):
        return context.data_sources.add_pandas(name="wavepipe_in_client")


def _without_config_variables(context) -> None:
    """GX reads its config variables file (``${VAR}`` substitutions) again at every read of a
    context variable, about 125 times a run (0.2 s); wavepipe's context uses none: it has no such
    file, and environment variables still substitute."""
    if context.variables.config_variables_file_path:
        context.variables.config_variables_file_path = None
        context.variables.save()


def _bound_docs_index(context) -> None:
    """The Data Docs index is rebuilt after every validation from the stored results: keep it bounded."""
    sites = context.variables.data_docs_sites or {}
    index = sites.get("local_site", {}).get("site_index_builder")
    if index is not None and index.get("validation_results_limit") != DATA_DOCS_INDEX_RESULTS:
        index["validation_results_limit"] = DATA_DOCS_INDEX_RESULTS
        context.variables.data_docs_sites = sites
        context.variables.save()


def _build_docs(context, shown: list, identifiers: list) -> tuple[list[str | None], str, list[Path]]:
    """Build this run's Data Docs pages (and the index once); the page of each ``shown`` result,
    the index URL and, in a local site, the files built (the index first)."""
    context.build_data_docs(resource_identifiers=identifiers)
    built = {}
    for identifier in identifiers:
        urls = context.get_docs_sites_urls(resource_identifier=identifier)
        built[identifier] = urls[0]["site_url"] if urls else None
    index_url = context.get_docs_sites_urls()
    index = index_url[0]["site_url"] if index_url else ""
    files = []
    if index.startswith("file://"):  # GX's pages load their styles and scripts from CDNs
        files = [Path(unquote(urlparse(url).path)) for url in [index, *built.values()] if url]
        localize_site(files[0].parent, files)
    return [built.get(identifier) for identifier in shown], index, files


# --- I/O -------------------------------------------------------------------------------------------


def _manifest(candidates: str) -> pd.DataFrame:
    """The run's manifest (``reassemble._assemble_and_write``), read here by delta-rs: no Spark
    job. Start times stay Python datetimes: pandas' nanosecond timestamps end in 1677 and 2262,
    Spark's in years 1 and 9999, and a producer may send any start time in between (the suite
    says if it is plausible)."""
    path = storage.join(candidates, "manifest")
    rows = (
        storage.delta_table(path).to_pyarrow_table()
        if delta_version(path) is not None
        else MANIFEST_SCHEMA.empty_table()
    )
    return rows.to_pandas(timestamp_as_object=True, date_as_object=True)


def _staged_record_count(store: RunStore, plan: RunPlan) -> int:
    """Records the run staged (chunks and dead letters), from the files' own footers."""
    files = [f for kind in ("chunks", "dead_letter") for f in store.staged_files(plan.run_id, kind)]
    return sum(storage.parquet_rows(f) for f in files)


def _kept(checked: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
    """The checked rows of the waveforms the run publishes: all but the rejected ``ids``."""
    return checked[~checked["waveform_id"].isin(ids)] if ids else checked


def _output_counts(checked: pd.DataFrame) -> dict:
    """Rows, rows already in the output table, and bytes of the run's new waveforms."""
    return {
        "rows": len(checked),
        "in_table": int(checked["in_table"].sum()),
        "bytes": int(checked["size_bytes"].fillna(0).sum()),
    }


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


def _draw(ax, t: np.ndarray, values: np.ndarray) -> str | None:
    """One waveform's channels on ``ax``, each in a colour of its own; several channels as lanes
    labelled ch 1, ch 2, ... on the y axis. Returns what the title must add (the lane spacing)."""
    from matplotlib import colormaps

    n = values.shape[1]
    tab20 = colormaps["tab20"]  # pairs of a hue, dark then light: all ten hues first, then the light ones
    palette = colormaps["tab10"] if n <= 10 else (lambda c: tab20((2 * c) % 20 + (2 * c) // 20))
    lanes, spacing = stacked(values) if n > 1 else (values, 0.0)
    for c in range(n):
        ax.plot(t, lanes[:, c], linewidth=0.6, color=palette(c), marker="." if len(t) < 50 else None, markersize=3)
    if n == 1:
        return None
    ax.set_yticks([-c * spacing for c in range(n)], [f"ch {c + 1}" for c in range(n)])
    for label, c in zip(ax.get_yticklabels(), range(n), strict=True):
        label.set_color(palette(c))
    return f"channels stacked {spacing:.3g} apart"


def plot_waveforms(rows: list, path: Path) -> Path:
    """A small PNG of a few reassembled waveforms (decimated to about 2000 points each, up to
    ``PLOT_CHANNELS`` channels). Any waveform the protocol allows can be drawn: non-finite samples
    are left out, extreme magnitudes and times are drawn in powers of ten, long ids are cut."""
    from matplotlib.figure import Figure

    from wavepipe.contracts.protocol import rebuild

    heights = [
        1.9 if min(r["channels"], PLOT_CHANNELS) <= 2 else 1.1 + 0.3 * min(r["channels"], PLOT_CHANNELS) for r in rows
    ]
    fig = Figure(figsize=(8, sum(heights)))
    axes = fig.subplots(len(rows), 1, squeeze=False, height_ratios=heights)
    with np.errstate(all="ignore"):
        for ax, row in zip(axes[:, 0], rows, strict=True):
            raw = rebuild(bytes(row["payload"]), row["dtype"], row["channels"])
            step = max(1, len(raw) // 2000)
            values, y_exp, bad = plottable(raw[::step, :PLOT_CHANNELS])
            t, t_exp = time_axis(len(raw), step, row["sample_rate"])
            lanes = _draw(ax, t, values)
            facts = [f"{row['dtype']} x {row['channels']}", f"{row['sample_rate']:g} Hz"]
            if raw.dtype.kind == "c":
                facts.append("real part")
            if row["channels"] > PLOT_CHANNELS:
                facts.append(f"first {PLOT_CHANNELS} channels")
            if y_exp:
                facts.append(f"values x 1e{y_exp}")
            if bad:
                facts.append(f"{bad} non-finite samples not drawn")
            if lanes:
                facts.append(lanes)
            ax.set_title(f"{_short(row['waveform_id'])}  ({_short(row['source'], 30)}, {', '.join(facts)})", fontsize=8)
            ax.set_xlabel("seconds" if not t_exp else f"seconds x 1e{t_exp}", fontsize=7)
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=80)
    return path


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
        for batch in assemble_file(path, mine, strict=True, batch_bytes=store.settings.output_batch_bytes, reach=reach):
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
        rows += [r for r in assemble_arrow(mine).to_pylist() if r["checksum_ok"]]
    return rows


def plot_rows(rows: list, path: Path, notes: list[str]) -> str | None:
    """``plot_waveforms`` of ``rows`` to ``path``; returns the path, or None when there is nothing
    to plot or the plot failed (then ``notes`` says why; it never raises an ``Exception``)."""
    if not rows:
        return None
    done = describe_safely(notes, "the waveform plot", plot_waveforms, rows, path)
    return None if done is None else str(done)


#: The published tables, in the order a run publishes them: its waveforms first, so a run whose
#: waveforms cannot be written (``StagedChunksChangedError``) has published nothing.
PUBLISHED = ("waveforms", "quarantine", "dead_letter")


def publish_source(
    spark: SparkSession, store: RunStore, plan: RunPlan, name: str, rejection: Rejection
) -> DataFrame | None:
    """What publishing puts into the published table ``name`` as a Spark frame (None: nothing):
    the waveforms' payloads (``_staged_waveforms``), or the run's rows (``publish_rows``)."""
    if name == "waveforms":
        return _staged_waveforms(spark, store, plan, rejection)
    rows = publish_rows(store, plan, name, rejection)
    return None if rows is None else spark.createDataFrame(rows)


def publish_rows(store: RunStore, plan: RunPlan, name: str, rejection: Rejection) -> pa.Table | None:
    """The run's rows of the small published table ``name`` (quarantine, dead letters; None:
    none): its candidate table, read by delta-rs, and for the quarantine the rows of the
    waveforms ``rejection`` holds (those go there instead of the waveforms)."""
    source = storage.join(store.candidate_dir(plan.run_id), name)
    parts = [storage.delta_table(source).to_pyarrow_table()] if delta_version(source) is not None else []
    if name == "quarantine" and rejection.rows is not None:
        parts.append(rejection.rows)
    return pa.concat_tables(parts, promote_options="default") if parts else None


def _staged_waveforms(spark: SparkSession, store: RunStore, plan: RunPlan, rejection: Rejection) -> DataFrame | None:
    """The run's new waveforms but the rejected ones, with their payloads, streamed from their
    staged files (``assemble_local``) or grouped by a shuffle (``assemble``), strictly: one
    whose chunks no longer hash to its checksum fails the write (``STAGED_CHANGED``)."""
    manifest = _manifest(store.candidate_dir(plan.run_id))  # read here: no Spark job
    manifest = manifest[~manifest["waveform_id"].isin(rejection.ids)]
    staged, shuffled = (manifest[manifest["written_from"] == kind] for kind in (STAGED, SHUFFLED))
    parts, batch_bytes = [], store.settings.output_batch_bytes
    if len(staged):
        files = chunk_files(store, plan)
        parts.append(assemble_local(spark, files, staged, batch_bytes, scope=plan.run_id, strict=True))
    if len(shuffled):
        chunks = spark.read.parquet(*map(storage.for_spark, staged_chunk_files(store, plan)))
        parts.append(assemble(chunks, wanted_waveforms(spark, shuffled), scope=plan.run_id, strict=True))
    if not parts:
        return None
    frame = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    return frame.drop("checksum_ok").withColumn("run_id", F.lit(plan.run_id))


def publish_run(
    spark: SparkSession,
    settings: Settings,
    plan: RunPlan,
    *,
    rejection: Rejection,
    candidates_in_table: int,
    candidates_total: int,
    checked_version: int | None,
) -> tuple[int | None, int | None]:
    """Append the run's rows to the published tables (keys not there yet only), or for a window
    run replace the window's rows. Returns the output table's version after, and for a window
    run the rows of it that the window's commit replaced (None: Delta did not say).
    ``candidates_*``: the published waveforms (all new but the rejected ones) and how many of
    them the output table already holds (an earlier attempt's publish)."""
    store = RunStore(settings)
    targets = table_paths(settings)
    for target in targets.values():  # written by an earlier wavepipe: made readable by every reader first
        if delta_version(target) is not None:
            repair_schema(target)
    txn = run_txn(store, plan)
    if plan.is_window:
        replaced = _replace_window_run(spark, store, plan, rejection, targets, txn)
        failpoint("publish.after_write")
        return delta_version(settings.output_table), replaced
    for name in PUBLISHED:
        keys, partition_by = TABLE_KEYS[name]
        scope = _run_keys(store, plan, name, rejection)
        if name != "waveforms":
            rows = publish_rows(store, plan, name, rejection)
            if rows is not None:
                append_rows(rows, targets[name], keys, txn, scope)
            continue
        if candidates_total and candidates_in_table == candidates_total:
            continue  # an earlier attempt published them all
        source = publish_source(spark, store, plan, name, rejection)
        if source is not None:
            checked = checked_version if candidates_in_table == 0 else None
            append_new(source, targets[name], keys, partition_by, checked_version=checked, txn=txn, scope=scope)
    failpoint("publish.after_write")
    return delta_version(settings.output_table), None


def _replace_window_run(
    spark: SparkSession, store: RunStore, plan: RunPlan, rejection: Rejection, targets: dict, txn: Txn
) -> int | None:
    """Window run ``plan``'s publish: each table's rows of the window replaced (``replace_window``).
    Returns the output table's rows the commit replaced."""
    reassembled = store.load_result(plan.run_id, Step.REASSEMBLE, Reassembled)
    rows = reassembled.window_rows if reassembled else None
    if rows is None:
        raise CandidatesMismatchError(
            f"run {plan.run_id}: its reassembly recorded no window rows; run the reassemble step again"
        )
    outside = rejection.outside(plan.window_offsets())
    rows = WindowRows(keep=rows.keep, extra={**rows.extra, "quarantine": [*rows.extra.get("quarantine", []), *outside]})
    replaced = {
        name: replace_window(
            spark, publish_source(spark, store, plan, name, rejection), targets[name], name, plan, rows, txn
        )
        for name in PUBLISHED
    }
    return replaced["waveforms"]


def _run_keys(store: RunStore, plan: RunPlan, name: str, rejection: Rejection) -> list[str] | tuple[str, dict]:
    """Where the run's rows of the published table ``name`` can collide with rows already there
    (the ``scope`` of ``append_new`` and ``append_rows``): its waveform ids (read here from its
    candidate tables), or for dead letters its topic and ranges' offsets. A publish compares its
    keys with those rows only, never with every key of a table that grows with every run."""
    if name == "dead_letter":
        return plan.topic, {r.partition: (r.start, r.end) for r in plan.ranges}
    table = storage.join(store.candidate_dir(plan.run_id), "manifest" if name == "waveforms" else "quarantine")
    ids = set(rejection.ids) if name == "quarantine" else set()
    if delta_version(table) is not None:
        ids.update(storage.delta_table(table).to_pyarrow_table(columns=["waveform_id"]).column(0).to_pylist())
    return sorted(ids)


def run_txn(store: RunStore, plan: RunPlan) -> Txn:
    """The transaction every commit of run ``plan`` to a published table carries: its group's
    stable id, the version frozen in its plan (a plan made while a table could not be read gets
    one now, and keeps it), and its ranges and safe offsets as the commit's metadata."""
    app = delta_txn.app_id(plan.group, plan.topic)
    if plan.txn_version is None:
        plan = dataclasses.replace(plan, txn_version=delta_txn.next_version(table_paths(store.settings).values(), app))
        store.save_plan(plan)
    reassembled = store.load_result(plan.run_id, Step.REASSEMBLE, Reassembled)
    safe = {p: acc.safe_offset for p, acc in (reassembled.partitions if reassembled else {}).items()}
    return Txn(app, plan.txn_version, delta_txn.commit_metadata(plan, safe))


def replace_window(
    spark: SparkSession,
    source: DataFrame | None,
    target: str,
    name: str,
    plan: RunPlan,
    rows: WindowRows,
    txn: Txn | None = None,
) -> int | None:
    """Replace the rows of window run ``plan``'s window in ``target`` by ``source`` (what
    ``publish_source`` gives), in one atomic Delta commit (``replaceWhere``): readers see the old
    window or the new one, and a retry replaces it again with the same rows. No rows (None): the
    window's rows are deleted (the window now holds none of this table's rows). ``rows``: the
    reassembly's ``window_rows`` (rows kept although inside the window, rows replaced although
    outside it). Returns the rows of ``target`` that the commit removed (Delta's commit metric;
    None when it does not say)."""
    keys, partition_by = TABLE_KEYS[name]
    if name == "dead_letter":  # records, not waveforms: the window's offsets say it all
        where = window_predicate(plan.topic, plan.window_offsets(), "offset")
    else:
        where = replace_predicate(
            plan.topic, plan.window_offsets(), "first_offset", rows.keep, rows.extra.get(name, [])
        )
    before = delta_version(target)
    if before is None:
        if source is not None:
            append_new(source, target, keys, partition_by, txn=txn)
        return 0
    if source is None:  # SQL: Delta's Python API needs a plugin over Spark Connect
        spark.sql(f"DELETE FROM delta.`{target}` WHERE {where}")
    else:
        with_txn(delta_writer(source), txn).mode("overwrite").option("replaceWhere", where).option(
            "mergeSchema", "true"
        ).save(storage.for_spark(target))
    after = delta_version(target)
    if after == before:
        return 0
    try:  # only describes the run: the window is replaced whatever this says
        return commit_metric(target, after, "numDeletedRows")
    except (OSError, ValueError) as exc:
        log.warning("%s: the rows its commit %s replaced are not known: %s", target, after, exc)
        return None


class StagedChunksChangedError(RuntimeError):
    """A staged chunk file changed on disk after its reader hashed it: nothing of the run's
    waveforms was published, and its staged copies were removed so a retry reads them again."""


class CandidatesMismatchError(RuntimeError):
    """The candidate tables are not what the run's reassembly result says it wrote."""


def check_candidates(spark: SparkSession, store: RunStore, run_id: str) -> Reassembled:
    """Refuse to validate candidates that are not the recorded reassembly's: none recorded (a
    reassembly died before saving its result), or tables whose row counts differ from it (counted
    from each table's Delta log where it can say, else by Spark). Returns the recorded result."""
    reassembled = store.load_result(run_id, Step.REASSEMBLE, Reassembled)
    if reassembled is None:
        raise CandidatesMismatchError(f"run {run_id} has no reassembly result; run its reassemble step first")
    if "manifest" not in reassembled.candidates or "waveforms" in reassembled.candidates:
        raise CandidatesMismatchError(
            f"run {run_id} was reassembled by an earlier wavepipe (its candidates are laid out otherwise); "
            "run its reassemble step again"
        )
    for name, expected in reassembled.candidates.items():
        path = storage.join(store.candidate_dir(run_id), name)
        found = 0
        if delta_version(path) is not None:
            found = delta_row_count(path)
            if found != expected:  # the log cannot say (None), or says otherwise: Spark has the last word
                found = read_delta(spark, path).count()
        if found != expected:
            raise CandidatesMismatchError(
                f"run {run_id}: the candidate table {name} holds {found} rows, its reassembly recorded {expected}; "
                "run the reassemble step again"
            )
    return reassembled


def _checked(
    settings: Settings,
    store: RunStore,
    plan: RunPlan,
    version: int | None,
    reassembled: Reassembled,
) -> pd.DataFrame:
    """The run's new waveforms with the checked columns (``output_checks``), against the output
    table at ``version``: its rows with the manifest's ids (a window run replaces the window's
    rows, so only the rows outside it stay published beside it). None of them had such a row
    at the version the reassembly looked up (it made them new), so the table is looked up again
    (by delta-rs) only if another commit came since."""
    manifest = _manifest(store.candidate_dir(plan.run_id))
    moved = version is not None and version != reassembled.output_version
    ids = sorted(manifest["waveform_id"].unique().tolist()) if moved else []
    published = earlier_rows(settings.output_table, plan, ids, ["run_id"])
    published = published.loc[published["counted"], ["waveform_id", "run_id"]]
    return output_checks(manifest, published, plan.run_id)


def validate_and_publish(spark: SparkSession, settings: Settings, plan: RunPlan) -> Validated:
    """Validate run ``plan``'s candidates: quarantine the waveforms that fail a per-waveform
    expectation, and publish the rest if every run-level expectation holds. The outcome is saved
    as the run's ``validate`` step (and a line of the validation history) either way."""
    with phase("validate"):
        return _validate_and_publish(spark, settings, plan)


def _validate_and_publish(spark: SparkSession, settings: Settings, plan: RunPlan) -> Validated:
    store = RunStore(settings)
    store.clear_step(plan.run_id, Step.VALIDATE)
    reassembled = check_candidates(spark, store, plan.run_id)
    timings: dict[str, float] = {}
    t, now = time.monotonic(), datetime.now(UTC)
    version = delta_version(settings.output_table)
    checked = _checked(settings, store, plan, version, reassembled)
    timings["prepare_s"] = time.monotonic() - t
    notes: list[str] = []  # what could not be described; never a reason to fail the run
    t = time.monotonic()
    found = {}

    def judge_run(rejected: dict[str, dict]) -> pd.DataFrame:
        found["rejection"] = rejection(list(chunk_files(store, plan).values()), rejected, plan.run_id)
        waveforms = settled(reassembled, found["rejection"].moved).waveforms
        return run_frame(waveforms, settings.validate_quarantine_judged_from)

    suites, _, describe = run_suites(settings, plan.run_id, checked, judge_run, now, notes)
    rejected = found["rejection"]
    timings["expectations_s"] = time.monotonic() - t
    kept = _kept(checked, rejected.ids)
    counts = _output_counts(kept)
    wait_for_plot = start_plot(kept, store, plan, settings, notes)
    result = Validated(
        run_id=plan.run_id,
        group=plan.group,
        topic=plan.topic,
        checked_at=utc_now(),
        suite_version=expectations.SUITE_VERSION,
        success=all(s["success"] for s in suites if s["gates_run"]),
        suites=suites,
        data_docs_index="",
        rows=ValidatedRows(
            waveforms=counts["rows"], waveform_bytes=counts["bytes"], staged_records=_staged_record_count(store, plan)
        ),
        thresholds={k: v for k, v in settings.as_dict().items() if k.startswith("validate_")},
        output_table_version=version,
        quarantined=rejected.moved,
    )
    try:
        if result.success:
            t = time.monotonic()
            with phase("publish"):
                _publish(spark, settings, plan, result, rejected, counts, wait_for_plot)
            timings["publish_s"] = time.monotonic() - t
    finally:  # what only describes the run comes after its rows are readable
        t = time.monotonic()
        result.plot, timings["plot_s"] = wait_for_plot()
        timings["plot_wait_s"] = time.monotonic() - t
        t = time.monotonic()
        result.data_docs_index = describe()
        timings["data_docs_s"] = time.monotonic() - t
    result.timings = {k: round(v, 3) for k, v in timings.items()}
    describe_safely(notes, "the validation history", append_validation_history, settings, result)
    result.notes = notes
    store.save_result(plan.run_id, Step.VALIDATE, result)
    _log_outcome(plan, result)
    return result


def _publish(spark, settings: Settings, plan: RunPlan, result: Validated, rejected: Rejection, counts, wait_for_plot):
    """Publish the validated run (``publish_run``) into ``result``; a staged chunk file changed
    since its reader hashed it publishes nothing and sends the run back to read Kafka again."""
    try:
        result.output_table_version, result.replaced_rows = publish_run(
            spark,
            settings,
            plan,
            rejection=rejected,
            candidates_in_table=counts["in_table"],
            candidates_total=counts["rows"],
            checked_version=result.output_table_version,
        )
    except Exception as exc:
        found = re.search(re.escape(STAGED_CHANGED) + r"[^\n]*", str(exc))
        if found is None:
            raise
        wait_for_plot()  # it reads the staged files that are removed now
        _read_again(RunStore(settings), plan)
        raise StagedChunksChangedError(
            f"run {plan.run_id}: {found.group(0)}. None of the run's waveforms was published and no offset "
            "moved. Its staged copies were removed: retry the run (`wavepipe run` resumes it) and it reads "
            "its planned ranges again from Kafka; in Airflow, clear the run's tasks from consume on."
        ) from None
    result.published = True
    # under the output lock: a table's version now is the run's own commit where it put rows
    result.table_versions = {
        name: result.output_table_version if name == "waveforms" else delta_version(path)
        for name, path in table_paths(settings).items()
    }


def _log_outcome(plan: RunPlan, result: Validated) -> None:
    failed = failed_expectations(result.suites, gating_only=True)
    moved = result.quarantined.waveforms
    log.info(
        "run %s validation %s%s%s",
        plan.run_id,
        "passed; published" if result.success else "FAILED: ",
        "; ".join(failed),
        f"; quarantined by expectation: {moved}" if moved else "",
    )


def _read_again(store: RunStore, plan: RunPlan) -> None:
    """Forget the run's staged copies and every result made from them: its next attempt reads its
    planned ranges again (Kafka holds the records; the plan is kept)."""
    store.discard_staging(plan.run_id)
    for r in plan.ranges:
        store.clear_step(plan.run_id, Step.consume(r))
    for step in (Step.REASSEMBLE, Step.VALIDATE):
        store.clear_step(plan.run_id, step)


def import_in_background() -> None:
    """Start importing Great Expectations (about 3 s) while the Spark session starts, instead of after."""
    import importlib
    import threading

    threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Validate one wavepipe run's output; publish it if it passes.")
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    settings, store, plan = load_run(args.run_id, log)
    if plan is None:
        return 2
    with output_lock(settings, store):
        import_in_background()
        spark = SparkSession.builder.appName(f"wavepipe-validate-{plan.run_id}").getOrCreate()
        try:
            result = validate_and_publish(spark, settings, plan)
        except CandidatesMismatchError as exc:
            log.error("%s", exc)
            return 4
        finally:
            spark.stop()
    print(json.dumps({"success": result.success, "published": result.published}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
