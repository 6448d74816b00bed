"""The run report (JSON, one per run): where every offset of the run's ranges ended.

Per partition: ``output + pending + quarantined + dead_letter + gap (+ other_window) == end - start``,
where ``gap`` counts offsets Kafka delivered no record for (transaction markers, aborted or compacted
records) and ``other_window`` (time-window runs only) the records read that another window owns.
``check_balance`` states every way the numbers fail to add up; the commit refuses to move offsets
while the list is not empty.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import OffsetRange, RunPlan, utc_now
from wavepipe.contracts.runfiles import history_path
from wavepipe.contracts.steps import (
    Named,
    PartitionAccount,
    Published,
    ReadStats,
    Reassembled,
    Validated,
    ValidationQuarantine,
    settled,
    to_record,
)

REPORT_VERSION = 1
#: What the report keeps of the run's validation record.
VALIDATION_IN_REPORT = (
    "success",
    "suite_version",
    "checked_at",
    "suites",
    "rows",
    "data_docs_index",
    "plot",
    "thresholds",
    "notes",
    "quarantined",
)
#: Characters of a failure's reason kept in a note (its first line).
NOTE_REASON_CHARS = 300

log = logging.getLogger(__name__)
T = TypeVar("T")


def describe_safely(
    notes: list[str],
    what: str,
    step: Callable[..., T],
    *args: Any,
    catching: tuple[type[Exception], ...] = (Exception,),
    **kwargs: Any,
) -> T | None:
    """Run ``step``, which only describes a run (a plot, a page, Data Docs, the validation trend):
    it never fails the run. Whatever it raises of ``catching`` (any ``Exception`` unless told) is
    logged as a warning and appended to ``notes`` as one line, ``"<what> failed: <reason>"``; the
    result is then None. Anything else (a narrower ``catching`` lets a programming error through)
    and interrupts and exits (``BaseException``) are not caught."""
    try:
        return step(*args, **kwargs)
    except catching as exc:
        lines = str(exc).strip().splitlines()
        reason = lines[0][:NOTE_REASON_CHARS] if lines else "no reason given"
        note = f"{what} failed: {reason}"
        log.warning("%s; the run goes on (a note in its report)", note)
        log.debug("%s: details", what, exc_info=True)
        notes.append(note)
        return None


def quarantined(validation: Validated | None, published: Published | None) -> ValidationQuarantine | None:
    """The new waveforms the run quarantined after its reassembly: those a per-waveform
    expectation failed, and those a quarantining quality rule held back at the publish."""
    if validation is None:
        return None
    return validation.quarantined.plus(published.held) if published else validation.quarantined


def validation_entry(validation: Validated, published: Published | None) -> dict[str, Any]:
    """The report's ``validation``: what it keeps of the record, whether the run was published,
    and what validation and the publish quarantined."""
    entry = {k: v for k, v in to_record(validation).items() if k in VALIDATION_IN_REPORT}
    return {**entry, "published": published is not None, "quarantined": to_record(quarantined(validation, published))}


def append_validation_history(settings: Settings, validation: Validated, published: Published | None = None) -> None:
    """One line per validation attempt: the trend of pass/fail and counts over runs
    (``published``: its publish, whose quality rules may have held some back)."""
    entry = {
        "run_id": validation.run_id,
        "group": validation.group,
        "topic": validation.topic,
        "checked_at": validation.checked_at,
        "success": validation.success,
        "suite_version": validation.suite_version,
        "waveforms": validation.rows.waveforms,
        "staged_records": validation.rows.staged_records,
        "quarantined": sum(quarantined(validation, published).waveforms.values()),
        "evaluated": sum(s["evaluated"] for s in validation.suites),
        "failed": sum(s["failed_count"] for s in validation.suites),
        "failed_expectations": sorted(
            {
                f"{f['expectation']}:{f.get('column') or f.get('column_A') or ''}"
                for s in validation.suites
                for f in s["failed"]
            }
        ),
    }
    path = history_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:  # one short write per line: appends from two runs do not interleave
        fh.write(json.dumps(entry) + "\n")


def validation_trend(settings: Settings, last: int | None = None, groups: Collection[str] | None = None) -> list[dict]:
    """The last ``last`` validation attempts (default ``report_trend_runs``) of the runs of
    ``groups`` (a group and its backfill lane; default all), oldest first."""
    path = history_path(settings)
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if groups is None or entry.get("group") in groups:
            entries.append(entry)
    return entries[-(last or settings.report_trend_runs) :]


def failed_expectations(suites: list[dict[str, Any]], *, gating_only: bool = False) -> list[str]:
    """Each failed expectation of ``suites`` (a validation's), one line: what, on which column,
    how many rows, an example. ``gating_only``: only the suites whose failure fails the run (the
    per-waveform suite quarantines instead)."""
    lines = []
    for suite in suites:
        if gating_only and not suite.get("gates_run", True):
            continue
        for f in suite["failed"]:
            where = (
                f.get("column")
                or (f"{f['column_A']} = {f['column_B']}" if f.get("column_A") else None)
                or ", ".join(f.get("column_list") or [])
            )
            count = (
                f"{f['unexpected_count']} rows ({f['unexpected_percent']}%)"
                if f.get("unexpected_count") is not None
                else (f"error: {f['error']}" if f.get("error") else "failed")
            )
            example = f"; e.g. {f['examples'][:2]}" if f.get("examples") else ""
            lines.append(f"{suite['suite']}: {f['expectation']} on {where}: {count}{example}")
    return lines


def waveform_outcome(
    waveforms: dict[str, int], dead_letter_records: int, *, window: bool, replaced_rows: int | None = None
) -> dict[str, int | None]:
    """Where the run's waveforms went, one count each (stable keys, for people and scripts):
    ``new`` (written by an incremental run); for a window run ``rewritten`` (written into its
    window) and ``replaced`` (the window's earlier rows its commit removed, from Delta's commit
    metrics: None when they do not say); ``already_written`` (a re-delivery of waveforms the
    table holds), ``pending`` (incomplete: read again next run), ``quarantined`` (every reason),
    ``other_window`` (a window run's reading of another window's waveforms) and
    ``dead_letter_records`` (records, not waveforms: messages that follow no protocol)."""
    written = waveforms.get("output_new", 0)
    return {
        "new": 0 if window else written,
        "rewritten": written if window else 0,
        "replaced": replaced_rows if window else 0,
        "already_written": waveforms.get("output_already_written", 0),
        "pending": waveforms.get("pending", 0),
        "quarantined": sum(n for k, n in waveforms.items() if k.startswith("quarantined")),
        "other_window": waveforms.get("other_window", 0),
        "dead_letter_records": dead_letter_records,
    }


#: The partitions' counts that a report's ``totals`` sums.
_SUMMED = (
    "offsets",
    "records_read",
    "output",
    "output_already_written",
    "pending",
    "quarantined",
    "dead_letter",
    "gap",
    "payload_bytes_read",
    "output_bytes",
    "other_window",
)


def _partition_entry(
    plan: RunPlan, r: OffsetRange, consumed: dict[int, ReadStats], reassembled: Reassembled | None
) -> dict:
    """One planned range's entry of the report: what was read and where each record ended."""
    read = consumed.get(r.partition) or ReadStats(r.topic, r.partition, r.start, r.end)
    acc = (reassembled.partitions.get(r.partition) if reassembled else None) or PartitionAccount(safe_offset=r.end)
    return {
        "topic": r.topic,
        "start": r.start,
        "end": r.end,
        "offsets": r.size,
        "read": r.partition in consumed,
        "records_read": read.records,
        "chunks_read": read.chunks,
        "payload_bytes_read": read.payload_bytes,
        "gap": r.size - read.records if r.partition in consumed else 0,
        "read_seconds": read.seconds,
        # offsets before ``start`` the topic no longer retained, skipped on request: [from, to)
        "lost": plan.lost.get(r.partition),
        # records between the run's start and the partition's last stable offset when planned
        "lag_before": max(0, plan.latest[r.partition] - r.start) if r.partition in plan.latest else None,
        "lag_after": None,  # set by the commit: records after the committed offset then
        "unplanned": None,  # set by the commit: of those, the records after ``end`` (a cap, or newer)
        "left_by_cap": 0,  # set by the commit: records the plan saw after ``end`` (left by a cap)
        **to_record(acc),
    }


def _timings(
    timings: dict[str, float],
    partitions: dict[str, dict],
    reassembled: Reassembled | None,
    validation: Validated | None,
    published: Published | None,
) -> dict[str, float]:
    """The steps' seconds, the readers' sum and maximum (they may run in parallel, one mapped task
    each), and the Spark, validation and publish steps' own timers (``spark_``, ``validate_``,
    ``publish_``)."""
    out = {k: round(v, 3) for k, v in timings.items()}
    read_seconds = [part["read_seconds"] for part in partitions.values()]
    out["consume_sum"] = round(sum(read_seconds), 3)
    out["consume_max"] = round(max(read_seconds, default=0.0), 3)
    out.update({f"spark_{k}": v for k, v in (reassembled.timings if reassembled else {}).items()})
    out.update({f"validate_{k}": v for k, v in (validation.timings if validation else {}).items()})
    out.update({f"publish_{k}": v for k, v in (published.timings if published else {}).items()})
    return out


def build_report(
    plan: RunPlan,
    consumed: dict[int, ReadStats],
    reassembled: Reassembled | None,
    timings: dict[str, float],
    *,
    skipped_reason: str | None = None,
    validation: Validated | None = None,
    published: Published | None = None,
) -> dict[str, Any]:
    """Merge what each step recorded into one report (commit fields are added by the commit).
    The report is the run's JSON document: its partitions are keyed by their number as text.
    Waveforms that validation or the publish quarantined are accounted as quarantined (``settled``)."""
    reassembled = settled(reassembled, quarantined(validation, published))
    named = published.named if published else validation.named if validation else None
    partitions = {str(r.partition): _partition_entry(plan, r, consumed, reassembled) for r in plan.ranges}
    totals = {key: sum(part.get(key, 0) for part in partitions.values()) for key in _SUMMED}
    totals["lost"] = sum(to - start for start, to in plan.lost.values())
    report = {
        "report_version": REPORT_VERSION,
        "run_id": plan.run_id,
        "topic": plan.topic,
        "group": plan.group,
        "planned_at": plan.created_at,
        "reported_at": utc_now(),
        "skipped": skipped_reason,
        "partitions": partitions,
        "totals": totals,
        "waveforms": dict(reassembled.waveforms) if reassembled else {},
        "outcome": waveform_outcome(
            dict(reassembled.waveforms) if reassembled else {},
            totals["dead_letter"],
            window=plan.is_window,
            replaced_rows=published.replaced_rows if published else None,
        ),
        # what bounded the run: a cap on the records read per partition, a time window
        "caps": {k: v for k, v in plan.caps.items() if v},
        "window": plan.window,
        # how the new waveforms were verified: hashed by their reader as it staged them, or by Spark
        "verified": dict(reassembled.verified) if reassembled else {},
        "output_table_version": published.output_table_version if published else None,
        "table_versions": dict(published.table_versions) if published else {},
        "validation": None if validation is None else validation_entry(validation, published),
        # what the published waveforms' measured quality says (docs/quality.md); None: not measured
        "quality": published.quality if published else None,
        # the quarantined waveforms and dead letters by name, the first few (``steps.Named``);
        # None: not known (not validated yet)
        "named": named_record(named) if named else None,
        # what could not be described (a plot, Data Docs, the page, the trend): never a failure
        "notes": list(validation.notes) if validation else [],
        "timings_s": _timings(timings, partitions, reassembled, validation, published),
    }
    wall = sum(timings.get(k, 0.0) for k in ("plan", "reassemble", "validate")) + report["timings_s"]["consume_sum"]
    report["throughput_mb_s"] = round(totals["payload_bytes_read"] / 1e6 / wall, 2) if wall > 0 else None
    report["balance_errors"] = check_balance(report)
    return report


def with_description(report: dict[str, Any], validation: Validated) -> dict[str, Any]:
    """``report`` with its run's validation as described after the commit (``spark_apps.describe``:
    the plot, the Data Docs' links, the flagged plot in the quality, their notes and timings)."""
    timings = {f"validate_{k}": v for k, v in validation.timings.items()}
    described = {k: v for k, v in to_record(validation).items() if k in VALIDATION_IN_REPORT and k != "quarantined"}
    quality = report.get("quality")
    return {
        **report,
        "validation": {**(report.get("validation") or {}), **described},
        "quality": {**quality, "plot": validation.flagged_plot} if quality and validation.flagged_plot else quality,
        "notes": list(dict.fromkeys([*report.get("notes", []), *validation.notes])),
        "timings_s": {**report.get("timings_s", {}), **timings},
    }


def named_record(named: Named) -> dict[str, Any]:
    """``named`` as the report holds it: JSON's partition keys (text), and no empty field of a
    name (a dead letter has no chunk count)."""
    record = to_record(named)
    for key in ("quarantined", "dead_letter"):
        record[key] = [{k: v for k, v in entry.items() if v is not None} for entry in record[key]]
    for key in ("quarantined_waveforms", "quarantined_reasons"):
        record[key] = {str(p): v for p, v in sorted(record[key].items())}
    return record


def spark_jobs_summary(by_step: dict[str, list[dict] | None]) -> dict[str, Any]:
    """The Spark jobs a run started, from its engine steps' records (step -> the engine's list of
    the jobs, None where it could not say): how many, their seconds, and each job. ``count`` is
    None when a step's jobs are unknown (a remote engine without a job list)."""
    known = all(jobs is not None for jobs in by_step.values())
    every = [{**job, "step": step} for step, jobs in by_step.items() for job in jobs or ()]
    return {
        "count": len(every) if known else None,
        "seconds": round(sum(job.get("s") or 0 for job in every), 3),
        "by_step": {step: None if jobs is None else len(jobs) for step, jobs in by_step.items()},
        "jobs": every,
    }


def check_balance(report: dict[str, Any]) -> list[str]:
    """Every way the report's counts fail to add up (empty when they do)."""
    errors = []
    for p, part in report["partitions"].items():
        if not part.get("read", True):
            continue  # not read in this run (nothing new there): its offsets stay uncommitted
        other = part.get("other_window", 0)
        placed = part["output"] + part["pending"] + part["quarantined"] + part["dead_letter"] + part["gap"] + other
        if placed != part["offsets"]:
            errors.append(
                f"partition {p}: output {part['output']} + pending {part['pending']} + quarantined "
                f"{part['quarantined']} + dead letter {part['dead_letter']} + gap {part['gap']}"
                + (f" + other windows' {other}" if other else "")
                + f" = {placed}, "
                f"but the range [{part['start']}, {part['end']}) holds {part['offsets']} offsets"
            )
        chunks = part["output"] + part["pending"] + part["quarantined"] + part.get("other_window_chunks", 0)
        if chunks != part["chunks_read"]:
            errors.append(f"partition {p}: {part['chunks_read']} chunks read but {chunks} placed")
        if not part["start"] <= part["safe_offset"] <= part["end"]:
            errors.append(f"partition {p}: safe offset {part['safe_offset']} outside [{part['start']}, {part['end']}]")
        if part["gap"] < 0:
            errors.append(f"partition {p}: read {part['records_read']} records from {part['offsets']} offsets")
    return errors
