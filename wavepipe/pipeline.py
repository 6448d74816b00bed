"""The steps of one run, shared by the DAG's operators and the ``wavepipe`` CLI.

plan -> consume (per partition) -> reassemble -> validate -> publish -> commit; the Spark side
(reassemble, validate, publish) runs in one session (``spark_apps/engine_run.py``). Each step is
safe to retry: the plan is frozen, staged files are overwritten, the reassembly replaces the run's
candidate tables (its manifest: the new waveforms but their bytes), validation quarantines the
waveforms that fail a per-waveform expectation, the publish happens only when every run-level
expectation holds (writing the waveforms' bytes once, append-if-absent, under the group's Delta
transaction), and the commit refuses a run whose output was not published, or whose group's
offsets moved since it was planned (read just before the commit: Kafka has no compare-and-set
for offsets; the run's claim on the group keeps other wavepipe runs out meanwhile).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Unpack

from wavepipe import engine_client, maintenance, pages, report_html, spark_launch, storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import (
    BUGS,
    CommittedElsewhereError,
    ConflictError,
    StepFailedError,
    UnavailableError,
    UsageError,
    ValidationFailedError,
    WavepipeError,
    first_line,
)
from wavepipe.contracts.plan import ActiveRunError, RunPlan, RunRequest, as_utc, new_run_id, run_request, safe_run_id
from wavepipe.contracts.report import (
    build_report,
    describe_safely,
    failed_expectations,
    spark_jobs_summary,
    validation_trend,
    with_description,
)
from wavepipe.contracts.runfiles import Step, html_path, json_path
from wavepipe.contracts.steps import Published, ReadStats, Reassembled, Validated
from wavepipe.delta_txn import dead_letters_of
from wavepipe.faults import failpoint
from wavepipe.run_store import Run, RunStore, staged_paths
from wavepipe.spark_apps.app import output_lock
from wavepipe.state import StepBusyError

log = logging.getLogger(__name__)
# found through the package (a checkout's spark_apps/ or an installed wheel's), so spark-submit
# runs the installed files
SPARK_APPS = Path(next(iter(importlib.import_module("wavepipe.spark_apps").__path__)))
ENGINE_APP = SPARK_APPS / "engine_run.py"


class AccountingError(StepFailedError):
    """What the run read, staged and published does not add up: nothing was committed."""


def _noted_on_failure(step: str):
    """A failure of the decorated step (``fn(settings, run_id, ...)``) is noted in its group's
    history with its reason in a line (``wavepipe status`` lists it), then raised as it was. A
    window run waiting for its lane is not a failure, and a refusal (``UsageError``: what was
    asked can never work) is noted as one."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(settings: Settings, run_id: str, *args, **kwargs):
            try:
                return fn(settings, run_id, *args, **kwargs)
            except ActiveRunError:
                if kwargs.get("window") is None:
                    _note_failure(settings, run_id, step, kwargs)
                raise
            except TypeError:  # a caller's mistake (an unknown option), not a run's failure
                raise
            except UsageError as exc:
                note_refusal(settings, run_id, kwargs, exc)
                raise
            except Exception as exc:
                if step in _UNDONE_BY_A_COMMIT and is_committed(settings, run_id):
                    raise CommittedElsewhereError(
                        f"run {run_id} was committed by another worker while this one ran; this attempt changed "
                        f"nothing ({step}: {first_line(exc)})"
                    ) from exc
                _note_failure(settings, run_id, step, kwargs)
                if storage.no_space(exc):
                    raise storage.disk_full(settings, _step_writes(settings, run_id, step)) from exc
                raise

        return run

    return wrap


#: The steps that fail on what a commit removes (the run's staged files, its claim) when another
#: worker commits their run while they run.
_UNDONE_BY_A_COMMIT = ("consume", "reassemble", "validate")


def is_committed(settings: Settings, run_id: str) -> bool:
    """Whether the run's report record says it committed (False when the state cannot say)."""
    try:
        return _committed(RunStore(settings).load_step(safe_run_id(run_id), Step.REPORT))
    except (WavepipeError, OSError):  # the state did not answer: the step's own failure stands
        return False


def _step_writes(settings: Settings, run_id: str, step: str) -> int | None:
    """About how many bytes ``step`` writes: the run's staged bytes for the engine's steps (their
    tables are about as large), else None (a reader's records are not known before they are read)."""
    if step not in ("reassemble", "validate"):
        return None
    try:
        return RunStore(settings).staged_bytes(safe_run_id(run_id))
    except BUGS:
        raise
    except Exception:  # only describes the failure, which stands
        return None


def note_refusal(settings: Settings, run_id: str, request: dict, reason: BaseException | str) -> None:
    """Note a refused run (``RunStore.record_refusal``) with the topic and group it asked for;
    noting it never hides the refusal itself."""
    try:
        RunStore(settings).record_refusal(
            safe_run_id(run_id),
            request.get("topic") or settings.topic,
            request.get("group") or settings.group,
            first_line(reason),
        )
    except Exception as noted:  # only describes: the refusal stands whether or not it is noted
        log.warning("run %s: could not note its refusal in the run state (%s)", run_id, storage.briefly(noted))


def _note_failure(settings: Settings, run_id: str, step: str, request: dict) -> None:
    from wavepipe.consumers.planner import backfill_lane

    reason = first_line(sys.exc_info()[1])
    try:
        store = RunStore(settings)
        window = request.get("window")  # a plan that failed: under the id it was to be planned as
        run_id = window_run_id(settings, run_id, window) if window else current_run_id(settings, run_id)
        plan = store.load_plan(run_id)
        group = request.get("group") or settings.group
        group = plan.group if plan else backfill_lane(group) if window else group
        store.record_failure(group, run_id, step, reason)
    except Exception as noted:  # describing a failure must not hide it
        log.warning("run %s: could not note its failure in the run state (%s)", run_id, storage.briefly(noted))


def _timed(run: Run, step: str, began: float) -> None:
    timings = dict(run.raw(Step.TIMINGS) or {})
    timings[step] = round(time.monotonic() - began, 3)
    run.record(Step.TIMINGS, timings)


def plan_step(settings: Settings, run_id: str, **request: Unpack[RunRequest]) -> RunPlan:
    """Freeze the run's ranges: from the group's committed offsets (incremental; a group without
    any starts at ``new_group_start``), or, with ``window=(start, end)``, the offsets of that time
    window (a backfill: see ``plan_window_run``), as the run ``window_run_id`` names (the plan's
    ``run_id``)."""
    return _planned(settings, run_id, **request).plan


@_noted_on_failure("plan")
def _planned(settings: Settings, run_id: str, known: RunPlan | None = None, **request: Unpack[RunRequest]) -> Run:
    """``plan_step``'s run, as the value its next steps take (``known``: the plan of ``run_id``
    if the caller read it already, so it is not read again)."""
    from wavepipe.consumers.planner import plan_run, plan_window_run

    request = run_request(request)
    window = request.pop("window", None)
    began = time.monotonic()
    run_id = safe_run_id(run_id)
    with RunStore(settings).step_lock(run_id, Step.RUN):  # two first attempts must not plan twice
        if window is not None:
            if request.get("max_records") or request.get("max_bytes") or request.get("skip_lost_offsets"):
                raise UsageError(
                    "a window run reads its whole window: max_records, max_bytes and "
                    "skip_lost_offsets apply to incremental runs only"
                )
            topic, group = request.get("topic"), request.get("group")
            _give_up_replaced(settings, run_id)
            run_id = window_run_id(settings, run_id, window)
            plan = plan_window_run(settings, run_id, start=window[0], end=window[1], topic=topic, group=group)
        else:
            plan = plan_run(settings, run_id, known=known, **request)
    run = Run(RunStore(settings), plan)
    _timed(run, "plan", began)
    return run


def partitions_to_read(plan: RunPlan) -> list[int]:
    """Partitions whose range is not empty, or [] when nothing new arrived since the last run."""
    if not plan.has_new_data:
        return []
    return [r.partition for r in plan.ranges if r.size]


def nothing_to_read(plan: RunPlan) -> str:
    """Why a run reads nothing, in words (its report's ``skipped``)."""
    if plan.is_window:
        return (
            f"the window [{plan.window['start']}, {plan.window['end']}) holds no records of {plan.topic}: nothing to "
            "reprocess, and its output is left as it is"
        )
    if plan.total_offsets:
        return "no new records since the last run (the chunks there wait for the rest of their waveforms)"
    return "no records since the last run"


def partition_groups(plan: RunPlan, tasks: int) -> list[list[int]]:
    """The partitions to read, split into at most ``tasks`` groups of about equal offsets (0: one
    group per partition): one mapped consume task each. The largest range goes first to the least
    loaded group, so one long partition does not share a task with others when it need not."""
    sizes = {r.partition: r.size for r in plan.ranges}
    partitions = partitions_to_read(plan)
    if tasks <= 0 or tasks >= len(partitions):
        return [[p] for p in partitions]
    groups: list[list[int]] = [[] for _ in range(tasks)]
    load = [0] * tasks
    for p in sorted(partitions, key=lambda p: (-sizes[p], p)):
        i = min(range(tasks), key=lambda i: (load[i], i))
        groups[i].append(p)
        load[i] += sizes[p]
    return [sorted(g) for g in groups]


def partition_ranges(partitions: list[int], limit: int = 200) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``"0-3,7,9-10"``, cut to ``limit`` characters (``...`` and the count)."""
    spans: list[list[int]] = []
    for p in sorted(partitions):
        if spans and p == spans[-1][1] + 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    if len(text) <= limit:
        return text
    tail = f"... ({len(partitions)} partitions)"
    return text[: max(0, limit - len(tail))].rsplit(",", 1)[0] + tail


def consume_step(settings: Settings, run_id: str, partition: int, plan: RunPlan | None = None) -> dict:
    """Read and stage ``partition``'s planned range (``plan``: the run's, when the caller has it;
    else it is read); a summary of what was read."""
    from wavepipe.consumers.reader import read_range

    run_id = safe_run_id(run_id)
    store = RunStore(settings)
    with store.step_lock(run_id, Step.consume_lock(partition)):
        for stale in (Step.REASSEMBLE, Step.VALIDATE, Step.PUBLISH):  # made from the staged files this step replaces
            store.clear_step(run_id, stale)
        began = time.monotonic()
        stats = read_range(settings, run_id, partition, plan)  # records its own timing
    # began/ended: this machine's monotonic clock, comparable between the readers of one step
    return {
        "partition": partition,
        "records": stats.records,
        "chunks": stats.chunks,
        "dead_letters": stats.dead_letters,
        "bytes": stats.payload_bytes,
        "seconds": stats.seconds,
        "began": began,
        "ended": time.monotonic(),
    }


@_noted_on_failure("consume")
def consume_all(settings: Settings, run_id: str, partitions: list[int], plan: RunPlan | None = None) -> list[dict]:
    """The consume step of each partition, ``settings.consume_parallelism`` at a time.

    Each partition is read in a process of its own (the reader is CPU-bound in Python), started
    with ``spawn`` so no Kafka client threads of this process are forked (so, as with any
    ``spawn``, a script calling this needs an ``if __name__ == "__main__":`` guard); a small plan
    (``consume_in_process_max_records``) is read by threads of this process instead. One failed
    partition fails the call after the others finish; their staged files stay valid for the retry.
    ``plan``: the run's, when the caller has it (else it is read once, here).
    """
    workers = max(1, min(settings.consume_parallelism, len(partitions)))
    plan = plan or _require_plan(RunStore(settings), safe_run_id(run_id))
    if workers == 1:
        steps = [functools.partial(consume_step, settings, run_id, p, plan) for p in partitions]
        results, errors = _gathered(partitions, steps)
    else:
        with _reader_pool(settings, run_id, plan, partitions, workers) as pool:
            futures = [pool.submit(consume_step, settings, run_id, p, plan) for p in partitions]
            results, errors = _gathered(partitions, [f.result for f in futures])
    if errors:
        raise consume_failure(settings, run_id, errors)
    return results


def _reader_pool(settings: Settings, run_id: str, plan: RunPlan, partitions: list[int], workers: int):
    """Threads of this process for a small plan, else ``spawn``ed processes (see ``consume_all``)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    planned = {r.partition: r.size for r in plan.ranges}
    small = sum(planned.get(p, 0) for p in partitions) <= settings.consume_in_process_max_records
    if settings.consume_in_process_max_records and small:
        return ThreadPoolExecutor(workers, thread_name_prefix=f"wavepipe-reader-{run_id}")
    level = logging.getLogger().getEffectiveLevel()
    return ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_logging, initargs=(level,)
    )


def _gathered(partitions: list[int], steps: list) -> tuple[list[dict], list[tuple[int, Exception]]]:
    """Each partition's result, or its error: every step is waited for (or run) whichever failed
    before it. A defect of wavepipe's reader is raised with its traceback, not as a partition's line."""
    results, errors = [], []
    for partition, step in zip(partitions, steps, strict=True):
        try:
            results.append(step())
        except BUGS:
            raise
        except Exception as exc:
            errors.append((partition, exc))
    return results, errors


def consume_failure(settings: Settings, run_id: str, errors: list[tuple[int, Exception]]) -> WavepipeError:
    """One error for the partitions whose consume step failed, of the kind of theirs the run acts
    on (the object store first, in the one line ``storage.unreachable`` gives), in one line: the
    partitions that failed alike, then the error they share."""
    elsewhere = [exc for _, exc in errors if isinstance(exc, CommittedElsewhereError)]
    if elsewhere:
        return elsewhere[0]
    alike: dict[str, list[int]] = {}
    for partition, exc in errors:
        alike.setdefault(first_line(exc), []).append(partition)
    said = "; ".join(f"partition{'s' * (len(ps) > 1)} {', '.join(map(str, ps))}: {line}" for line, ps in alike.items())
    kept = "The plan and the staged files are kept: a retry re-reads only what is missing."
    if any(storage.store_failed(exc) for _, exc in errors):
        why = storage.unreachable(settings) or said
        return storage.StorageUnavailableError(f"run {run_id}: consuming failed: {why}")
    kinds = [
        k
        for k in (storage.DiskFullError, UnavailableError, ConflictError)
        if all(isinstance(exc, k) for _, exc in errors)
    ]
    kind = kinds[0] if kinds else StepFailedError
    return kind(f"run {run_id}: consuming failed for {said}. {kept}")


def consume_run(run: Run, partitions: list[int]) -> list[dict]:
    """``consume_all`` for a run this process holds: its readers get its plan, and what they
    recorded or cleared (each range's record, the results made from the files they replaced) is
    read again when next asked."""
    read = consume_all(run.settings, run.run_id, partitions, run.plan)
    consumed = (Step.consume(r) for r in run.plan.ranges if r.partition in partitions)
    run.forget(Step.REASSEMBLE, Step.VALIDATE, Step.PUBLISH, *consumed)
    return read


def _worker_logging(level: int) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@_noted_on_failure("reassemble")
def reassemble_step(
    settings: Settings, run_id: str, *, validate: bool = False, defer_description: bool = False, run: Run | None = None
) -> Reassembled | None:
    """Run the Spark app on the run's staged chunks (nothing when the run read nothing); it writes
    the run's candidate tables. ``validate``: then validate and publish in the same Spark session
    (as ``validate_step`` would, without starting a second one; ``defer_description``: as it).
    ``run``: the run as this process has it (else it is loaded)."""
    run = _spark_run(settings, run_id, run)
    if run is None:
        return None
    store, run_id = run.store, run.run_id
    began = time.monotonic()
    with store.step_lock(run_id, Step.RUN):
        if settings.spark_engine == "submit":
            spark_launch.submit(
                settings,
                ENGINE_APP,
                "--run-id",
                run_id,
                "--step",
                "reassemble",
                *(["--validate"] if validate else []),
                staged_bytes=store.staged_bytes(run_id),
            )
            run.forget(Step.REASSEMBLE, Step.VALIDATE, Step.PUBLISH)  # recorded by the app's own process
        else:
            _on_engine(run, "reassemble", validate=validate, defer=defer_description)
    _timed(run, "reassemble", began)
    result = run.result(Step.REASSEMBLE, Reassembled)
    if result is None:
        raise StepFailedError(f"the Spark app finished but left no result for run {run_id}")
    if validate:
        _check_validation(run)
    return result


@_noted_on_failure("validate")
def validate_step(
    settings: Settings, run_id: str, *, defer_description: bool = False, run: Run | None = None
) -> Validated | None:
    """Run the expectation suites on the run's manifest and staged chunks; publish the
    output if all hold, else raise ``ValidationFailedError`` naming the failed expectations (the
    run stays unpublished and uncommitted; retry this step after fixing the data or the config).
    What only describes a published run is made after its publish, or with ``defer_description``
    left in this process for ``describe_step`` after its commit (the engine attached here only).
    ``run``: the run as this process has it (else it is loaded)."""
    run = _spark_run(settings, run_id, run)
    if run is None:
        return None
    store, run_id = run.store, run.run_id
    if run.result(Step.REASSEMBLE, Reassembled) is None:
        raise StepFailedError(f"run {run_id}: no reassembly result; run the reassemble step first")
    done = run.result(Step.VALIDATE, Validated)  # a reassembly clears it
    if done is not None and done.success and run.result(Step.PUBLISH, Published) is not None:
        log.info("run %s: validated and published by its reassemble step; nothing left to do", run_id)
        return done
    began = time.monotonic()
    with store.step_lock(run_id, Step.RUN):
        if settings.spark_engine == "submit":
            spark_launch.submit(
                settings, ENGINE_APP, "--run-id", run_id, "--step", "validate", staged_bytes=store.staged_bytes(run_id)
            )
            run.forget(Step.VALIDATE, Step.PUBLISH)  # recorded by the app's own process
        else:
            _on_engine(run, "validate", defer=defer_description)
    _timed(run, "validate", began)
    return _check_validation(run)


def _on_engine(run: Run, step: str, *, validate: bool = False, defer: bool = False) -> None:
    """Run ``step`` (``reassemble``, then validate too if ``validate``; or ``validate``) in this
    process, attached to the Spark engine (``wavepipe.engine_client``), holding the output tables'
    lock; ``defer``: the published run's description waits for its commit (``describe_step``)."""
    from wavepipe.spark_apps import engine_run

    if validate or step == "validate":
        engine_run.import_in_background()
    settings, plan = run.settings, run.plan
    staged = run.store.staged_bytes(plan.run_id)
    jobs: dict = {}
    with output_lock(settings, run.store), _jobs_recorded(run, step, jobs):
        began = time.monotonic()
        with (
            engine_client.attached(settings) as session,
            engine_client.sole_writer(session, settings),
            engine_client.counted_jobs(session, settings, jobs),
            engine_client.stage_progress(session) as stages,
            spark_launch.progress(f"Spark step {step}", staged, detail=stages.summary),
        ):
            attach_s = time.monotonic() - began
            log.info("run %s: attached to the Spark engine in %.2fs", plan.run_id, attach_s)
            try:
                if step == "reassemble":
                    engine_run.reassemble_and_save(session, run, validate=validate, session_s=attach_s, defer=defer)
                else:
                    engine_run.validate_and_publish(session, run, defer=defer)
            except BaseException as exc:
                engine_client.after_failure(session, exc)
                raise


@contextlib.contextmanager
def _jobs_recorded(run: Run, step: str, jobs: dict):
    """After an engine step, successful or not: the Spark jobs it started (``jobs["jobs"]``, as
    ``engine_client.counted_jobs`` found them) recorded under the step's name for the run's report."""
    try:
        yield
    finally:
        if "jobs" in jobs:
            recorded = dict(run.raw(Step.SPARK_JOBS) or {})
            recorded[step] = jobs["jobs"]
            run.record(Step.SPARK_JOBS, recorded)


def _spark_run(settings: Settings, run_id: str, run: Run | None) -> Run | None:
    """The run (``run``, else loaded); None when it read nothing new (no Spark app to start)."""
    run = run or _require_run(settings, run_id)
    if not partitions_to_read(run.plan):
        log.info("run %s read nothing new: no Spark app", run.run_id)
        return None
    return run


def _check_validation(run: Run) -> Validated:
    plan = run.plan
    validation = run.result(Step.VALIDATE, Validated)
    if validation is None:
        raise StepFailedError(f"run {plan.run_id}: the validation app finished but left no result")
    if validation.success:
        return validation
    report = _report(run, _recorded(run), validation=validation)
    report["status"] = "validation_failed"
    page = _write_report(run.settings, report)
    lines = failed_expectations(validation.suites, gating_only=True)
    raise ValidationFailedError(
        f"run {plan.run_id} failed validation ({len(lines)} expectation(s)); nothing was published and no "
        f"offset moved:\n  " + "\n  ".join(lines) + f"\nReport: {page}\nData Docs: {validation.data_docs_index}\n"
        "Fix the data and run reassemble and validate again, or relax the threshold (validate_* settings) "
        "and retry the validate step (`wavepipe run` resumes the run); `wavepipe abandon` gives the run up."
    )


def _write_report(settings: Settings, report: dict) -> Path:
    """The run's JSON report and its HTML page beside it, both kept in the run state too; returns
    the page. The page, the validation trend on it and its copy in the state only describe the
    run: when one fails, ``report["notes"]`` says so (in the JSON, and on a plain page with the
    notes and the report) and the run goes on."""
    from wavepipe.consumers.planner import lanes

    notes = report.setdefault("notes", [])
    trend = describe_safely(notes, "the validation trend", validation_trend, settings, groups=lanes(report["group"]))
    plot = (report.get("validation") or {}).get("plot")  # this attempt's, not an earlier one's
    page = html_path(settings, report["run_id"])
    if (
        describe_safely(
            notes,
            "the run's page",
            report_html.write,
            report,
            page,
            trend=trend or [],
            plot_png=Path(plot) if plot else None,
        )
        is None
    ):
        describe_safely(notes, "the run's plain page", report_html.write_plain, report, page)
    store = RunStore(settings)
    describe_safely(
        notes,
        "keeping the run's page in the run state",
        pages.keep_page,
        store,
        report["run_id"],
        catching=storage.STORAGE_ERRORS,
    )
    store.save_report(report)
    return page


@dataclass
class _Recorded:
    """What a run's steps recorded (per partition read, its reader's stats), read once by a step."""

    consumed: dict[int, ReadStats]
    reassembled: Reassembled | None
    validated: Validated | None
    published: Published | None
    timings: dict


def _recorded(run: Run) -> _Recorded:
    consumed = {r.partition: run.result(Step.consume(r), ReadStats) for r in run.plan.ranges}
    return _Recorded(
        {p: read for p, read in consumed.items() if read is not None},
        run.result(Step.REASSEMBLE, Reassembled),
        run.result(Step.VALIDATE, Validated),
        run.result(Step.PUBLISH, Published),
        dict(run.raw(Step.TIMINGS) or {}),
    )


def _report(run: Run, recorded: _Recorded, *, validation: Validated | None, skipped: str | None = None) -> dict:
    plan = run.plan
    report = build_report(
        plan,
        recorded.consumed,
        recorded.reassembled,
        recorded.timings,
        skipped_reason=skipped,
        validation=validation,
        published=recorded.published if validation else None,
    )
    if plan.moved:  # the group was moved by someone else since this home's last commit
        report["moved"] = {str(p): move for p, move in plan.moved.items()}
    if plan.new_group_start:
        report["new_group_start"] = plan.new_group_start
    if plan.recovered:  # a run whose publish is in the tables but whose Kafka commit was lost
        report["recovered"] = plan.recovered
    report["spark_jobs"] = spark_jobs_summary(run.raw(Step.SPARK_JOBS) or {})
    return report


@_noted_on_failure("commit")
def commit_step(settings: Settings, run_id: str, *, run: Run | None = None) -> dict:
    """Check the accounting, commit the safe offsets, release the group, publish the report.
    ``run``: the run as this process has it (else it is loaded)."""
    run = run or _require_run(settings, run_id)
    with run.store.step_lock(run.run_id, Step.RUN):
        return _commit(run)


def _new_dead_letters(store: RunStore, plan: RunPlan, published: dict[int, list[list[int]]]):
    """The run's staged dead-letter rows whose origin offset is not in ``published[partition]``
    (``[start, end)`` intervals of origin offsets whose dead letters are on the dead-letter topic
    already: published by an earlier run before a rewind, or before a pending waveform made this
    run re-read them), one row group in memory at a time. So a record is dead-lettered on the
    topic once, however often it is read."""
    import pyarrow.parquet as pq

    for r in plan.ranges:
        _, path = staged_paths(store, plan.run_id, r)
        if storage.exists(path):
            intervals = [(a, b) for a, b in published.get(r.partition, []) if a < r.end and b > r.start]
            for batch in pq.ParquetFile(storage.open_input(path)).iter_batches(batch_size=256):
                yield from batch.filter(_outside(batch.column("offset"), intervals)).to_pylist()
    if plan.recovered:  # the run whose Kafka commit was lost: its dead letters never went out
        yield from dead_letters_of(store.settings.dead_letter_table, plan.recovered["run_id"])


def _outside(offsets, intervals: list[tuple[int, int]]):
    """A boolean mask: which ``offsets`` are in none of the ``[start, end)`` ``intervals``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    inside = pa.array([False] * len(offsets), pa.bool_())
    for a, b in intervals:
        inside = pc.or_(inside, pc.and_(pc.greater_equal(offsets, a), pc.less(offsets, b)))
    return pc.invert(inside)


def _commit(run: Run) -> dict:
    settings, store, plan, run_id = run.settings, run.store, run.plan, run.run_id
    holder = store.active_run(plan.group)
    if holder != run_id:
        return _committed_before(run, holder)
    began = time.monotonic()
    to_read = partitions_to_read(plan)
    recorded = _recorded(run)
    validation = _published_result(plan, recorded, to_read)
    skipped = None if to_read else nothing_to_read(plan)
    report = _report(run, recorded, validation=validation, skipped=skipped)
    if report["balance_errors"]:
        run.record(Step.REPORT, report)
        raise AccountingError(
            f"run {run_id}: the counts do not add up, so no offset was committed: "
            + "; ".join(report["balance_errors"])
            + f". Report: {store.where(run_id, Step.REPORT)}"
        )
    if plan.is_window:  # a backfill: the window's output was replaced; the group's offsets stay
        report["commit"] = {}  # (the report names its window: build_report)
    elif to_read:
        report["commit"] = _commit_offsets(settings, store, plan, report)
    else:  # nothing new was read
        report["commit"] = _commit_idle(settings, store, plan)
    if not plan.is_window:
        _lag_after(settings, plan, report)
    _timed(run, "commit", began)
    return _finish(run, report, skipped)


def _committed_before(run: Run, holder: str | None) -> dict:
    """A commit step of a run that no longer holds its group: its report when it committed
    already (a retry of a commit that went through), else an error (abandoned or superseded)."""
    settings, plan = run.settings, run.plan
    done = run.raw(Step.REPORT)
    if _committed(done):
        written = json_path(settings, plan.run_id).exists()
        return {
            **done,
            "report_path": str(json_path(settings, plan.run_id)) if written else None,
            "report_html": str(html_path(settings, plan.run_id)) if written else None,
        }
    raise ConflictError(
        f"run {plan.run_id} no longer holds group {plan.group!r} (active: {holder or 'none'}); it was "
        "abandoned or superseded, so it must not commit. Start a new run."
    )


def _published_result(plan: RunPlan, recorded: _Recorded, to_read: list[int]) -> Validated | None:
    """The run's validation, once every partition it reads was consumed, reassembled, validated
    and published (None: it read nothing); else an error naming the step to run."""
    run_id = plan.run_id
    for r in plan.ranges:
        if r.partition in to_read and r.partition not in recorded.consumed:
            raise StepFailedError(f"run {run_id}: partition {r.partition} was never consumed; run its consume step")
    if not to_read:
        return None
    if recorded.reassembled is None:
        raise StepFailedError(f"run {run_id}: no reassembly result; run the reassemble step")
    validation = recorded.validated
    if not (validation and validation.success and recorded.published is not None):
        raise StepFailedError(
            f"run {run_id}: its output was not validated and published"
            + (" (validation failed)" if validation else "")
            + "; run the validate step first. "
            "No offset was committed."
        )
    return validation


def _commit_offsets(settings: Settings, store: RunStore, plan: RunPlan, report: dict) -> dict:
    """The safe offsets to the group (if it is still where the plan saw it); where this home continues from."""
    from wavepipe.consumers.committer import OffsetsMovedError, commit_safe_offsets

    safe = {int(p): part["safe_offset"] for p, part in report["partitions"].items()}
    failpoint("commit.before_offsets")
    try:
        committed = commit_safe_offsets(settings, plan, safe, functools.partial(_new_dead_letters, store, plan))
    except OffsetsMovedError:
        store.release_group(plan.group, plan.run_id)  # this run can never commit: free the group
        store.discard_staging(plan.run_id)
        raise
    failpoint("commit.after_offsets")
    store.save_previous_ranges(plan.group, plan.topic, {r.partition: [safe[r.partition], r.end] for r in plan.ranges})
    return {str(p): v for p, v in committed.items()}


def _commit_idle(settings: Settings, store: RunStore, plan: RunPlan) -> dict:
    """A run that read nothing: a new group's offsets are created, a lost commit is made; else the
    group's offsets (and their run metadata) stay as they are."""
    from wavepipe.consumers.committer import commit_safe_offsets

    if plan.new_group_start or plan.recovered:
        starts = {r.partition: r.start for r in plan.ranges}
        dead = functools.partial(_new_dead_letters, store, plan)
        commit = {str(p): v for p, v in commit_safe_offsets(settings, plan, starts, dead).items()}
    else:
        commit = {str(r.partition): {"before": r.start, "after": r.start} for r in plan.ranges}
    if plan.new_group_start or plan.moved or plan.recovered:
        # where this home continues from now: a new group's start, or a move by someone else (said once)
        store.save_previous_ranges(plan.group, plan.topic, {r.partition: [r.start, r.end] for r in plan.ranges})
    return commit


def _finish(run: Run, report: dict, skipped: str | None) -> dict:
    """The committed run's report saved and written (an idle run: a line of the group's history
    instead), its group released, its staged copies removed and the state of runs before the last
    ``RUNS_KEPT`` with it (``RunStore.prune_runs``). The report counts the reads and
    writes of the run's state this process made (``state_io``)."""
    settings, store, plan, run_id = run.settings, run.store, run.plan, run.run_id
    report["timings_s"].update(run.raw(Step.TIMINGS) or {})
    report["status"] = "window_replaced" if plan.is_window else "committed"
    report["state_io"] = run.state_io()
    run.record(Step.REPORT, report)
    quiet = not (plan.is_window or plan.moved or plan.lost or plan.new_group_start or plan.recovered)
    if skipped and quiet:
        # an idle run: one line of history for the group instead of a report (96 a day at the schedule)
        store.record_idle_run(plan.group, run_id)
        report["report_path"] = report["report_html"] = None
    else:
        page = _write_report(settings, report)
        store.forget_idle_runs(plan.group)
        report["report_path"] = str(json_path(settings, run_id))
        report["report_html"] = str(page)
    store.release_group(plan.group, run_id)
    # The staged copies served their purpose: the data is in the tables and still in Kafka.
    store.discard_staging(run_id)
    _compact_after(run, report)
    try:
        store.prune_runs()
    except storage.STORAGE_ERRORS as exc:  # housekeeping: the next committed run tries again
        log.warning("could not remove older runs' state (%s); the next committed run tries again", storage.briefly(exc))
    return report


def _compact_after(run: Run, report: dict) -> None:
    """Housekeeping after the commit: the small files of the tables the run wrote to, compacted
    where a partition holds many (``maintenance.compact_small``) and said on its report. It never
    fails the committed run: busy tables or a failure leave it to the next run."""
    from deltalake.exceptions import DeltaError

    names = maintenance.tables_written(report["outcome"])
    if not (names and run.settings.compact_after_files):
        return
    began = time.monotonic()
    try:
        done = maintenance.compact_small(run.settings, names)
    except StepBusyError:
        log.info("run %s: the tables are busy; the next run compacts their small files", run.run_id)
        return
    except (*storage.STORAGE_ERRORS, DeltaError) as exc:
        log.warning(
            "run %s: its tables' small files were not compacted (%s); the next run tries again",
            run.run_id,
            storage.briefly(exc),
        )
        return
    if done:
        report["compacted"] = done
        report["timings_s"]["compact"] = round(time.monotonic() - began, 3)
        run.record(Step.REPORT, {k: v for k, v in report.items() if k not in ("report_path", "report_html")})
        for d in done:
            log.info(
                "run %s: compacted %s %s: %d small files into %d in %.2fs",
                run.run_id,
                d["table"],
                d["partition"] or "(unpartitioned)",
                d["files_removed"],
                d["files_added"],
                d["seconds"],
            )


#: How long the commit waits for the end offsets that its report's lag is measured against.
LAG_TIMEOUT_S = 5.0


def _lag_after(settings: Settings, plan: RunPlan, report: dict) -> None:
    """Per partition, the records after the committed offset at commit time, and of those the
    ones after the run's planned end (``unplanned``: a cap, or data that came after the plan);
    None if unknown."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import OffsetSpec

    from wavepipe.consumers.kafka_admin import list_offsets

    partitions = [r.partition for r in plan.ranges]
    try:  # only describes the committed run: asked once, briefly (a leader that just died is not waited for)
        latest = list_offsets(
            settings, plan.topic, partitions, OffsetSpec.latest(), timeout_s=LAG_TIMEOUT_S, attempts=1
        )
    except (KafkaException, UnavailableError, TimeoutError) as exc:
        log.warning(
            "run %s: the lag after the commit is unknown: Kafka did not give the end offsets (%s)",
            plan.run_id,
            first_line(exc),
        )
        latest = {}
    ends = {str(r.partition): r.end for r in plan.ranges}
    for p, part in report["partitions"].items():
        after = report["commit"].get(p, {}).get("after")
        part["lag_after"] = latest[int(p)] - after if int(p) in latest and after is not None else None
        part["unplanned"] = max(0, latest[int(p)] - ends[p]) if int(p) in latest and p in ends else None
        part["left_by_cap"] = max(0, plan.latest[int(p)] - ends[p]) if int(p) in plan.latest and p in ends else 0


def left_by_cap(report: dict) -> int:
    """Records the run's plan saw on the topic but a cap left for a later run."""
    return sum(part.get("left_by_cap") or 0 for part in report.get("partitions", {}).values())


def run_once(
    settings: Settings, *, run_id: str | None = None, describe: bool = True, **request: Unpack[RunRequest]
) -> dict:
    """All steps in this process; resumes the group's active run if one was left unfinished.
    ``window=(start, end)``: a backfill of that time window instead (it replaces the window's
    output and commits no offsets). ``describe``: as ``run_steps``.

    Holds the run's lock throughout, so a second process resuming the same run at the same time
    fails at once (``StepBusyError``) instead of running it twice."""
    from wavepipe.consumers.planner import backfill_lane

    request = run_request(request)
    store = RunStore(settings)
    group = request["group"] = request.get("group") or settings.group
    window, known = request.get("window"), None
    if run_id is None:
        active = store.active_run(backfill_lane(group) if window else group)
        active_plan = store.load_plan(active) if active is not None else None
        if active_plan is not None and _same_window(active_plan, window):
            log.info("resuming unfinished run %s of group %s", active, group)
            run_id, known = active, active_plan
        else:
            run_id = new_run_id()
    run_id = safe_run_id(run_id)
    with store.step_lock(run_id, Step.RUN):
        return _run_steps(_planned(settings, run_id, known=known, **request), describe=describe)


def run_steps(settings: Settings, plan: RunPlan, *, describe: bool = True) -> dict:
    """The steps of planned run ``plan`` after its plan, in this process (``run_once``; an Airflow
    run in one task), resumed at the first one without a result: partitions an earlier attempt
    staged are not read again, a run whose validation failed is validated again (after a
    threshold was relaxed) without reassembling, a published one only commits. What only
    describes the run is made after its commit (``describe_step``), or, without ``describe``, left
    waiting in this process for the caller's ``describe_step`` (``follow`` makes several at once).
    Returns the commit's report. The run is one value through its steps: its plan is not read
    again."""
    return _run_steps(Run(RunStore(settings), plan), describe=describe)


def _run_steps(run: Run, *, describe: bool) -> dict:
    settings, plan = run.settings, run.plan
    with run.store.step_lock(plan.run_id, Step.RUN):
        try:
            report = _steps_to_commit(run)
        except BUGS:
            _forget_description(plan.run_id)
            raise
        except Exception:
            _forget_description(plan.run_id)  # the run did not commit: its retry describes its own publish
            report = _committed_meanwhile(run)
            if report is None:
                raise
            return report
        except BaseException:
            _forget_description(plan.run_id)
            raise
    return describe_step(settings, [report])[0] if describe else report


def _steps_to_commit(run: Run) -> dict:
    """The run's steps from its first without a result up to its commit's report."""
    settings, plan = run.settings, run.plan
    staged = [p for p in partitions_to_read(plan) if _is_staged(run, p)]
    if staged:
        log.info("run %s: partitions %s were staged by an earlier attempt; not read again", plan.run_id, staged)
    with _engine_ready(settings, needed=bool(partitions_to_read(plan))):
        consume_run(run, [p for p in partitions_to_read(plan) if p not in staged])
    validated = run.result(Step.VALIDATE, Validated)
    if run.result(Step.REASSEMBLE, Reassembled) is None:
        reassemble_step(settings, plan.run_id, validate=True, defer_description=True, run=run)
    elif not (validated and validated.success and run.result(Step.PUBLISH, Published) is not None):
        validate_step(settings, plan.run_id, defer_description=True, run=run)
    return commit_step(settings, plan.run_id, run=run)


def _committed_meanwhile(run: Run) -> dict | None:
    """The run's report when another worker committed it while this process ran its steps (on an
    object store, after this one stalled past its lease): this process's step then failed on what
    that commit removed (its staged files, its claim), and there is nothing left to do. None when
    the run is not committed, or the state cannot say."""
    run.forget(Step.REPORT)
    try:
        done = run.raw(Step.REPORT)
    except (WavepipeError, OSError):  # the state did not answer: the step's own failure stands
        return None
    if not _committed(done):
        return None
    log.warning("run %s was committed by another worker while this one ran: nothing is left to do", run.run_id)
    return {**_committed_before(run, None), "committed_by_other": True}


def describe_step(settings: Settings, reports: list[dict]) -> list[dict]:
    """What only describes each committed run of ``reports`` (its plot, flagged plot and Data
    Docs: ``spark_apps.describe``), made at once for the runs whose description waits in this
    process, saved with its validation record and on its report and page; the reports as they
    are now. It never fails a run: each failure is a note on its page."""
    from wavepipe.spark_apps import describe

    waiting = [d for d in (describe.take(r["run_id"]) for r in reports) if d is not None]
    began = time.monotonic()
    described = {v.run_id: v for v in describe.make(waiting)}
    seconds = round(time.monotonic() - began, 3)
    store = RunStore(settings)
    out = []
    for report in reports:
        validated = described.get(report["run_id"])
        if validated is not None:
            store.save_result(validated.run_id, Step.VALIDATE, validated)
            pages = {k: report.get(k) for k in ("report_path", "report_html")}  # where it is, not what it says
            record = {k: v for k, v in with_description(report, validated).items() if k not in pages}
            record["timings_s"]["describe"] = seconds
            store.save_step(validated.run_id, Step.REPORT, record)
            if pages["report_html"]:
                _write_report(settings, record)
            report = {**record, **pages}
        out.append(report)
    return out


def _forget_description(run_id: str) -> None:
    from wavepipe.spark_apps import describe

    describe.take(run_id)


@contextlib.contextmanager
def _engine_ready(settings: Settings, *, needed: bool):
    """While the run reads: a remote Spark engine is checked first (an unreachable one fails the
    run before anything is read), this home's local one is started alongside the readers."""
    if not needed or settings.spark_engine != "connect":
        yield
        return

    if settings.spark_remote:
        engine_client.require_reachable(settings)
        yield
        return
    engine = engine_client.own_engine(settings)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            engine.ensure_up()
        except BaseException as exc:
            errors.append(exc)

    starter = threading.Thread(target=start, name="spark-engine-start", daemon=True)
    starter.start()
    yield  # a failed read is reported at once, not after the engine's start (the thread is a daemon)
    starter.join()
    if errors:  # the run's staged chunks are kept: a retry after the fix goes on from them
        raise errors[0]


def _same_window(plan: RunPlan, window: tuple[datetime, datetime] | None) -> bool:
    """Whether ``plan`` is the run of ``window`` (both None: incremental). Another window's
    unfinished run is not resumed: the new run's claim is refused, naming it."""
    if window is None or plan.window is None:
        return window is None and plan.window is None
    return [datetime.fromisoformat(plan.window[k]) for k in ("start", "end")] == [as_utc(t) for t in window]


def _is_staged(run: Run, partition: int) -> bool:
    """The partition's range was read completely by an earlier attempt (its result is recorded
    only after its staged files are in place, and they stay until the run commits)."""
    r = run.plan.range_for(partition)
    chunks, dead = staged_paths(run.store, run.run_id, r)
    read = run.result(Step.consume(r), ReadStats)
    return read is not None and storage.exists(chunks) and storage.exists(dead)


def committed_by(settings: Settings, plan: RunPlan) -> bool:
    """Whether the group's committed offsets carry ``plan``'s run id (its commit went through)."""
    from wavepipe.consumers.committer import committed_run_id
    from wavepipe.consumers.kafka_admin import committed_positions

    positions = committed_positions(settings, plan.group, plan.topic, [r.partition for r in plan.ranges])
    return any(committed_run_id(meta) == plan.run_id for _, meta in positions.values())


def abandon_run(settings: Settings, group: str) -> str:
    """Release ``group``'s unfinished run without committing it and delete its staged files (the
    records are still in Kafka: the next run reads them again); what was done, in a line.
    Refused (``UsageError``) while the run executes, or once its offsets are committed."""
    store = RunStore(settings)
    active = store.active_run(group)
    if active is None:
        return f"group {group!r} has no active run"
    if store.is_locked(active, Step.RUN):
        raise UsageError(f"run {active} of group {group!r} is executing right now; stop it first")
    plan = store.load_plan(active)
    if plan is not None and committed_by(settings, plan):
        raise UsageError(
            f"run {active} already committed its offsets; finish it with `wavepipe run` (it resumes the run and "
            "only writes its report)"
        )
    store.release_group(group, active)
    store.discard_staging(active)
    return (
        f"released run {active} of group {group!r} and deleted its staged files; its offsets were not committed, "
        "the next run re-reads them"
    )


#: A DAG run that reprocesses a window again works as ``<its run id>.reprocess-<n>``.
REPROCESS = ".reprocess-"


def _attempts(store: RunStore, run_id: str) -> list[str]:
    """``run_id`` and its reprocessings that have a plan, oldest first."""
    ids = [run_id]
    while store.has_plan(f"{run_id}{REPROCESS}{len(ids)}"):
        ids.append(f"{run_id}{REPROCESS}{len(ids)}")
    return ids


def current_run_id(settings: Settings, run_id: str) -> str:
    """The wavepipe run that DAG run ``run_id``'s steps work on: its own, or its latest
    reprocessing (``window_run_id``)."""
    return _attempts(RunStore(settings), safe_run_id(run_id))[-1]


def _committed(report: dict | None) -> bool:
    """Whether a run's report step record says its commit went through (its run is finished)."""
    return report is not None and "commit" in report


def window_run_id(settings: Settings, run_id: str, window: tuple[datetime, datetime]) -> str:
    """The wavepipe run in which DAG run ``run_id`` reprocesses ``window`` (it only reads).

    Its own id the first time, and on retries while that window's run is unfinished. Airflow
    reuses a DAG run when a backfill reprocesses its logical date again ("All Runs", "Missing and
    Errored Runs"), or when a run is cleared: a run that was incremental, of another window, or
    already finished gets a new ``<run_id>.reprocess-<n>``, so every earlier run keeps its plan
    and report as they were."""
    store = RunStore(settings)
    ids = _attempts(store, safe_run_id(run_id))
    plan = store.load_plan(ids[-1])
    if plan is None or (_same_window(plan, window) and not _committed(store.load_step(plan.run_id, Step.REPORT))):
        return ids[-1]
    return f"{ids[0]}{REPROCESS}{len(ids)}"


def _give_up_replaced(settings: Settings, run_id: str) -> None:
    """When DAG run ``run_id`` was an incremental run that never finished and is now run again
    for a window: abandon that run (its offsets were not committed, so the next incremental run
    reads them), or say why it stays."""
    store = RunStore(settings)
    plan = store.load_plan(current_run_id(settings, run_id))
    if plan is None or plan.window is not None or store.active_run(plan.group) != plan.run_id:
        return
    try:
        log.warning("incremental run %s is reprocessed as a window: %s", plan.run_id, abandon_run(settings, plan.group))
    except UsageError as exc:
        log.warning("incremental run %s stays unfinished: %s", plan.run_id, exc)


def _require_plan(store: RunStore, run_id: str) -> RunPlan:
    plan = store.load_plan(run_id)
    if plan is None:
        raise StepFailedError(f"run {run_id} has no plan under {store.runs_location}; run the plan step first")
    return plan


def _require_run(settings: Settings, run_id: str) -> Run:
    run = Run.load(settings, run_id)
    if run is None:
        raise StepFailedError(
            f"run {run_id} has no plan under {RunStore(settings).runs_location}; run the plan step first"
        )
    return run
