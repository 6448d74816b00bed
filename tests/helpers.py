"""Test helpers: hand-made chunk records in a chosen order, and reading the tables back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
from confluent_kafka import Producer

from wavepipe import storage
from wavepipe.consumers.kafka_admin import committed_offsets, list_offsets, new_consumer, new_producer, partitions_of
from wavepipe.contracts.config import Settings, load_settings
from wavepipe.contracts.protocol import checksum, split_waveform
from wavepipe.local import airflow as local
from wavepipe.spark_launch import settings_env

START = datetime(2026, 11, 2, 8, 30, tzinfo=UTC)


def waveform_records(waveform_id: str, n_chunks: int, chunk_size: int = 256, seed: int = 0):
    """(records, checksum) of a float32 two-channel waveform split into exactly ``n_chunks``."""
    samples = np.random.default_rng(seed).normal(size=(n_chunks * chunk_size // 8, 2)).astype("<f4")
    records = split_waveform(
        samples, waveform_id=waveform_id, sample_rate=100.0, start_time=START, source="test-src", chunk_size=chunk_size
    )
    assert len(records) == n_chunks
    return records, checksum(samples.tobytes())


def chunk_rows(
    records, partition: int = 0, first_offset: int = 0, overrides: dict | None = None, timestamp_ms: int = 0
) -> list[dict]:
    """``waveform_records`` as staged chunk rows (``staging.CHUNK_SCHEMA``) of topic ``t``, at
    consecutive offsets from ``first_offset``; ``overrides``: index -> columns changed."""
    from wavepipe.consumers.staging import chunk_row
    from wavepipe.contracts.protocol import parse_chunk

    overrides = overrides or {}
    rows = []
    for i, (_, headers, value) in enumerate(records):
        row = chunk_row("t", partition, first_offset + i, timestamp_ms, parse_chunk(headers, value))
        row.update(overrides.get(i, {}))
        rows.append(row)
    return rows


def with_headers(records, index: int, **changes):
    """Record ``index`` of ``records`` with some headers replaced (a None value drops the header);
    header names with dashes are passed as ``**{"wp-count": b"3"}``."""
    key, headers, value = records[index]
    out = [(k, v) for k, v in headers if k not in changes]
    out += [(k, v) for k, v in changes.items() if v is not None]
    return key, out, value


def produce_in_order(
    settings: Settings, records, partition: int = 0, producer: Producer | None = None, when: datetime | None = None
) -> None:
    """Produce ``records`` to one partition in exactly this order (idempotent, acks=all), stamped
    ``when`` (CreateTime) if given. A producer passed in is flushed by the caller."""
    own = producer is None
    producer = producer or new_producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    errors = []
    for key, headers, value in records:
        producer.produce(
            settings.topic,
            value=value,
            key=key,
            headers=headers,
            partition=partition,
            on_delivery=lambda err, msg: errors.append(err) if err else None,
            **({"timestamp": int(when.timestamp() * 1000)} if when else {}),
        )
    if own:
        assert producer.flush(30) == 0
    assert not errors, errors


def output_rows(spark, settings: Settings):
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(storage.for_spark(settings.output_table))
    return sorted(
        (r["waveform_id"], r["checksum"], r["payload_sha"], r["run_id"])
        for r in df.select(
            "waveform_id", "checksum", F.concat(F.lit("sha256:"), F.sha2("payload", 256)).alias("payload_sha"), "run_id"
        ).collect()
    )


def offsets_at_end(settings: Settings) -> bool:
    """Whether the group's committed offsets are at the end of each partition of its topic, as
    Kafka's admin API reports both."""
    from confluent_kafka.admin import OffsetSpec

    parts = partitions_of(settings, settings.topic)
    ends = list_offsets(settings, settings.topic, parts, OffsetSpec.latest())
    return committed_offsets(settings, settings.group, settings.topic, parts) == ends


def committed_metadata(settings: Settings, partition: int = 0) -> dict:
    """The metadata wavepipe stored with the group's committed offset (run id, planned end)."""
    import json

    from confluent_kafka import TopicPartition

    from wavepipe.consumers.kafka_admin import group_consumer

    consumer = group_consumer(settings, settings.group)
    try:
        [tp] = consumer.committed([TopicPartition(settings.topic, partition)], timeout=30)
    finally:
        consumer.close()
    return json.loads(tp.metadata)


def start_python(settings: Settings, code: str, failpoints: str | None = None, **popen):
    """``python -c code`` in a child process that loads exactly ``settings``, optionally with
    failpoints armed (``wavepipe.faults``); ``returncode`` is -9 when a failpoint killed it."""
    import os
    import subprocess
    import sys

    from wavepipe.contracts.config import PROJECT_ROOT
    from wavepipe.spark_launch import settings_env

    env = {**os.environ, **settings_env(settings)}
    env.pop("WAVEPIPE_FAILPOINTS", None)
    if failpoints:
        env["WAVEPIPE_FAILPOINTS"] = failpoints
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=PROJECT_ROOT, **popen)


def start_cli(settings: Settings, *args: str, failpoints: str | None = None):
    """``wavepipe <args>`` in a child process (see ``start_python``); output in ``stdout``."""
    import subprocess

    code = f"import sys; from wavepipe.cli import main; sys.exit(main({list(args)!r}))"
    return start_python(settings, code, failpoints, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def frozen_in(proc) -> list:
    """The processes of ``proc``'s tree (anything with a ``pid``) that a ``stop`` failpoint froze
    (``psutil.Process``)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        return [p for p in tree if p.status() == psutil.STATUS_STOPPED]
    except psutil.NoSuchProcess:
        return []


def when_stopped(proc, timeout: float = 240):
    """The process of ``proc``'s tree that a ``stop`` failpoint froze, once one is; it goes on
    after a ``SIGCONT`` (``resume()``). Fails when ``proc`` ends or ``timeout`` passes first."""
    import time

    began = time.monotonic()
    while time.monotonic() - began < timeout:
        assert proc.poll() is None, f"ended before its failpoint stopped it: {proc.communicate()[0][-2000:]}"
        frozen = frozen_in(proc)
        if frozen:
            return frozen[0]
        time.sleep(0.1)
    raise AssertionError(f"no failpoint stopped it within {timeout:.0f}s")


def let_go(proc, timeout: float = 300) -> str:
    """Let ``proc`` run to its end, resuming it whenever a ``stop`` failpoint froze it again (a
    point counted per reader, such as ``consume.record``, stops the run once for each reader that
    reaches it); its output."""
    import contextlib
    import subprocess
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.communicate(timeout=1)[0]
        except subprocess.TimeoutExpired:
            assert time.monotonic() < deadline, f"still running after {timeout:.0f}s"
        for frozen in frozen_in(proc):
            with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
                frozen.resume()


def run_cli(settings: Settings, *args: str, failpoints: str | None = None, timeout: float = 600) -> tuple[int, str]:
    """``start_cli`` to the end: (return code, output)."""
    proc = start_cli(settings, *args, failpoints=failpoints)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def run_cli_json(settings: Settings, *args: str, timeout: float = 600) -> tuple[int, Any, str]:
    """``wavepipe <args> --json``: (return code, the JSON document on stdout, stderr)."""
    proc = start_python(
        settings,
        f"import sys; from wavepipe.cli import main; sys.exit(main({[*args, '--json']!r}))",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, (json.loads(out) if out.strip() else None), err


def assert_accounted(spark, settings: Settings, report: dict, gaps: bool = False) -> None:
    """DESIGN contract 5 for one run, checked against the tables, not only the report's own sums:
    per partition output + pending + quarantined + dead letter (+ offsets Kafka delivered no record
    for) = the range's offsets; the dead-letter table holds the run's dead letters; every waveform
    is in the output once. ``gaps``: offsets without a record are expected (transactions); else
    every offset must have been delivered, so a reader that skipped records cannot hide them."""
    from pyspark.sql import functions as F

    assert report["balance_errors"] == [], report["balance_errors"]
    for p, part in report["partitions"].items():
        if not part["read"]:
            continue
        placed = part["output"] + part["pending"] + part["quarantined"] + part["dead_letter"] + part["gap"]
        assert placed == part["end"] - part["start"], (p, part)
        assert part["start"] <= part["safe_offset"] <= part["end"], (p, part)
        assert gaps or part["gap"] == 0, (p, part)
    if report["totals"]["dead_letter"]:  # each once, also when an earlier run dead-lettered it first
        dead = (
            spark.read.format("delta")
            .load(storage.for_spark(settings.dead_letter_table))
            .where(F.col("topic") == report["topic"])
        )
        for p, part in report["partitions"].items():
            in_range = dead.where(
                (F.col("partition") == int(p)) & F.col("offset").between(part["start"], part["end"] - 1)
            )
            assert in_range.count() == part["dead_letter"], (p, part)
    assert_output_unique(spark, settings)
    assert_protocol_types(settings)


def published_tables(settings: Settings) -> dict[str, str]:
    """The tables a run of ``settings`` published (those that exist), by name."""
    from wavepipe.maintenance import table_paths

    return {name: path for name, path in table_paths(settings).items() if storage.has_table(path)}


def assert_protocol_types(settings: Settings) -> None:
    """Every published table's log holds only types the Delta protocol defines (read from the log
    itself, so a type Spark accepts and other readers refuse fails here)."""
    from wavepipe.delta_protocol import schema_problems

    for name, path in published_tables(settings).items():
        assert schema_problems(path) == [], f"the {name} table's log holds types no Delta reader accepts"


def _normalized(rows: list[dict]) -> list[tuple]:
    return sorted((tuple(sorted(r.items())) for r in rows), key=repr)


def assert_delta_rs_reads_as_spark(spark, path: str) -> int:
    """delta-rs (the ``deltalake`` package) reads the table at ``path`` (local or on an object
    store) row for row as Spark does, every column and value; returns the rows."""
    name = str(path).rstrip("/").rsplit("/", 1)[-1]
    theirs = storage.delta_table(path).to_pyarrow_table()
    ours = spark.read.format("delta").load(storage.for_spark(path)).toArrow()
    assert sorted(theirs.column_names) == sorted(ours.column_names), (theirs.schema, ours.schema)
    assert theirs.num_rows == ours.num_rows, f"{name}: delta-rs {theirs.num_rows} rows, Spark {ours.num_rows}"
    assert _normalized(theirs.to_pylist()) == _normalized(ours.to_pylist()), f"{name}: rows differ"
    return theirs.num_rows


def assert_output_unique(spark, settings: Settings) -> None:
    if not storage.has_table(settings.output_table):
        return
    df = spark.read.format("delta").load(storage.for_spark(settings.output_table))
    total, distinct = df.count(), df.select("waveform_id").distinct().count()
    assert total == distinct, f"{total - distinct} duplicate output rows"


def quarantine_reasons(spark, settings: Settings) -> dict[str, str]:
    if not storage.has_table(settings.quarantine_table):
        return {}
    return {
        r["waveform_id"]: r["reason"]
        for r in spark.read.format("delta")
        .load(storage.for_spark(settings.quarantine_table))
        .select("waveform_id", "reason")
        .collect()
    }


def read_topic(settings: Settings, topic: str, partition: int = 0) -> list[tuple[bytes, dict[str, bytes]]]:
    """Every committed record of one partition, as (value, headers), read until it goes quiet."""
    from confluent_kafka import TopicPartition

    consumer = new_consumer(
        settings.kafka_config(
            **{"group.id": "test-reader", "isolation.level": "read_committed", "enable.auto.commit": False}
        )
    )
    consumer.assign([TopicPartition(topic, partition, 0)])
    out, idle = [], 0
    try:
        while idle < 6:
            msg = consumer.poll(0.5)
            if msg is None:
                idle += 1
                continue
            if msg.error():
                raise AssertionError(msg.error())
            out.append((msg.value() or b"", dict(msg.headers() or [])))
    finally:
        consumer.close()
    return out


def quarter_hour_ago(hours: float = 2.0) -> datetime:
    """A quarter hour ``hours`` ago: the start of one of wavepipe_ingest's 15-minute intervals, and
    recent enough for the topic's retention (records older than 7 days are deleted)."""
    from datetime import timedelta

    t = datetime.now(UTC) - timedelta(hours=hours)
    return t.replace(minute=t.minute - t.minute % 15, second=0, microsecond=0)


def produce_two_windows(settings: Settings, t0: datetime) -> dict[str, int]:
    """Four waveforms on partition 0 around the windows ``[t0, t0+15m)`` and ``[t0+15m, t0+30m)``:
    A inside the first, B straddling their edge (two chunks before it, two after), C inside the
    second, D after both. Returns each waveform's first offset (A 0-2, B 3-6, C 7-8, D 9-10)."""
    from datetime import timedelta

    minute = timedelta(minutes=1)
    producer = new_producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    a, _ = waveform_records("wf-A", 3, seed=1)
    b, _ = waveform_records("wf-B", 4, seed=2)
    c, _ = waveform_records("wf-C", 2, seed=3)
    d, _ = waveform_records("wf-D", 2, seed=4)
    produce_in_order(settings, a, producer=producer, when=t0 + 1 * minute)
    produce_in_order(settings, b[:2], producer=producer, when=t0 + 14 * minute)
    produce_in_order(settings, b[2:], producer=producer, when=t0 + 16 * minute)
    produce_in_order(settings, c, producer=producer, when=t0 + 20 * minute)
    produce_in_order(settings, d, producer=producer, when=t0 + 31 * minute)
    assert producer.flush(30) == 0
    return {"wf-A": 0, "wf-B": 3, "wf-C": 7, "wf-D": 9}


def rows_by_id(spark, settings: Settings) -> dict[str, tuple]:
    """Output rows by waveform id: (checksum, payload sha256, run id)."""
    return {wid: (cs, sha, run_id) for wid, cs, sha, run_id in output_rows(spark, settings)}


def local_engine(home: Path, **changes):
    """A warm Spark engine of a test's own (this home's Spark Connect server in local mode, on a
    free port), not started yet; ``changes``: its other settings."""
    from wavepipe.local.engine_server import LocalEngine
    from wavepipe.local.kafka import free_port

    return LocalEngine(
        load_settings(home=home, spark_connect_port=free_port(), spark_master="local[2]", spark_remote="", **changes)
    )


def make_settings(home: Path, kafka, engine, **changes) -> Settings:
    """A test's settings: ``home``, a topic and group of its own on the session's broker, its Spark
    work on the session's engine (its web UI too: reports list their Spark jobs), no caps, new
    groups from the earliest offsets; then ``changes``."""
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        home=home,
        bootstrap_servers=kafka.bootstrap,
        topic=f"wf-{tag}",
        group=f"grp-{tag}",
        partitions=2,
        kafka_client_config={},
        max_records_per_partition=0,
        max_bytes_per_partition=0,
        spark_master="local[2]",
        reader_stall_timeout_s=30,
        new_group_start="earliest",
        spark_engine="connect",
        spark_remote=engine.url(),
        spark_ui=engine.ui_url() or "",
        **changes,
    )


# --- the local Airflow services, as a user drives them -------------------------------------------


def airflow_cli(settings, action: str, timeout: float = 400, env: dict | None = None) -> tuple[int, str, float]:
    """``wavepipe airflow <action>`` as a user runs it: (exit code, output, seconds); ``env``: more
    of its environment (the services it starts inherit it)."""
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "wavepipe.cli", "airflow", action],
        env={**os.environ, **settings_env(settings), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr, time.monotonic() - began


def progress(message: str) -> None:
    print(message, file=sys.__stderr__, flush=True)


#: How long a triggered DAG run may take: generous, a contended machine running two test files at once is slow.
RUN_TIMEOUT_S = 900


def trigger_run(api, dag_id: str, conf: dict) -> str:
    """Trigger ``dag_id`` with ``conf`` through the REST API and unpause it (new DAGs start paused,
    for users; unpausing after the trigger lets this run go first); its run id."""
    trigger = api.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
    assert trigger.status_code == 200, trigger.text
    assert trigger.json()["conf"] == conf
    unpause = api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False})
    assert unpause.status_code == 200 and unpause.json()["is_paused"] is False, unpause.text
    return trigger.json()["dag_run_id"]


def run_state(api, dag_id: str, run_id: str) -> str:
    """A DAG run's state, or what the API answered instead (on SQLite a read can meet the lock of
    a write: asked again by the caller's next poll)."""
    answer = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}")
    state = answer.json().get("state") if answer.status_code == 200 else None
    return state or f"not answered ({answer.status_code}: {answer.text[:120]})"


def wait_for_runs(api, dag_id: str, run_ids: list[str], timeout_s: float = RUN_TIMEOUT_S) -> dict[str, str]:
    """Poll the DAG runs until each succeeded or failed; print their tasks' states every 15 s."""
    began, last_print, states = time.monotonic(), 0.0, {}
    while True:
        elapsed = time.monotonic() - began
        states = {r: run_state(api, dag_id, r) for r in run_ids}
        if all(s in ("success", "failed") for s in states.values()):
            return states
        if elapsed - last_print >= 15:
            progress(
                f"  {elapsed:5.0f}s "
                + "; ".join(f"{r}: {s} ({_task_states(api, dag_id, r)})" for r, s in states.items())
            )
            last_print = elapsed
        assert elapsed < timeout_s, f"runs still {states} after {timeout_s}s"
        time.sleep(3)


def _task_states(api, dag_id: str, run_id: str) -> str:
    tis = api.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    return ", ".join(
        t["task_id"] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else "") + f"={t['state']}" for t in tis
    )


@contextlib.contextmanager
def airflow_api(settings: Settings):
    """An httpx client for the REST API, logged in as the admin with a JWT from ``POST /auth/token``."""
    base = local.airflow_url(settings)
    response = httpx.post(
        f"{base}/auth/token", json={"username": local.ADMIN_USER, "password": local.admin_password(settings)}
    )
    assert response.status_code == 201, response.text
    with httpx.Client(
        base_url=base, timeout=30, headers={"Authorization": f"Bearer {response.json()['access_token']}"}
    ) as client:
        yield client


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def headless_chromium():
    """Debian's Chromium, headless, through playwright: a browser to open pages with. Skips the
    test where Chromium is missing, except on CI, where `make test` installs it (a failure there)."""
    import pytest

    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing although `make test` installs it (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs it as root (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_offline(browser, url: str):
    """``url`` (a ``file://`` page) in a new page of ``browser`` with the network cut off: every
    request that is not for a local file is aborted. Returns the page and the URLs it could not
    load: asked of the network, or local files missing (none, for a page that works offline)."""
    page = browser.new_page()
    page.set_default_timeout(30_000)
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            r.abort()

    page.route("**/*", route)
    page.goto(url, wait_until="load")
    return page, failed


@contextlib.contextmanager
def otlp_metrics_receiver():
    """An OpenTelemetry collector's OTLP/HTTP metrics endpoint on a free loopback port, as an
    Airflow with ``[metrics] otel_on`` sends to: yields (its URL, the points received: a list of
    (metric name, value, attributes))."""
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    points: list[tuple[str, float, dict]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = ExportMetricsServiceRequest.FromString(body)
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            value = getattr(point, "as_int", 0) or getattr(point, "as_double", 0.0)
                            if kind in ("histogram", "exponential_histogram"):
                                value = point.sum
                            attributes = {a.key: a.value.string_value for a in point.attributes}
                            points.append((metric.name, float(value), attributes))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", points
    finally:
        server.shutdown()
        server.server_close()


def commit_meanwhile(monkeypatch, commit) -> None:
    """``commit()`` by another writer once, between a publish's write (``tables.append_new``) and
    its commit: at its ``publish.before_commit`` failpoint."""
    from wavepipe.spark_apps import tables

    pending = [commit]

    def failpoint(name: str) -> None:
        if name == "publish.before_commit" and pending:
            pending.pop()()

    monkeypatch.setattr(tables, "failpoint", failpoint)


def assert_prune_keeps_the_newest_runs_and_the_one_holding_its_group(store) -> None:
    """``RunStore.prune_runs`` on ``store``'s state (a folder or a bucket): of six runs made in
    order (a store's times may tie to the second: the ids then order them), kept=2 keeps the two
    newest and the failed run that still holds its group; the committed, the abandoned and the
    never-planned ones go, each wholly, and a second prune finds nothing more."""
    for run_id, group in [("r1", "g"), ("r2", "g2"), ("r3", "g"), ("r4", None), ("r5", "g"), ("r6", "g")]:
        if group:
            store.state.write(f"runs/{run_id}/plan.json", json.dumps({"group": group}).encode())
            store.state.write(f"runs/{run_id}/report.json", b"{}")
        else:
            store.state.write(f"runs/{run_id}/run.lock", b"")
    store.claim_group("g2", "r2")  # failed: it waits for its retry
    assert store.prune_runs(kept=2) == ["r4", "r3", "r1"]
    assert sorted(store.state.folders("runs")) == ["r2", "r5", "r6"]
    files, folders = store.state.entries("runs/r2")  # a folder's files and folders from one listing
    assert {"runs/r2/plan.json", "runs/r2/report.json"} <= {key for key, _ in files} and folders == {}
    assert store.state.read("runs/r1/report.json") is None and store.state.read("runs/r2/plan.json") is not None
    assert store.prune_runs(kept=2) == []
