"""One benchmark invocation: backlog per workload, every system on the same ranges, results."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import random
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import psutil

from wavepipe import storage
from wavepipe.bench import lifecycle
from wavepipe.bench.measured_at import checkout_commit
from wavepipe.bench.monitor import Monitor
from wavepipe.bench.results import chart, default_results_dir, markdown
from wavepipe.bench.systems import LABELS, ON_ENGINE, SYSTEMS, Ranges, resolve_spark_kafka_jars, wavepipe_run
from wavepipe.bench.workloads import KiB, MiB, SignalPool, Workload, default_workloads, produce_backlog
from wavepipe.contracts.config import Settings, source_checkout
from wavepipe.engine_client import attached
from wavepipe.jars import RESOURCES, delta_build, installed_pyspark
from wavepipe.local.engine_server import LocalEngine
from wavepipe.local.kafka import LocalKafka
from wavepipe.local.objectstore import LocalObjectStore

log = logging.getLogger("wavepipe.bench")
CEILINGS = ("ceiling_kcat", "ceiling_confluent")


@dataclass
class BenchOptions:
    large_bytes: int = 1024 * MiB
    small_bytes: int = 1024 * MiB
    scale: int = 4
    partitions: int = 4
    parallelism: int = 2
    systems: tuple[str, ...] = tuple(SYSTEMS)
    #: the systems also run at ``scale`` times the backlog (the object store's and the run without
    #: quality metrics: at 1x only)
    scale_systems: tuple[str, ...] = tuple(s for s in SYSTEMS if s not in ("wavepipe_s3", "wavepipe_no_qc"))
    out_dir: Path = field(default_factory=default_results_dir)
    keep: bool = False
    quick: bool = False
    warm_runs: int = 5
    #: throw-away small runs right after the engine's cold start, before anything is measured:
    #: a long-lived engine is past its JIT's warm-up, and the first workload should not pay it
    warmup_runs: int = 3
    #: more measurements of wavepipe and the run without quality metrics at 1x, alternated (the
    #: quality goal compares medians: its 10% is less than one run's noise here)
    quality_repeats: int = 2
    command: str = "wavepipe bench"

    @classmethod
    def quick_options(cls, **changes) -> BenchOptions:
        """Small sizes for a smoke test: every system once, the scaling pass for wavepipe, the
        read ceiling and the hand-written consumer (what the scaling goals compare), two warm runs."""
        return cls(
            **{
                "large_bytes": 8 * MiB,
                "small_bytes": 2 * MiB,
                "scale": 2,
                "scale_systems": ("ceiling_confluent", "wavepipe", "python_consumer"),
                "warm_runs": 2,
                "warmup_runs": 1,
                "quality_repeats": 1,
                "quick": True,
                **changes,
            }
        )


@dataclass
class Measurement:
    system: str
    workload: str
    scale: int
    waveforms: int
    chunks: int
    payload_bytes: int
    wall_s: float | None = None
    mb_s: float | None = None
    chunks_s: float | None = None
    of_ceiling: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    memory: dict[str, dict] = field(default_factory=dict)
    check: str = ""
    error: str | None = None
    info: dict = field(default_factory=dict)
    #: 0, or the measurement's number among the repeats of the quality metrics' pair
    #: (``BenchOptions.quality_repeats``)
    repeat: int = 0


def run_bench(settings: Settings, options: BenchOptions) -> dict:
    from wavepipe.consumers.kafka_admin import ensure_topic

    began = time.monotonic()  # "in all": the engine's cold start and warm-up included
    # in SYSTEMS' order whatever the order asked: the ceilings first, then wavepipe and the run
    # without quality metrics side by side (the first system of a workload runs slowest)
    systems = [s for s in SYSTEMS if s in options.systems and (s != "ceiling_kcat" or shutil.which("kcat"))]
    skipped = sorted(set(options.systems) - set(systems))
    if skipped:
        log.warning("skipping %s: kcat is not installed (apt-get install kcat)", ", ".join(skipped))
    broker = LocalKafka.from_settings(settings)
    log.info("%s", lifecycle.start("the Kafka broker", broker))
    if "wavepipe_s3" in systems:
        settings = with_object_store(settings)
    if settings.spark_engine == "connect" and not settings.spark_remote:
        lifecycle.as_found("the Spark engine", LocalEngine(settings))  # runs start it on demand
    # the engine's cold start on its own; it is warm for every measurement after it
    engine_start = measure_engine_start(settings) if "wavepipe" in systems else None
    if "spark_kafka_source" in systems:
        resolve_spark_kafka_jars(settings)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    work = settings.home / "bench" / stamp
    warmup = []
    if "wavepipe" in systems and options.warmup_runs:
        log.info("warming the engine up: %d throw-away small run(s), not measured", options.warmup_runs)
        warmup = [
            {"repeat": m.info.get("repeat"), "wall_s": m.wall_s, "check": m.check, "error": m.error}
            for m in warm_small_runs(
                settings, options, stamp, work / "warmup", broker.pid(), options.warmup_runs, name="warmup"
            )
        ]
    pool = SignalPool()
    measurements: list[Measurement] = []
    for workload in default_workloads(options.large_bytes, options.small_bytes):
        topic = f"bench-{workload.name}-{stamp}"
        ensure_topic(settings, topic, options.partitions)
        manifest: dict[str, str] = {}
        produced = 0
        try:
            for scale in sorted({1, options.scale}):
                target = workload.scaled(scale)
                log.info("workload %s (x%d)", target.describe(), scale)
                manifest.update(
                    produce_backlog(
                        settings, topic, workload, first_index=produced, count=target.waveforms - produced, pool=pool
                    )
                )
                produced = target.waveforms
                ranges = _ranges(settings, topic, options.partitions)
                wanted = systems if scale == 1 else [s for s in systems if s in options.scale_systems]
                for system in wanted:
                    m = _measure(
                        settings,
                        system,
                        workload,
                        target,
                        scale,
                        topic,
                        ranges,
                        manifest,
                        work / f"{workload.name}-x{scale}" / system,
                        broker.pid(),
                        options,
                    )
                    measurements.append(m)
                if scale == 1 and {"wavepipe", "wavepipe_no_qc"} <= set(systems):
                    for repeat, system in _quality_pairs(options.quality_repeats):
                        where = work / f"{workload.name}-x1" / f"{system}-repeat-{repeat}"
                        m = _measure(
                            settings, system, workload, target, 1, topic, ranges, manifest, where, broker.pid(), options
                        )
                        measurements.append(replace(m, repeat=repeat))
                _ratios([m for m in measurements if m.workload == workload.name and m.scale == scale])
        finally:
            if not options.keep:
                _delete_topic(settings, topic)
    if "wavepipe" in systems and options.warm_runs:
        measurements += warm_small_runs(settings, options, stamp, work / "warm-small", broker.pid(), options.warm_runs)
    if not options.keep:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "wavepipe_bench": 1,
        "started_at": stamp,
        "seconds": round(time.monotonic() - began, 1),
        "command": options.command,
        "machine": machine_info(),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "skipped": skipped,
        "engine_start": engine_start,
        "engine_warmup": warmup,
        "measurements": [asdict(m) for m in measurements],
    }


def _quality_pairs(repeats: int) -> list[tuple[int, str]]:
    """(repeat, system) of the quality metrics' repeated pair, alternating which goes first."""
    pair = ("wavepipe_no_qc", "wavepipe")
    return [(k, system) for k in range(1, repeats + 1) for system in (pair if k % 2 else pair[::-1])]


#: The small run of the warm-engine measurement: ten 1 MiB waveforms in 64 KiB chunks.
WARM_SMALL = Workload("warm_small", 1 * MiB, 64 * KiB, 10 * MiB)


def with_object_store(settings: Settings) -> Settings:
    """``settings`` reaching an object store for the ``wavepipe_s3`` row: the one ``s3_endpoint``
    names, else this home's local store, started here. Every run of the bench then attaches to one
    engine that can reach it (its S3A jars and settings come with ``s3_endpoint``)."""
    if settings.s3_endpoint and settings.s3_endpoint != "local":
        return settings

    store = LocalObjectStore.from_settings(settings)
    log.info("%s", lifecycle.start("the object store", store))
    # named in full: each run has a home of its own, and "local" would name that home's store
    options = store.client_options()
    return settings.replace(
        s3_endpoint=options["endpoint"],
        s3_region=options["region"],
        s3_access_key=options["access_key"],
        s3_secret_key=options["secret_key"],
    )


def measure_engine_start(settings: Settings) -> dict | None:
    """The local Spark engine's cold start, alone: stopped, started until it accepts
    connections, then a new session's attach and first query, and a second query on that session.
    None where runs use a remote engine or spark-submit (nothing of the bench's to start), or
    where the engine is busy with someone's step (it is not stopped under a run)."""
    if settings.spark_engine != "connect" or settings.spark_remote:
        return None

    engine = LocalEngine(settings)
    if engine.pid() is not None:
        if not engine.idle():
            log.warning(
                "the Spark engine is running a step: its cold start is not measured (it is not stopped under a run)"
            )
            return None
        log.info("%s", engine.down())
    began = time.monotonic()
    log.info("%s", engine.up())
    up_s = time.monotonic() - began
    began = time.monotonic()
    with attached(settings) as spark:
        spark.range(1).count()
        first_s = time.monotonic() - began
        began = time.monotonic()
        spark.range(1).count()
        again_s = time.monotonic() - began
    result = {"up_s": round(up_s, 3), "attach_and_first_query_s": round(first_s, 3), "warm_query_s": round(again_s, 3)}
    log.info(
        "Spark engine cold start: %.1f s to answer, %.1f s to attach and run a first query, then %.2f s a query",
        up_s,
        first_s,
        again_s,
    )
    return result


def warm_small_runs(
    settings: Settings,
    options: BenchOptions,
    stamp: str,
    workdir: Path,
    broker_pid: int | None,
    runs: int,
    name: str = "warm",
) -> list[Measurement]:
    """A small run with the engine warm, as a user who triggers a run for fresh data sees it:
    ten 1 MiB waveforms produced, then one run timed from plan to commit; ``runs`` times
    in one home and group (the first run creates the tables and the
    Great Expectations project; the later ones are the steady state). ``name`` keeps the topic and
    group of the engine's warm-up apart from the measured runs'."""
    from wavepipe.consumers.kafka_admin import ensure_topic

    topic = f"bench-{WARM_SMALL.name}-{name}-{stamp}"
    group = f"bench-{name}-{stamp}"
    ensure_topic(settings, topic, options.partitions)
    pool = SignalPool()
    out: list[Measurement] = []
    try:
        before = _ranges(settings, topic, options.partitions)
        manifest: dict[str, str] = {}
        for i in range(runs):
            manifest.update(
                produce_backlog(
                    settings,
                    topic,
                    WARM_SMALL,
                    first_index=i * WARM_SMALL.waveforms,
                    count=WARM_SMALL.waveforms,
                    pool=pool,
                )
            )
            after = _ranges(settings, topic, options.partitions)
            ranges = {p: (before[p][1], after[p][1]) for p in after}
            before = after
            m = _measure(
                settings,
                "wavepipe",
                WARM_SMALL,
                WARM_SMALL,
                1,
                topic,
                ranges,
                manifest,
                workdir,
                broker_pid,
                options,
                keep_workdir=True,
                run=functools.partial(wavepipe_run, group=group, small_reads_in_process=True),
            )
            m.info["repeat"] = i + 1
            out.append(m)
    finally:
        if not options.keep:
            _delete_topic(settings, topic)
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def _measure(
    settings: Settings,
    system: str,
    workload: Workload,
    target: Workload,
    scale: int,
    topic: str,
    ranges: Ranges,
    manifest: dict[str, str],
    workdir: Path,
    broker_pid: int | None,
    options: BenchOptions,
    keep_workdir: bool = False,
    run=None,
) -> Measurement:
    """Run ``system`` (or ``run``, a system's function with arguments bound) on ``ranges`` under
    a monitor; check its output against ``manifest``. ``keep_workdir``: for a run that continues
    where the previous one left off (its home and output stay)."""
    m = Measurement(system, workload.name, scale, target.waveforms, target.chunks, target.payload_bytes)
    log.info("  %-34s x%d on %s ...", LABELS[system], scale, _describe_ranges(ranges))
    try:
        # the engine's processes are wavepipe's: the other systems run beside it, idle, not on it
        engine, on_engine = _engine_pid(settings), system in ON_ENGINE
        with Monitor(broker_pid, engine if on_engine else None, ignore_pid=None if on_engine else engine) as monitor:
            outcome = (run or SYSTEMS[system])(settings, topic, ranges, workdir, options.parallelism)
        m.memory = monitor.stats()
        m.wall_s = round(outcome.wall_s, 3)
        m.mb_s = round(target.payload_bytes / 1e6 / outcome.wall_s, 3)
        m.chunks_s = round(target.chunks / outcome.wall_s)
        m.stages = {k: round(v, 3) for k, v in outcome.stages.items()}
        m.info = outcome.info
        m.check = _check(system, outcome, target, manifest)
        log.info(
            "  %-34s x%d: %.1fs, %.1f MB/s, %d chunks/s; %s",
            LABELS[system],
            scale,
            m.wall_s,
            m.mb_s,
            m.chunks_s,
            m.check,
        )
    except Exception as exc:
        m.error = f"{type(exc).__name__}: {exc}"
        log.error("  %s failed: %s", LABELS[system], m.error)
    finally:
        if not options.keep and not keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
            if m.info.get("s3_prefix"):
                _delete_prefix(m.info["s3_prefix"])
    return m


def _delete_prefix(prefix: str) -> None:

    try:
        storage.delete_tree(prefix)
    except Exception as exc:  # the measurement stands; only the store's disk is not freed
        log.warning("could not delete %s (%s); delete it by hand to free the store's disk", prefix, exc)


def _engine_pid(settings: Settings) -> int | None:
    """The pid of the local Spark engine wavepipe's runs attach to (None: none on this machine)."""
    return LocalEngine(settings).pid() if settings.spark_engine == "connect" and not settings.spark_remote else None


def _check(system: str, outcome, target: Workload, manifest: dict[str, str]) -> str:
    """The output holds every produced waveform once with its checksum (some bit-exact by sha256)."""
    if system in CEILINGS:
        got = outcome.info.get("bytes")
        if got != target.payload_bytes:
            raise AssertionError(f"read {got} bytes, the ranges hold {target.payload_bytes}")
        return f"{got} bytes written"
    import pyarrow.dataset as ds

    # The Parquet files alone (no partition columns from folder names; only id, checksum and a few
    # payloads are read). For wavepipe's Delta table that is its content: a fresh table, appends only.
    dataset = storage.parquet_dataset(str(outcome.output))
    table = dataset.to_table(columns=["waveform_id", "checksum"])
    ids = table["waveform_id"].to_pylist()
    if len(ids) != len(set(ids)):
        raise AssertionError(f"{len(ids) - len(set(ids))} waveforms appear more than once")
    got = dict(zip(ids, table["checksum"].to_pylist(), strict=True))
    if got.keys() != manifest.keys():
        missing, extra = len(manifest.keys() - got.keys()), len(got.keys() - manifest.keys())
        raise AssertionError(
            f"output has {len(got)} waveforms, expected {len(manifest)} ({missing} missing, {extra} unknown)"
        )
    wrong = [w for w, c in got.items() if manifest[w] != c]
    if wrong:
        raise AssertionError(f"{len(wrong)} waveforms carry the wrong checksum, e.g. {wrong[0]}")
    sample = random.Random(0).sample(sorted(got), min(8, len(got)))
    rows = dataset.to_table(columns=["waveform_id", "payload"], filter=ds.field("waveform_id").isin(sample))
    for wid, payload in zip(rows["waveform_id"].to_pylist(), rows["payload"].to_pylist(), strict=True):
        if "sha256:" + hashlib.sha256(payload).hexdigest() != manifest[wid]:
            raise AssertionError(f"waveform {wid} is not bit-exact")
    return f"{len(got)} waveforms once each, checksums match, {len(sample)} re-hashed bit-exact"


def _ratios(group: list[Measurement]) -> None:
    ceiling = min((m.wall_s for m in group if m.system in CEILINGS and m.wall_s), default=None)
    for m in group:
        if ceiling and m.wall_s:
            m.of_ceiling = round(ceiling / m.wall_s, 3)


def _ranges(settings: Settings, topic: str, partitions: int) -> Ranges:
    from confluent_kafka.admin import OffsetSpec

    from wavepipe.consumers.kafka_admin import list_offsets

    low = list_offsets(settings, topic, range(partitions), OffsetSpec.earliest())
    high = list_offsets(settings, topic, range(partitions), OffsetSpec.latest())
    return {p: (low[p], high[p]) for p in range(partitions)}


def _describe_ranges(ranges: Ranges) -> str:
    return ", ".join(f"p{p}[{s},{e})" for p, (s, e) in sorted(ranges.items()))


def _delete_topic(settings: Settings, topic: str) -> None:
    from wavepipe.consumers.kafka_admin import admin_client

    try:
        admin = admin_client(settings)
        admin.delete_topics([topic])[topic].result(timeout=30)
    except Exception as exc:
        log.warning("could not delete topic %s (%s); delete it by hand to free disk", topic, exc)


def run_header(benchmark: str, stamp: str, began: float, options) -> dict:
    """What a benchmark mode's result opens with: its name, when it started, its seconds (from the
    ``time.monotonic()`` of ``began``), its options and the machine."""
    return {
        "benchmark": benchmark,
        "started": stamp,
        "seconds": round(time.monotonic() - began, 1),
        "options": dict(options.__dict__),
        "machine": machine_info(),
    }


def machine_info() -> dict:
    from importlib.metadata import version

    import confluent_kafka

    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:  # psutil does not name the CPU model
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    mem_kb = psutil.virtual_memory().total // 1024
    kcat = shutil.which("kcat")
    kafka_pom = RESOURCES / "kafka-pom.xml"
    kafka_version = ""
    if kafka_pom.exists():
        found = re.search(r"<kafka.version>([^<]+)<", kafka_pom.read_text())
        kafka_version = found.group(1) if found else ""
    # the commit measured (marked when the data path had uncommitted changes); an installed wavepipe names its version
    commit = checkout_commit(source_checkout()) or f"wavepipe {version('wavepipe')}"
    return {
        "wavepipe_commit": commit,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "kafka": kafka_version,
        "pyspark": version("pyspark"),
        # the Delta Lake jars resolved for that Spark (the results' name for them predates the jars)
        "delta_spark": delta_build(installed_pyspark())["delta.version"],
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "kcat": (subprocess.run([kcat, "-V"], capture_output=True, text=True, check=False).stdout.splitlines() or [""])[
            0
        ]
        if kcat
        else None,
    }


def save(results: dict, out_dir: Path) -> list[Path]:

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "results.json", out_dir / "results.md", out_dir / "throughput.png"]
    paths[0].write_text(json.dumps(results, indent=2) + "\n")
    paths[1].write_text(markdown(results, chart_name=paths[2].name))
    chart(results, paths[2])
    return paths
