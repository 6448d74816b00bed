"""The systems under test. Each reads exactly the given offset ranges and returns its timings;
the runner wraps each call in a ``Monitor`` and checks its output against the producer's manifest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from wavepipe import spark_launch
from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import new_run_id
from wavepipe.jars import installed_pyspark, resolve_jars, spark_jars
from wavepipe.run_store import Run, RunStore

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
SPARK_KAFKA_ARTIFACTS = "spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"

Ranges = dict[int, tuple[int, int]]


@dataclass
class Outcome:
    """What one system did: wall time, stage timings, and where its output is (if any)."""

    wall_s: float
    stages: dict[str, float] = field(default_factory=dict)
    output: Path | None = None
    info: dict = field(default_factory=dict)


def _client(*args: str) -> list[str]:
    return [sys.executable, "-m", "wavepipe.bench.clients", *args]


def _run_parallel(commands: list[list[str]], parallelism: int, outputs: list[Path] | None = None) -> list[str]:
    """Run commands, ``parallelism`` at a time; return each one's stdout, or write it to the
    matching file of ``outputs`` (fsynced). Raise on the first failure, stopping the others."""
    queue = list(zip(commands, outputs or [None] * len(commands), strict=True))
    running, results = [], []
    while queue or running:
        while queue and len(running) < parallelism:
            cmd, out = queue.pop(0)
            sink = open(out, "wb") if out else None  # noqa: SIM115 (closed when the process ends, below)
            running.append((cmd, sink, subprocess.Popen(cmd, stdout=sink or subprocess.PIPE)))
        time.sleep(0.02)
        for item in list(running):
            cmd, sink, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if sink:
                sink.flush()
                os.fsync(sink.fileno())
                sink.close()
            if proc.returncode != 0:
                for _, _, other in running:
                    other.kill()
                raise RuntimeError(f"{' '.join(cmd[:6])} ... failed with exit code {proc.returncode}")
            results.append("" if sink else proc.stdout.read().decode())
    return results


def _json_lines(outputs: list[str]) -> list[dict]:
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def ceiling_confluent(settings: Settings, topic: str, ranges: Ranges, workdir: Path, parallelism: int) -> Outcome:
    """A minimal confluent-kafka loop per partition, values appended to one file each."""
    workdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    commands = [
        _client(
            "ceiling",
            "--bootstrap",
            settings.bootstrap_servers,
            "--topic",
            topic,
            "--partition",
            str(p),
            "--start",
            str(s),
            "--end",
            str(e),
            "--out",
            str(workdir / f"p{p}.bin"),
        )
        for p, (s, e) in sorted(ranges.items())
        if e > s
    ]
    results = _json_lines(_run_parallel(commands, parallelism))
    wall = time.monotonic() - began
    return Outcome(
        wall, info={"records": sum(r["records"] for r in results), "bytes": sum(r["bytes"] for r in results)}
    )


def ceiling_kcat(settings: Settings, topic: str, ranges: Ranges, workdir: Path, parallelism: int) -> Outcome:
    """kcat (librdkafka's C client) per partition, values written raw to one file each."""
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        raise FileNotFoundError("kcat is not installed (apt-get install kcat)")
    workdir.mkdir(parents=True, exist_ok=True)
    todo = [(p, s, e) for p, (s, e) in sorted(ranges.items()) if e > s]
    commands = [
        [
            kcat,
            "-C",
            "-q",
            "-b",
            settings.bootstrap_servers,
            "-t",
            topic,
            "-p",
            str(p),
            "-o",
            str(s),
            "-c",
            str(e - s),
            "-e",
            "-f",
            "%s",
            "-X",
            "fetch.max.bytes=67108864",
            "-X",
            "max.partition.fetch.bytes=16777216",
            "-X",
            "queued.max.messages.kbytes=131072",
        ]
        for p, s, e in todo
    ]
    began = time.monotonic()
    _run_parallel(commands, parallelism, [workdir / f"p{p}.bin" for p, _, _ in todo])
    wall = time.monotonic() - began
    nbytes = sum(f.stat().st_size for f in workdir.glob("p*.bin"))
    return Outcome(wall, info={"bytes": nbytes})


def wavepipe_run(
    settings: Settings,
    topic: str,
    ranges: Ranges,
    workdir: Path,
    parallelism: int,
    group: str | None = None,
    small_reads_in_process: bool = False,
) -> Outcome:
    """wavepipe end to end, the steps ``wavepipe run`` takes: plan, consume, reassemble with validation and
    publishing in the same Spark app, commit, then what describes the run (plots, Data Docs). ``group``: continue that group (default: a new group per
    call, reading the ranges from the start). Readers are processes (the monitor's ``consumer`` role),
    also for the quick bench's small backlogs; ``small_reads_in_process``: as ``wavepipe run`` reads
    a small plan by default, in threads of its own process (``consume_in_process_max_records``)."""
    from wavepipe.pipeline import (
        commit_step,
        consume_run,
        describe_step,
        partitions_to_read,
        plan_step,
        reassemble_step,
    )

    group = group or f"bench-{uuid.uuid4().hex[:10]}"
    s = settings.replace(
        home=workdir / "home",
        topic=topic,
        group=group,
        max_records_per_partition=0,
        max_bytes_per_partition=0,
        consume_parallelism=parallelism,
        consume_in_process_max_records=settings.consume_in_process_max_records if small_reads_in_process else 0,
    )
    if s.spark_engine == "connect" and not s.spark_remote:  # the bench home's engine, warm, not one per workdir
        from wavepipe.local.engine_server import LocalEngine

        engine = LocalEngine(settings)
        s = s.replace(spark_remote=engine.ensure_up(), spark_ui=engine.ui_url() or "")
    stages: dict[str, float] = {}
    began = t = time.monotonic()
    plan = plan_step(s, new_run_id(), topic=topic, group=group, new_group_start="earliest")
    planned = {r.partition: (r.start, r.end) for r in plan.ranges}
    if planned != {p: tuple(r) for p, r in ranges.items()}:
        raise RuntimeError(
            f"wavepipe planned {planned}, the benchmark expected {ranges}: did something else write to topic {topic}?"
        )
    stages["plan"], t = time.monotonic() - t, time.monotonic()
    run = Run(RunStore(s), plan)  # one value through the steps, as run_steps passes it
    consume_run(run, partitions_to_read(plan))
    stages["consume"], t = time.monotonic() - t, time.monotonic()
    result = reassemble_step(s, plan.run_id, validate=True, defer_description=True, run=run)
    stages["reassemble + validate"], t = time.monotonic() - t, time.monotonic()
    report = commit_step(s, plan.run_id, run=run)
    stages["commit"], t = time.monotonic() - t, time.monotonic()
    (report,) = describe_step(s, [report])
    stages[DESCRIBE_STAGE] = time.monotonic() - t
    wall = time.monotonic() - began
    inner = result.timings if result else {}
    checked = {k: v for k, v in report.get("timings_s", {}).items() if k.startswith(("validate_", "publish_"))}
    if "spark_app_s" in inner:
        # the plots and Data Docs are made after the commit: in the describe stage, not this one
        known = sum(inner.get(k, 0.0) for k in ("spark_app_s", "session_start_s", "session_stop_s")) + sum(
            v for k, v in checked.items() if k not in (*DESCRIBED, *WITHIN)
        )
        on_engine = s.spark_engine == "connect"
        # spark-submit: the rest of the app's wall is the JVM's and Python's start and exit; attached
        # to the engine: the step's own bookkeeping (locks, reading the plan, saving results)
        stages[
            "reassemble: outside the measured stages" if on_engine else "reassemble: JVM and Python start and exit"
        ] = stages["reassemble + validate"] - known
        for key, label in (
            (
                "session_start_s",
                "reassemble: attach to the Spark engine" if on_engine else "reassemble: Spark session start",
            ),
            ("classify_s", "reassemble: classify (metadata only)"),
            (
                "assemble_verify_s",
                "reassemble: verify the waveforms read out of order (no payload kept), write the manifest",
            ),
            ("accounting_s", "reassemble: final status and accounting"),
            ("session_stop_s", "reassemble: Spark session stop"),
        ):
            if key in inner:
                stages[label] = inner[key]
        for key, label in (
            ("validate_prepare_s", "validate: checked columns (from the manifest, no payload)"),
            ("validate_expectations_s", "validate: Great Expectations suites"),
            ("validate_data_docs_s", "describe: Data Docs"),
            ("validate_plot_s", "describe: waveform plot (its waveforms read beside publishing)"),
            ("publish_total_s", PUBLISH_STAGE),
            ("publish_qc_table_s", "quality: the qc table's hours (read back, merged; within publishing)"),
            ("publish_quality_summary_s", "quality: summary of the published rows (read back from the run's files)"),
            ("validate_flagged_plot_s", "describe: plot of the flagged waveforms"),
        ):
            if key in checked:
                stages[label] = checked[key]
    return Outcome(
        wall,
        stages,
        s.output_table,
        info={
            "waveforms": report["waveforms"],
            "balance_errors": report["balance_errors"],
            "spark_jobs": (report.get("spark_jobs") or {}).get("count"),
            # reads of the run's plan by the process that ran it (its report's ``state_io``)
            "plan_reads": (report.get("state_io") or {}).get("plan_reads"),
        },
    )


def wavepipe_s3(settings: Settings, topic: str, ranges: Ranges, workdir: Path, parallelism: int) -> Outcome:
    """``wavepipe_run`` with the output tables, the staging and the run state in the object store
    ``settings`` reach (``s3_endpoint``; the bench starts this home's local store), under a prefix
    of its own (``info["s3_prefix"]``, which the runner deletes after its check)."""
    prefix = f"s3://wavepipe/bench/{workdir.parent.name}-{workdir.name}-{uuid.uuid4().hex[:8]}"
    on_s3 = settings.replace(
        tables_uri=f"{prefix}/tables", staging_uri=f"{prefix}/staging", state_uri=f"{prefix}/state"
    )
    outcome = wavepipe_run(on_s3, topic, ranges, workdir, parallelism)
    outcome.info["s3_prefix"] = prefix
    return outcome


def wavepipe_no_qc(settings: Settings, topic: str, ranges: Ranges, workdir: Path, parallelism: int) -> Outcome:
    """``wavepipe_run`` without the quality metrics (``quality_metrics`` off): beside ``wavepipe``
    on the same ranges, what measuring every waveform's quality costs."""
    return wavepipe_run(settings.replace(quality_metrics=False), topic, ranges, workdir, parallelism)


#: The run's one write of its waveforms' bytes (not part of the validation gate's cost).
PUBLISH_STAGE = "publish: assemble from the staged chunks, write the output once"
#: The stage of what describes a run (its plots, its Data Docs), made after its commit.
DESCRIBE_STAGE = "describe: plots and Data Docs, after the commit"
#: The report's timings of what describes a run, made after its commit (its describe stage).
DESCRIBED = ("validate_plot_s", "validate_data_docs_s", "validate_flagged_plot_s")
#: Timers of work inside another timer (the ``qc`` table's update is within the publish's total).
WITHIN = ("publish_qc_table_s",)


def python_consumer(settings: Settings, topic: str, ranges: Ranges, workdir: Path, parallelism: int) -> Outcome:
    """The hand-written alternative: one Python process, reassembly in memory, Parquet out."""
    out = workdir / "output"
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    [result] = _json_lines(
        _run_parallel(
            [_client("pyconsumer", *_ranges_args(settings, topic, ranges, out / "part-0.parquet"))],
            1,
        )
    )
    return Outcome(time.monotonic() - began, output=out, info=result)


def _ranges_args(settings: Settings, topic: str, ranges: Ranges, out: Path) -> list[str]:
    """The command line of a program that reads ``ranges`` of ``topic`` into ``out``."""
    ranges_json = json.dumps({str(p): list(r) for p, r in ranges.items()})
    return ["--bootstrap", settings.bootstrap_servers, "--topic", topic, "--ranges", ranges_json, "--out", str(out)]


def spark_kafka_source(settings: Settings, topic: str, ranges: Ranges, workdir: Path, parallelism: int) -> Outcome:
    """Spark's own Kafka batch source with a group-by reassembly, through spark-submit."""
    kafka_jars = sorted(resolve_spark_kafka_jars(settings).glob("*.jar"))
    jars = ",".join(str(j) for j in [*spark_jars(settings.jars_dir), *kafka_jars])
    s = settings.replace(spark_conf={**settings.spark_conf, "spark.jars": jars})
    workdir.mkdir(parents=True, exist_ok=True)
    out, result_file = workdir / "output", workdir / "result.json"
    began = time.monotonic()
    spark_launch.submit(
        s,
        HERE / "spark_kafka_app.py",
        *_ranges_args(settings, topic, ranges, out),
        "--result",
        str(result_file),
    )
    wall = time.monotonic() - began
    info = json.loads(result_file.read_text())
    stages = {"spark-submit start and stop": wall - info["spark_app_s"], "read, reassemble, write": info["spark_app_s"]}
    return Outcome(wall, stages, out, info)


def resolve_spark_kafka_jars(settings: Settings) -> Path:

    spark = {"spark.version": installed_pyspark()}
    pom = HERE / "spark-kafka-pom.xml"
    return resolve_jars(pom, settings.jars_dir, include_artifact_ids=SPARK_KAFKA_ARTIFACTS, properties=spark)


SYSTEMS = {
    "ceiling_kcat": ceiling_kcat,
    "ceiling_confluent": ceiling_confluent,
    "wavepipe": wavepipe_run,
    # right after wavepipe, as alike as two runs get: the first run of a workload is the slowest
    # (about 1 s of 9 on large, measured in either order), so neither is first
    "wavepipe_no_qc": wavepipe_no_qc,
    "wavepipe_s3": wavepipe_s3,
    "python_consumer": python_consumer,
    "spark_kafka_source": spark_kafka_source,
}
LABELS = {
    "ceiling_kcat": "ceiling: kcat",
    "ceiling_confluent": "ceiling: confluent-kafka loop",
    "wavepipe": "wavepipe (end to end)",
    "wavepipe_no_qc": "wavepipe without quality metrics",
    "wavepipe_s3": "wavepipe, tables, staging and run state on S3 (local)",
    "python_consumer": "hand-written Python consumer",
    "spark_kafka_source": "Spark Kafka source + group-by",
}
#: The systems that run on wavepipe's Spark engine (its processes are theirs while they run).
ON_ENGINE = ("wavepipe", "wavepipe_s3", "wavepipe_no_qc")
