"""A run's steps on the Spark engine, in their order: reassemble -> validate -> publish.

Each step is a module of its own (``reassemble``, ``validate``, ``publish``, ``describe``); this
one passes each step's result to the next in memory and saves each result where an Airflow task
boundary needs it (the run's ``reassemble`` and ``validate`` steps). What only describes the run
never fails it and never delays it: the plot, the flagged plot and Data Docs are made after the
publish, or after the commit when the run's steps share a process (``describe``).

``main()`` is the same for spark-submit: ``--step reassemble [--validate]`` or ``--step validate``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
from pyspark.sql import SparkSession

from wavepipe import plots
from wavepipe.contracts.errors import CandidatesMismatchError
from wavepipe.contracts.report import append_validation_history, describe_safely
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import Published, Reassembled, Validated
from wavepipe.run_store import Run
from wavepipe.spark_apps import describe, publish, reassemble, validate
from wavepipe.spark_apps.app import load_run, output_lock
from wavepipe.spark_launch import phase

log = logging.getLogger("wavepipe.engine_run")
T = TypeVar("T")


def reassemble_and_save(
    spark: SparkSession, run: Run, *, validate: bool, session_s: float, defer: bool = False
) -> Reassembled:
    """Reassemble ``run`` and record the result as its ``reassemble`` step; ``validate``: then
    validate and publish in the same session (``defer``: its description left for the commit).
    ``session_s``: what getting the session took."""
    began = time.monotonic()
    with phase("reassemble"):
        result, manifest = reassemble.reassemble_run(spark, run)
    result.timings["spark_app_s"] = round(time.monotonic() - began, 3)
    result.timings["session_start_s"] = round(session_s, 3)
    run.record(Step.REASSEMBLE, result)
    log.info("run %s reassembled: %s", run.run_id, result.waveforms)
    if validate:
        validate_and_publish(spark, run, result, manifest, defer=defer)
    return result


def validate_and_publish(
    spark: SparkSession,
    run: Run,
    reassembled: Reassembled | None = None,
    manifest: pa.Table | None = None,
    *,
    defer: bool = False,
) -> Validated:
    """Validate ``run``'s candidates and publish them if every run-level expectation holds
    (the waveforms a per-waveform expectation rejects are quarantined instead). ``reassembled``,
    ``manifest``: the reassembly's result and manifest when it ran in this process (else read).
    The outcome is saved as the run's ``validate`` step, and a line of the validation history,
    either way. What only describes the run (``describe``) is made after the publish, or with
    ``defer`` left for this process's commit to make after it (``describe.defer``)."""
    settings, store, plan = run.settings, run.store, run.plan
    run.clear(Step.VALIDATE, Step.PUBLISH)
    notes: list[str] = []  # what could not be described; never a reason to fail the run
    with phase("validate"):
        reassembled = validate.check_candidates(spark, run, reassembled)
        verdict = validate.validate(settings, store, plan, reassembled, notes, manifest)
    result = verdict.result
    # the plot's waveforms, read from the staged files beside the publish (drawn later)
    fetching = beside(lambda: plots.read_picks(verdict.to_publish.waveforms, store, plan, notes), "wavepipe-plot")
    published = _publish(spark, run, reassembled, verdict, fetching, notes) if result.success else None
    if published is None:  # nothing published: the page still names what the run would have set aside
        result.named = describe_safely(
            notes, "naming the quarantined waveforms", publish.named_in_run, store, plan, verdict.to_publish.rejection
        )
    result.timings, result.notes = {k: round(v, 3) for k, v in result.timings.items()}, notes
    describe_safely(notes, "the validation history", append_validation_history, settings, result, published)
    description = describe.Description(settings, result, published, fetching()[0], verdict.docs, notes)
    if defer and published is not None:
        describe.defer(description)
    else:
        describe.make([description])
    run.record(Step.VALIDATE, result)
    validate.log_outcome(run.plan, result)
    return result


def _publish(spark, run: Run, reassembled: Reassembled, verdict, fetching, notes) -> Published:
    """Publish ``verdict``'s waveforms and record the run's ``publish`` step: the tables'
    versions, what a quality rule held back, the published waveforms' quality summary (the
    commit's asset event carries it). ``fetching``: the plot's read of the staged files, waited
    for before a changed staged file makes the publish remove them."""
    t = time.monotonic()
    with phase("publish"):
        done = publish.publish(spark, run, reassembled, verdict.to_publish, fetching)
    done.timings["total_s"] = time.monotonic() - t
    if not verdict.to_publish.all_there and len(verdict.to_publish.waveforms):
        t = time.monotonic()
        done.quality = describe_safely(
            notes, "the quality summary", publish.quality_summary, run.settings, done.output_table_version
        )
        done.timings["quality_summary_s"] = time.monotonic() - t
        if done.quality is not None:
            done.quality["qc_hours"] = done.qc_hours
    done.timings = {k: round(v, 3) for k, v in done.timings.items()}
    run.record(Step.PUBLISH, done)
    return done


def beside(work: Callable[[], T], name: str) -> Callable[[], tuple[T, float]]:
    """Start ``work`` in a thread named ``name``; returns a function that waits for it and gives
    its result and how long it took, or raises what it raised (``work`` that only describes the
    run turns what it expects to fail into notes itself: what is left is a defect to see)."""
    done: dict = {}

    def run() -> None:
        began = time.monotonic()
        try:
            done["result"] = work()
        except BaseException as exc:  # handed to the waiting thread, which raises it
            done["error"] = exc
        done["s"] = time.monotonic() - began

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def wait() -> tuple[T, float]:
        thread.join()
        if "error" in done:
            raise done["error"]
        return done["result"], done["s"]

    return wait


def import_in_background() -> None:
    """Start importing Great Expectations (about 3 s) while the Spark session starts, instead of after."""
    threading.Thread(target=importlib.import_module, args=("great_expectations",), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One wavepipe run's steps on Spark (spark-submit).")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--step", choices=["reassemble", "validate"], required=True)
    parser.add_argument(
        "--validate",
        action="store_true",
        help="reassemble, then validate and publish in the same Spark session (what `wavepipe run` does)",
    )
    args = parser.parse_args(argv)
    run = load_run(args.run_id, log)
    if run is None:
        return 2
    settings, store, plan = run.settings, run.store, run.plan
    with output_lock(settings, store):
        began = time.monotonic()
        if args.validate or args.step == "validate":
            import_in_background()
        spark = SparkSession.builder.appName(f"wavepipe-{args.step}-{plan.run_id}").getOrCreate()
        try:
            if args.step == "reassemble":
                session_s = time.monotonic() - began
                result = reassemble_and_save(spark, run, validate=args.validate, session_s=session_s)
            else:
                validated = validate_and_publish(spark, run)
        except CandidatesMismatchError as exc:
            log.error("%s", exc)
            return 4
        finally:
            began = time.monotonic()
            spark.stop()
        if args.step == "reassemble":
            result.timings["session_stop_s"] = round(time.monotonic() - began, 3)
            run.record(Step.REASSEMBLE, result)
        else:
            published = run.result(Step.PUBLISH, Published) is not None
            print(json.dumps({"success": validated.success, "published": published}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
