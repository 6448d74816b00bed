"""Validation: the run's new waveforms (its manifest: every output column but the payload)
through Great Expectations, in the run's process.

A waveform that fails a per-waveform expectation is quarantined with the expectation's name
(``rejections``); the run may be published (``spark_apps/publish.py``) only if every run-level
expectation holds. The step hands the publish what it decided in memory (``Verdict``): the
waveforms to publish, the rejected ones, and a way to build the results' Data Docs once the rows
are readable. Guarantees: a failed validation publishes nothing and records which expectations
failed, with counts and examples; validation can be retried (after the data is fixed, or a
threshold relaxed). Only the expectations decide the outcome: what merely describes it (Data Docs,
the history line) degrades to a line in the result's ``notes``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from wavepipe import expectations, storage
from wavepipe import pages as run_pages
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import CandidatesMismatchError
from wavepipe.contracts.plan import RunPlan, utc_now
from wavepipe.contracts.report import describe_safely, failed_expectations
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import Reassembled, Validated, ValidatedRows, settled
from wavepipe.offline_docs import localize_site
from wavepipe.run_store import Run, RunStore
from wavepipe.spark_apps.reassemble import MANIFEST_COLUMNS, chunk_files, earlier_rows, manifest_frame, read_manifest
from wavepipe.spark_apps.rejections import INDEX_COLUMNS, Rejection, rejected_waveforms, rejection
from wavepipe.spark_apps.tables import delta_row_count, delta_version, read_delta

log = logging.getLogger("wavepipe.validate")
# Great Expectations logs some 200 INFO lines about its own API docs when it is imported: in a
# run's process (attached to the engine), that would be most of the run's output and task log
logging.getLogger("great_expectations").setLevel(logging.WARNING)

#: Validation results the Data Docs index lists (newest first); older pages stay on disk.
DATA_DOCS_INDEX_RESULTS = 200


# --- pure transformations ------------------------------------------------------------------------


#: The manifest's columns the suites and the plot look at (the payload is not among them).
CHECKED_COLUMNS = [*MANIFEST_COLUMNS, "run_id"]


def output_checks(manifest: pd.DataFrame, published: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """The run's new waveforms (its manifest: one row each, no payload) with the columns the
    per-waveform suite checks. ``published``: (waveform_id, run_id) of the output table's rows
    with the run's ids."""
    by_other = published["run_id"].notna() & (published["run_id"] != run_id)
    other_ids, in_table = set(published.loc[by_other, "waveform_id"]), set(published["waveform_id"])
    return manifest[CHECKED_COLUMNS].assign(
        numbers_finite=np.isfinite(manifest["sample_rate"].astype(float))
        & np.isfinite(manifest["duration_s"].astype(float)),
        published_by_other_run=manifest["waveform_id"].isin(other_ids),
        in_table=manifest["waveform_id"].isin(in_table),
        written_from=manifest["written_from"],
    )


def run_frame(waveforms: dict[str, int], judged_from: int) -> pd.DataFrame:
    """The run-level suite's one row (``expectations.run_frame``: the waveforms judged, the
    quarantined ones, their share, and every quarantine reason with its count)."""
    return expectations.run_frame(waveforms, judged_from)


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
) -> tuple[list[dict], dict[str, dict], DataDocs]:
    """The per-waveform suite on ``checked`` (the run's new waveforms), then the run-level suite
    on the one-row frame ``judge_run(rejected)`` makes, each through a GX checkpoint (results
    stored), in this process.
    Returns the per-suite summaries, the rejected waveforms (``rejections.rejected_waveforms``)
    and the results' ``DataDocs``, to build once the run no longer waits for them
    (``build_data_docs``)."""
    import great_expectations as gx

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

    docs = DataDocs(settings, run_id, context, [shown for *_, shown, _ in checks],
                    [i for *_, stored in checks for i in stored], out, notes)  # fmt: skip
    return out, rejected, docs


_SUMMARY = {"result_format": "SUMMARY", "partial_unexpected_count": 5}


def _check(context, name: str, expectation_list: list, frame, run_id: str, on_failure: dict):
    """Suite ``name`` on ``frame`` (pandas): pass/fail first; only if one fails, again with
    ``on_failure``'s result format (counts, examples, failing rows). Returns (the last result,
    its identifier, every stored result's identifier): each pass is stored and gets its Data
    Docs page, with what each expectation observed in ``frame`` (``expectations.show_observed``)."""
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
        for identifier, result in outcome.run_results.items():  # shown with what it observed
            expectations.show_observed(result, frame)
            context.validation_results_store.set(identifier, result)
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


@dataclass
class DataDocs:
    """A run's Data Docs, to build when nothing waits for them (they only describe the run): the
    GX context its suites ran in, the result shown for each suite, every stored result, the suite
    summaries that get each page's link, and the run's ``notes`` for what could not be built."""

    settings: Settings
    run_id: str
    context: Any
    shown: list
    stored: list
    summaries: list[dict]
    notes: list[str]


def build_data_docs(runs: list[DataDocs]) -> list[str]:
    """Build the Data Docs of ``runs`` at once (the site's index once: they share the home's GX
    project), put each page's link in its run's summaries and keep each run's pages in the run
    state; each run's index URL ("" where building failed: its notes say why)."""
    if not runs:
        return []
    built = describe_safely(
        runs[-1].notes,
        "Great Expectations Data Docs",
        _build_docs,
        runs[-1].context,
        [i for r in runs for i in r.stored],
    )
    if built is None:
        for run in runs[:-1]:
            run.notes.append(runs[-1].notes[-1])
        return [""] * len(runs)
    pages, index = built
    for run in runs:
        for summary, shown in zip(run.summaries, run.shown, strict=True):
            summary["data_docs"] = pages.get(shown)
        if index.startswith("file://"):
            files = [_local(index), *(_local(pages[i]) for i in run.stored if pages.get(i))]
            describe_safely(
                run.notes,
                "keeping the Data Docs in the run state",
                run_pages.keep_data_docs,
                RunStore(run.settings),
                run.run_id,
                files[0].parent,
                files,
                catching=storage.STORAGE_ERRORS,
            )
    return [index] * len(runs)


def _bound_results(store, kept: int) -> int:
    """Remove from GX's validation results ``store`` the results of all runs but the ``kept``
    that validated last (GX lists the whole store at each build, and removes the page of a
    result that is gone); how many went."""
    keys = store.list_keys()
    last: dict[str, str] = {}
    for key in keys:
        run = key.run_id
        last[run.run_name] = max(last.get(run.run_name, ""), run.run_time.isoformat())
    newest = set(sorted(last, key=lambda name: (last[name], name), reverse=True)[:kept])
    gone = [key for key in keys if key.run_id.run_name not in newest]
    for key in gone:
        store.remove_key(key)
    if gone and getattr(store.store_backend, "full_base_directory", None):  # a folder (file context)
        _remove_empty_folders(Path(store.store_backend.full_base_directory))
    return len(gone)


def _remove_empty_folders(root: Path) -> None:
    """Each empty folder under ``root``, deepest first (GX's file stores leave a removed key's)."""
    for folder, _, _ in os.walk(root, topdown=False):
        if folder != str(root) and not os.listdir(folder):
            os.rmdir(folder)


def _local(url: str) -> Path:
    return Path(unquote(urlparse(url).path))


def _build_docs(context, identifiers: list) -> tuple[dict, str]:
    """Build the pages of the stored results ``identifiers`` and the index once: each one's page
    URL (None: not built) and the index URL; a local site's pages load their scripts from it.
    GX's store keeps the results of the last ``pages.PAGES_KEPT`` runs, so the index, which GX
    rebuilds from every stored result, drops the pages of the others."""
    removed = _bound_results(context.validation_results_store, run_pages.PAGES_KEPT)
    context.build_data_docs(resource_identifiers=identifiers)
    pages = {}
    for identifier in identifiers:
        urls = context.get_docs_sites_urls(resource_identifier=identifier)
        pages[identifier] = urls[0]["site_url"] if urls else None
    index_url = context.get_docs_sites_urls()
    index = index_url[0]["site_url"] if index_url else ""
    if index.startswith("file://"):  # GX's pages load their styles and scripts from CDNs
        localize_site(_local(index).parent, [_local(u) for u in [index, *pages.values()] if u])
        if removed:  # GX removed their pages, but not the folders it made for them
            _remove_empty_folders(_local(index).parent / "validations")
    return pages, index


# --- I/O -------------------------------------------------------------------------------------------


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


@dataclass
class ToPublish:
    """What validation hands to the publish: the checked manifest rows (``output_checks``) of the
    waveforms the run publishes (the rejected ones left out), the rejected ones, how many of the
    published ones the output table already holds (an earlier attempt's publish), and the output
    table's version the run's waveforms were checked against (None: no table)."""

    waveforms: pd.DataFrame
    rejection: Rejection
    in_table: int
    checked_version: int | None

    @property
    def all_there(self) -> bool:
        return bool(len(self.waveforms)) and self.in_table == len(self.waveforms)


@dataclass
class Verdict:
    """Validation's outcome (``result``, not published yet), what to publish if it passed, and
    the results' ``DataDocs`` (built after the publish: they only describe it)."""

    result: Validated
    to_publish: ToPublish
    docs: DataDocs


def check_candidates(spark: SparkSession, run: Run, reassembled: Reassembled | None = None) -> Reassembled:
    """Refuse to validate candidates that are not the reassembly's: none (a reassembly died
    before saving its result), or tables whose row counts differ from it (counted from each
    table's Delta log where it can say, else by Spark). ``reassembled``: the reassembly's result
    when it ran in this process (else the recorded one is read). Returns it."""
    store, run_id = run.store, run.run_id
    reassembled = reassembled or run.result(Step.REASSEMBLE, Reassembled)
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
    manifest: pa.Table | None,
) -> pd.DataFrame:
    """The run's new waveforms with the checked columns (``output_checks``), against the output
    table at ``version``: its rows with the manifest's ids (a window run replaces the window's
    rows, so only the rows outside it stay published beside it). None of them had such a row
    at the version the reassembly looked up (it made them new), so the table is looked up again
    (by delta-rs) only if another commit came since."""
    manifest = read_manifest(store.candidate_dir(plan.run_id)) if manifest is None else manifest_frame(manifest)
    moved = version is not None and version != reassembled.output_version
    ids = sorted(manifest["waveform_id"].unique().tolist()) if moved else []
    published = earlier_rows(settings.output_table, plan, ids, ["run_id"])
    published = published.loc[published["counted"], ["waveform_id", "run_id"]]
    return output_checks(manifest, published, plan.run_id)


def validate(
    settings: Settings,
    store: RunStore,
    plan: RunPlan,
    reassembled: Reassembled,
    notes: list[str],
    manifest: pa.Table | None = None,
) -> Verdict:
    """Run the suites on run ``plan``'s candidates (``check_candidates`` them first): the
    waveforms that fail a per-waveform expectation are rejected, the run passes if every
    run-level expectation holds. ``manifest``: the reassembly's, when it ran in this process (else
    read from the candidate table). ``notes`` gets what could not be described."""
    timings: dict[str, float] = {}
    t, now = time.monotonic(), datetime.now(UTC)
    version = delta_version(settings.output_table)
    checked = _checked(settings, store, plan, version, reassembled, manifest)
    timings["prepare_s"] = time.monotonic() - t
    t = time.monotonic()
    found = {}

    def judge_run(rejected: dict[str, dict]) -> pd.DataFrame:
        found["rejection"] = rejection(list(chunk_files(store, plan).values()), rejected, plan.run_id)
        waveforms = settled(reassembled, found["rejection"].moved).waveforms
        return run_frame(waveforms, settings.validate_quarantine_judged_from)

    suites, _, docs = run_suites(settings, plan.run_id, checked, judge_run, now, notes)
    rejected = found["rejection"]
    timings["expectations_s"] = time.monotonic() - t
    kept = _kept(checked, rejected.ids)
    counts = _output_counts(kept)
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
        timings=timings,
    )
    return Verdict(result, ToPublish(kept, rejected, counts["in_table"], version), docs)


def log_outcome(plan: RunPlan, result: Validated) -> None:
    failed = failed_expectations(result.suites, gating_only=True)
    moved = result.quarantined.waveforms
    log.info(
        "run %s validation %s%s%s",
        plan.run_id,
        "passed; published" if result.success else "FAILED: ",
        "; ".join(failed),
        f"; quarantined by expectation or quality rule: {moved}" if moved else "",
    )
