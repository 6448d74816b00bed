"""How wavepipe starts Spark: one set of settings for spark-submit and for in-process sessions."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from wavepipe import storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import StepFailedError
from wavepipe.jars import RESOURCES, gcs_jars, logstore_jar, s3_jars, spark_jars

log = logging.getLogger("wavepipe.spark")


#: Driver JVM options of a small run's Spark app (``spark_small_run_bytes``). A Spark app on a few
#: megabytes lives about a minute, most of it warming up: the C2 compiler's threads and G1's
#: concurrent threads then cost more CPU than they save (measured: about half the CPU seconds of a
#: run of nine records, and a quarter less wall time; docs/how-a-run-works.md). Larger runs keep
#: the JVM's defaults, which pay off on long scans.
SMALL_RUN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_conf(settings: Settings, *, small_run: bool = False) -> dict[str, str]:
    """Spark properties every wavepipe Spark app runs with (Delta Lake, low parallelism);
    ``small_run``: with ``SMALL_RUN_JAVA_OPTIONS`` for the driver."""
    conf: dict[str, Any] = {
        "spark.jars": ",".join(str(j) for j in spark_jars(settings.jars_dir)),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.parquet.compression.codec": "zstd",
        # Output rows are large (whole waveforms): write up to 4 table partitions at once per task
        # instead of sorting the rows by partition first, and keep Parquet's in-memory row groups
        # and pages small; Spark's memory manager does not count them. Parquet measures a buffer
        # only every 100 rows by default, which is 100 MiB of 1 MiB waveforms (a 2 GiB heap ran
        # out at 1 GiB): measure after every row instead (negligible next to a waveform's bytes).
        "spark.sql.maxConcurrentOutputFileWriters": "4",
        "spark.hadoop.parquet.block.size": str(32 * 1024 * 1024),
        "spark.hadoop.parquet.block.size.row.check.min": "1",
        "spark.hadoop.parquet.page.size.row.check.min": "1",
        # A waveform is one value of the ``payload`` column, and Parquet keeps whole values in
        # memory while it writes them. By default it also copies each one into a dictionary (then
        # falls back to plain encoding, a second copy), keeps a copy each as the page's min and max
        # statistics, and copies the page once more for its checksum: 4 of the 10 copies of a
        # waveform a write makes (measured), useless for opaque sample bytes. Without them two
        # 64 MiB waveforms fit in a 2.5g heap (docs/deployment.md, "Memory").
        "spark.hadoop.parquet.enable.dictionary#payload": "false",
        "spark.hadoop.parquet.column.statistics.enabled#payload": "false",
        "spark.hadoop.parquet.page.write-checksum.enabled": "false",
        "spark.databricks.delta.snapshotPartitions": "2",
        # Delta's VACUUM lists and deletes files in this many tasks (Spark's default: 10000, which
        # took 30 s on local[2] to delete 24 files)
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
        # Arrow's default allocator (mimalloc) keeps freed memory: a Python worker streaming 1 GiB
        # peaked at 699 MB with it and 445 MB with the system allocator.
        "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={RESOURCES / 'spark-log4j2.properties'}",
        # executors on a cluster (local mode has none): the same quiet logging, where the file exists
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={RESOURCES / 'spark-log4j2.properties'}",
    }
    conf |= _s3_conf(settings)
    conf |= _gcs_conf(settings, conf)
    conf.update(settings.spark_conf)
    if small_run:
        java = str(conf.get("spark.driver.extraJavaOptions", ""))
        conf["spark.driver.extraJavaOptions"] = f"{java} {SMALL_RUN_JAVA_OPTIONS}".strip()
    return {k: str(v) for k, v in conf.items()}


def _s3_conf(settings: Settings) -> dict[str, str]:
    """With a location on an object store, or an S3 endpoint set (``storage.reaches_s3``): S3A's
    jars and settings, and wavepipe's LogStore."""
    if not storage.reaches_s3(settings):
        return {}
    jars = [*spark_jars(settings.jars_dir), *s3_jars(settings.jars_dir), logstore_jar(settings.jars_dir)]
    return {"spark.jars": ",".join(str(j) for j in jars), **storage.spark_confs(storage.s3_options(settings))}


def _gcs_conf(settings: Settings, conf: dict) -> dict[str, str]:
    """With the tables or staging on GCS (``storage.reaches_gcs``): Google's connector, added to
    the jars ``conf`` has, and its settings."""
    if not storage.reaches_gcs(settings):
        return {}
    jars = [*str(conf.get("spark.jars", "")).split(","), *(str(j) for j in gcs_jars(settings.jars_dir))]
    confs = storage.gcs_spark_confs(storage.gcs_options(settings))
    return {"spark.jars": ",".join(j for j in jars if j), **confs}


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process load exactly ``settings``."""
    return {
        f"WAVEPIPE_{name.upper()}": json.dumps(value) if isinstance(value, dict | list) else str(value)
        for name, value in settings.as_dict().items()
    }


#: What pyspark sets in a process that made a Spark Connect session: inherited by a child, it
#: would make that child's classic session (a spark-submit app) look for a Connect server.
CONNECT_MODE_VARIABLES = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE")


def without_connect_mode(env) -> dict[str, str]:
    """``env`` without ``CONNECT_MODE_VARIABLES``."""
    return {k: v for k, v in env.items() if k not in CONNECT_MODE_VARIABLES}


def pyspark_bin(name: str) -> Path:
    """One of the installed pyspark's own scripts (``spark-submit``, ``spark-class``)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / name


#: Tries of a task (a killed Python worker, a lost executor) before its job fails: Spark's
#: default on a cluster. Local mode gives a task one try unless the master says otherwise.
TASK_ATTEMPTS = 4


def with_task_retries(master: str) -> str:
    """``master``, with ``TASK_ATTEMPTS`` tries per task when it is local mode without a count of
    its own (``local``, ``local[2]``, ``local[*]`` -> ``local[2,4]``...); others as they are."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)\])?", master.strip())
    return f"local[{found.group(1) or 1},{TASK_ATTEMPTS}]" if found else master


def spark_submit_command(settings: Settings, app: Path, *args: str, small_run: bool = False) -> list[str]:
    cmd = [str(pyspark_bin("spark-submit")), "--master", with_task_retries(settings.spark_master)]
    for key, value in spark_conf(settings, small_run=small_run).items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [str(app), *args]


def _local_env(settings: Settings) -> dict[str, str]:
    """The environment of a Spark driver this machine starts. In local mode, or with a master on
    loopback, the driver binds to loopback only (it would pick the first interface otherwise,
    which a loopback cluster may not reach). With a location on S3, the S3 keys (no command line
    shows them)."""
    master = settings.spark_master
    loopback = master.startswith(("spark://127.0.0.1:", "spark://localhost:"))
    env = {"SPARK_LOCAL_IP": "127.0.0.1"} if master.startswith("local") or loopback else {}
    return env | (storage.credentials_env(storage.s3_options(settings)) if storage.reaches_s3(settings) else {})


def is_small_run(settings: Settings, staged_bytes: int) -> bool:
    """Whether a run of ``staged_bytes`` staged bytes gets the small-run JVM options."""
    return settings.spark_small_run_bytes > 0 and staged_bytes <= settings.spark_small_run_bytes


def submit(settings: Settings, app: Path, *args: str, staged_bytes: int | None = None) -> None:
    """Run a Spark app through spark-submit, streaming its output; raise if it fails.
    ``staged_bytes``: the size of the run's staged files (a small run gets a short-lived JVM)."""
    env = {
        **without_connect_mode(os.environ),
        **settings_env(settings),
        **_local_env(settings),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "ARROW_DEFAULT_MEMORY_POOL": "system",
    }
    small_run = staged_bytes is not None and is_small_run(settings, staged_bytes)
    if small_run:
        log.info(
            "a small run (%d bytes staged): the Spark app's driver JVM starts with %s",
            staged_bytes,
            SMALL_RUN_JAVA_OPTIONS,
        )
    cmd = spark_submit_command(settings, app, *args, small_run=small_run)
    # Its own session, so the app's processes (JVM, Python driver, Python workers) can be stopped
    # together: here when this step is interrupted (Airflow stopping the task), and by a
    # ``kill-app`` failpoint in tests. Its output is relayed line by line at the level each line
    # states (a task log shows Spark's warnings as warnings, not as errors).
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    relays = [_relay(proc.stdout, "stdout"), _relay(proc.stderr, "stderr")]
    try:
        _wait_with_progress(proc, app, staged_bytes)
    except BaseException:
        _stop_session(proc)
        raise
    finally:
        for relay in relays:
            relay.join(RELAY_DRAIN_S)  # a grandchild may still hold the pipe: do not wait for it
    if proc.returncode != 0:
        raise StepFailedError(
            f"Spark app {app.name} failed with exit code {proc.returncode}; its log is above. "
            "The run's plan and staged files are kept: fix the cause and retry the step."
        )


#: Seconds between the progress lines of a running Spark app.
PROGRESS_EVERY_S = 10.0
#: Seconds to wait, once the app exited, for the rest of its output.
RELAY_DRAIN_S = 5.0
app_log = logging.getLogger("wavepipe.spark.app")


def _wait_with_progress(proc: subprocess.Popen, app: Path, staged_bytes: int | None) -> None:
    """Wait for ``proc``, with ``progress`` lines naming the app; the last one gives its exit code."""
    with progress(f"Spark app {app.stem}", staged_bytes, outcome=lambda: f"exited with code {proc.returncode}"):
        proc.wait()


#: The part of an engine step that runs now, and the part a failure left (``phase``); one
#: engine step at a time runs in a process (the run's lock).
_phase: dict[str, str | None] = {"now": None, "failed": None}


@contextlib.contextmanager
def phase(name: str):
    """Name the part of an engine step that runs now (``reassemble``, ``validate``, ``publish``):
    the step's progress lines and its failure say which part it was in."""
    before, _phase["now"] = _phase["now"], name
    try:
        yield
    except BaseException:
        _phase["failed"] = _phase["failed"] or name
        raise
    finally:
        _phase["now"] = before


def current_phase() -> str | None:
    """The innermost ``phase`` running now, or the one a failure is leaving."""
    return _phase["now"] or _phase["failed"]


@contextlib.contextmanager
def progress(what: str, staged_bytes: int | None = None, outcome=None, detail=None):
    """Log a line when ``what`` starts, every ``PROGRESS_EVERY_S`` while it runs (with the
    ``phase`` it is in, and what ``detail()`` says: the engine's stages), and when it ends
    (``done``, or ``failed in <phase>``, or what ``outcome()`` says once it ended)."""
    what = what + (f" on {staged_bytes / 1e6:.1f} MB of staged chunks" if staged_bytes else "")
    began = time.monotonic()
    done = threading.Event()
    _phase["failed"] = None

    def tick() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            now = f" ({_phase['now']})" if _phase["now"] else ""
            said = detail() if detail else None
            log.info("%s: running for %.0fs%s%s", what, time.monotonic() - began, now, f"; {said}" if said else "")

    log.info("%s: started", what)
    ticker = threading.Thread(target=tick, name="spark-progress", daemon=True)
    ticker.start()
    ended = "failed"
    try:
        yield
        ended = "done"
    except BaseException:
        ended = f"failed in {_phase['failed']}" if _phase["failed"] else "failed"
        raise
    finally:
        done.set()
        seconds = time.monotonic() - began
        rate = f" ({staged_bytes / 1e6 / seconds:.2f} MB/s)" if staged_bytes and seconds > 0 else ""
        log.info("%s: %s after %.1fs%s", what, outcome() if outcome else ended, seconds, rate)


def _relay(stream, name: str) -> threading.Thread:
    """A thread that logs each line of ``stream`` to ``app_log`` at the level ``AppOutput`` reads
    from it (its own timestamp and level stripped)."""

    def run() -> None:
        lines = AppOutput()
        with stream:
            for raw in iter(stream.readline, b""):
                level, message = lines.classify(raw.decode("utf-8", "replace").rstrip("\r\n"))
                app_log.log(level, "%s", message)

    thread = threading.Thread(target=run, name=f"spark-app-{name}", daemon=True)
    thread.start()
    return thread


_LEVEL_NAMES = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "NOTICE": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "SEVERE": logging.ERROR,
    "FATAL": logging.CRITICAL,
    "CRITICAL": logging.CRITICAL,
}
#: A log line's prefix: up to two timestamp fields (log4j ``yy/MM/dd HH:mm:ss``, Python
#: ``yyyy-mm-dd HH:MM:SS,mmm``), then the level (``ERROR:root:...`` too).
_PREFIX = re.compile(r"^(?:[\d/:,.\-T+Z]+\s+){0,2}(?P<level>" + "|".join(_LEVEL_NAMES) + r")(?::|\s+)\s*(?P<rest>.*)$")
_PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
_ERROR_START = ("Traceback (most recent call last)", "Exception in thread ")
#: Lines that continue the one before: stack frames, exception lines, chained-exception headers.
_CONTINUATION = re.compile(
    r"^(?:\s|$|Caused by:|Suppressed:|\.\.\. \d+ more|During handling of the above"
    r"|The above exception|[A-Za-z_][\w.$]*(?:Exception|Error|Exit|Interrupt|Throwable)\b)"
)


#: The start of Spark's message for SPARK-59451 (see ``AppOutput``).
_HEARTBEAT_RACE = "Uncaught exception in thread executor-heartbeater"


class AppOutput:
    """Reads the level of each line of a child's output stream, in order: a line with a level
    prefix (log4j ``WARN``, Python ``WARNING``, ...) has that level and loses its timestamp and
    level; a traceback starts an ERROR block; stack frames, exception lines and blank lines keep
    the level of the line they continue; Python warnings are WARNING; anything else is INFO.

    One ERROR of Spark's is a WARNING here: an uncaught exception in the executor's heartbeat
    thread (with its stack). Spark 4.2 has a race there (SPARK-59451: the heartbeat reads an
    accumulator still being deserialized, a ``NullPointerException`` in ``isZero``). The line is
    not a failure: the heartbeat thread stops, and nothing else happens to an app that ends within
    ``spark.network.timeout`` (120 s) of it. A longer app may then see its executor removed for
    missing heartbeats; its tasks fail with errors of their own, which stay ERRORs, and so does
    the step."""

    def __init__(self) -> None:
        self.level = logging.INFO

    def classify(self, line: str) -> tuple[int, str]:
        """(level, message) of the next line."""
        match = _PREFIX.match(line)
        if match:
            self.level = _LEVEL_NAMES[match["level"]]
            if self.level == logging.ERROR and _HEARTBEAT_RACE in match["rest"]:
                self.level = logging.WARNING
            return self.level, match["rest"]
        if line.startswith(_ERROR_START):
            self.level = logging.ERROR
        elif _PY_WARNING.match(line):
            self.level = logging.WARNING
        elif not _CONTINUATION.match(line):
            self.level = logging.INFO
        return self.level, line


def _stop_session(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def local_session(settings: Settings, app_name: str = "wavepipe"):
    """An in-process Spark session with the same configuration (tests, notebooks)."""
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (the virtualenv's), not the first python on PATH.
    for key, value in {**_local_env(settings), "PYSPARK_PYTHON": sys.executable}.items():
        os.environ.setdefault(key, value)
    builder = SparkSession.builder.master(with_task_retries(settings.spark_master)).appName(app_name)
    for key, value in spark_conf(settings).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
