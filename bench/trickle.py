"""The "trickle" benchmark: how fresh is the output when waveforms arrive one at a time?

A producer sends one waveform a second (``steady``), or ten at once every ten seconds
(``burst``), for a few minutes. For each waveform: the time from its last chunk's
acknowledgement to its row being readable in the output table (the Delta commit that adds it
exists). Two systems on the same broker, one after the other in the same invocation:

* **wavepipe, event-driven**: the shipped ingest DAG with ``watch_records=1``, run by the real
  Airflow services (``wavepipe airflow up``: api-server, scheduler, dag-processor, triggerer);
  the lag watcher in the triggerer starts a run when records arrive; each run plans, reads,
  reassembles on the warm Spark engine, validates, publishes and commits.
* **wavepipe, follow task**: the same DAG with ``follow_s`` set: the watcher starts one DAG run,
  whose ``follow`` task runs micro-batches back to back (``wavepipe.follow``) in one warm process,
  waking on each new record (the lag measured at least every ``watch_poll_s``).
* **Spark Structured Streaming**: a Kafka source, a ``foreachBatch`` reassembly into Delta
  (idempotent per batch: ``txnAppId``/``txnVersion``), a processing-time trigger of a few
  seconds (``bench/spark_streaming_app.py``), what a Spark user writes for freshness. No
  validation gate, no quarantine, no run accounting.

Each output is checked: every waveform once, its payload's sha256 as produced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from wavepipe import spark_launch, storage
from wavepipe.bench import lifecycle
from wavepipe.bench.systems import resolve_spark_kafka_jars
from wavepipe.contracts.config import Settings
from wavepipe.jars import spark_jars
from wavepipe.waiting import wait_until

log = logging.getLogger("wavepipe.bench.trickle")
HERE = Path(__file__).resolve().parent
#: The freshness goals (issue 47), seconds from the last chunk's ack to the row readable: the
#: follow task's p50 at most this, its p95 at most Spark Structured Streaming's; the event-driven
#: DAG's p50 at most this many times Structured Streaming's; the watcher's CPU per poll under this.
FOLLOW_P50_S, EVENT_P50_RATIO, WATCHER_CPU_MS = 1.0, 2.0, 50.0


@dataclass
class TrickleOptions:
    seconds: float = 180.0  # how long the producer sends, per system and mode
    modes: tuple[str, ...] = ("steady", "burst")
    systems: tuple[str, ...] = ("wavepipe", "wavepipe_follow", "spark_streaming")
    waveform_bytes: int = 256 * 1024
    burst: int = 10  # burst mode: this many waveforms at once, every burst_every_s
    burst_every_s: float = 10.0
    trigger_s: float = 2.0  # Spark Structured Streaming's processing-time trigger
    watch_poll_s: float = 1.0  # wavepipe's lag watcher
    drain_s: float = 300.0  # how long to wait for the last rows after the last send
    warmup: int = 3  # waveforms each system reads before the measured ones (not measured)
    watcher_load_s: float = 120.0  # how long the triggerer's CPU is measured, with and without a watcher
    command: str = "wavepipe bench --trickle"

    def schedule(self, mode: str) -> list[float]:
        """Send times (seconds from the start) of each waveform in ``mode``."""
        if mode == "steady":
            return [float(i) for i in range(int(self.seconds))]
        if mode == "burst":
            rounds = max(1, int(self.seconds // self.burst_every_s))
            return [r * self.burst_every_s for r in range(rounds) for _ in range(self.burst)]
        raise ValueError(f"unknown trickle mode {mode!r}: steady or burst")


@dataclass
class Sent:
    waveform_id: str
    checksum: str
    acked: float  # wall-clock seconds (time.time()) when every chunk was acknowledged


class DeltaWatcher:
    """Watches a Delta table's log (a local path or an object store URI): for each waveform id,
    when the commit that added its row appeared, and the rows' checksums and payload sha256 (read
    from the added Parquet files). A commit is read once it is listed: Delta writes its data files
    before the log entry that adds them, and the entry whole (a rename or a conditional put).
    A scan that fails (a store not answering, a bug) ends the watch: ``wait_for`` raises with
    the reason, rather than waiting out its timeout."""

    def __init__(self, table: str | Path, poll_s: float = 0.1):
        self.table, self.poll_s = str(table), poll_s
        self.seen: dict[str, list[float]] = {}  # waveform id -> time of each commit adding it
        self.bad: list[str] = []  # rows whose payload does not hash to their checksum
        self.checksums: dict[str, str] = {}
        self.commits = 0
        self.error: str | None = None
        self._done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delta-watcher", daemon=True)

    def __enter__(self) -> DeltaWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception as exc:
                log.exception("delta watcher on %s stopped", self.table)
                self.error = f"the Delta log of {self.table} could not be read: {type(exc).__name__}: {exc}"
                return
            self._stop.wait(self.poll_s)

    def scan(self) -> None:

        logdir = storage.join(self.table, "_delta_log")
        for name in storage.list_names(logdir):
            if name in self._done or not (name.endswith(".json") and name[:-5].isdigit()):
                continue
            now = time.time()
            entry = storage.read_text(storage.join(logdir, name))
            actions = [json.loads(line) for line in entry.splitlines() if '"add"' in line]
            # a compaction's adds rewrite rows already seen (dataChange false): not new rows
            adds = [a["add"]["path"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
            self._read(adds, now)
            self._done.add(name)
            self.commits += 1

    def _read(self, paths: list[str], when: float) -> None:
        import hashlib

        for path in paths:
            uri = storage.join(self.table, urllib.parse.unquote(path))
            table = storage.read_parquet(uri, columns=["waveform_id", "checksum", "payload"])
            for wid, checksum, payload in zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True):
                self.seen.setdefault(wid, []).append(when)
                self.checksums[wid] = checksum
                if "sha256:" + hashlib.sha256(payload).hexdigest() != checksum:
                    self.bad.append(wid)

    def wait_for(self, ids: list[str], timeout_s: float, what: str) -> bool:
        began, said = time.monotonic(), 0.0
        while True:
            if self.error:
                raise RuntimeError(f"{what}: {self.error}")
            missing = [i for i in ids if i not in self.seen]
            if not missing:
                return True
            elapsed = time.monotonic() - began
            if elapsed >= timeout_s:
                log.warning(
                    "%s: %d of %d waveforms not in the table after %.0f s", what, len(missing), len(ids), elapsed
                )
                return False
            if elapsed - said >= 15:
                log.info(
                    "  %s: %d of %d waveforms readable after %.0f s", what, len(ids) - len(missing), len(ids), elapsed
                )
                said = elapsed
            time.sleep(0.2)


def _produce(settings: Settings, topic: str, schedule: list[float], options: TrickleOptions, tag: str) -> list[Sent]:
    """Send the waveforms at their times; each send waits for its chunks' acknowledgement."""
    from wavepipe.consumers.producer import ChunkProducer, demo_waveforms

    waveforms = list(demo_waveforms(len(schedule), seed=7, batch=tag, target_bytes=options.waveform_bytes))
    producer = ChunkProducer(settings.replace(topic=topic))
    sent: list[Sent] = []
    began, said = time.monotonic(), 0.0
    i = 0
    while i < len(schedule):
        wait = began + schedule[i] - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        batch = [i]
        while i + len(batch) < len(schedule) and schedule[i + len(batch)] == schedule[i]:
            batch.append(i + len(batch))
        produced = [producer.send_waveform(waveforms[j]) for j in batch]
        producer.flush()
        acked = time.time()
        sent += [Sent(p.waveform_id, p.checksum, acked) for p in produced]
        i += len(batch)
        if time.monotonic() - said >= 15:
            log.info("  sent %d of %d waveforms (%.0f s)", len(sent), len(schedule), time.monotonic() - began)
            said = time.monotonic()
    return sent


def latencies(sent: list[Sent], watcher: DeltaWatcher) -> dict:
    """Freshness of each sent waveform, and the exactly-once check."""
    lat = [watcher.seen[s.waveform_id][0] - s.acked for s in sent if s.waveform_id in watcher.seen]
    missing = [s.waveform_id for s in sent if s.waveform_id not in watcher.seen]
    doubled = [s.waveform_id for s in sent if len(watcher.seen.get(s.waveform_id, [])) > 1]
    wrong = [
        s.waveform_id
        for s in sent
        if s.waveform_id in watcher.checksums and watcher.checksums[s.waveform_id] != s.checksum
    ]
    stats = stats_of(lat)
    return {
        **stats,
        "waveforms": len(sent),
        "readable": len(lat),
        "missing": len(missing),
        "doubled": len(doubled),
        "checksum_mismatch": len(wrong) + len([w for w in watcher.bad if w in {s.waveform_id for s in sent}]),
        "exactly_once": not missing and not doubled and not wrong and not watcher.bad,
        "series": [
            [round(s.acked - sent[0].acked, 3), round(watcher.seen[s.waveform_id][0] - s.acked, 3)]
            for s in sent
            if s.waveform_id in watcher.seen
        ],
    }


def stats_of(values: list[float]) -> dict:
    if not values:
        return {"p50_s": None, "p95_s": None, "max_s": None, "mean_s": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {
        "p50_s": round(statistics.median(ordered), 2),
        "p95_s": round(p95, 2),
        "max_s": round(ordered[-1], 2),
        "mean_s": round(statistics.fmean(ordered), 2),
    }


# --- wavepipe, event-driven through the real Airflow services ------------------------------------


def _wavepipe(settings: Settings, options: TrickleOptions, work: Path, stamp: str) -> dict:
    return _wavepipe_system(settings, options, work, stamp)


def _wavepipe_follow(settings: Settings, options: TrickleOptions, work: Path, stamp: str) -> dict:
    """As ``_wavepipe``, the DAG's task a follow loop long enough to cover every mode's sends."""
    follow_s = len(options.modes) * (options.seconds + options.drain_s) + 300
    return _wavepipe_system(settings, options, work, stamp, follow_s=follow_s)


def _wavepipe_system(
    settings: Settings, options: TrickleOptions, work: Path, stamp: str, follow_s: float = 0.0
) -> dict:
    """One home, topic and group with its own Spark engine and Airflow services, the modes sent
    one after the other (a warm-up first): their ``results``, and for the event-driven DAG the
    ``watcher_load`` measured on its idle topic before them."""
    system = "wavepipe_follow" if follow_s else "wavepipe"
    s = system_settings(settings, work / system, f"trickle-{system}-{stamp}", follow_s, options.watch_poll_s)
    used = {}

    def idle_load(api: AirflowApi) -> None:  # a paused DAG's watcher does not run
        if not follow_s and options.watcher_load_s:
            wait_until(api.has_dag, 180, "the ingest DAG to be parsed")
            used["not-watching"] = _triggerer_cpu(s, options.watcher_load_s)

    with airflow_running(s, system, before_unpause=idle_load) as api:
        if used:
            used["watching"] = _triggerer_cpu(s, options.watcher_load_s)
        with DeltaWatcher(s.output_table) as watcher:
            warm = _produce(s, s.topic, [0.0] * options.warmup, options, f"warm-{stamp}")
            watcher.wait_for([w.waveform_id for w in warm], options.drain_s, f"{system} warm-up")
            results = [_wavepipe_mode(s, options, api, watcher, stamp, mode) for mode in options.modes]
    return {"results": results, "watcher_load": _load(used, options) if used else None}


def system_settings(settings: Settings, home: Path, name: str, follow_s: float, watch_poll_s: float) -> Settings:
    """The settings of a measured wavepipe: its own ``home``, topic and group ``name``, the ingest
    DAG's watcher starting a run on any record (``follow_s``: its follow task), its own Airflow port
    and Spark Connect engine."""
    from wavepipe.local.kafka import free_port

    return settings.replace(
        home=home,
        topic=name,
        group=name,
        follow_s=follow_s,
        new_group_start="earliest",
        watch_records=1,
        watch_poll_s=watch_poll_s,
        airflow_port=free_port(),
        spark_remote="",
        spark_engine="connect",
        spark_connect_port=0,
    )


@contextlib.contextmanager
def airflow_running(s: Settings, system: str, before_unpause=None) -> Iterator[AirflowApi]:
    """The topic of ``s``, its home's Spark engine and Airflow services started, the ingest DAG
    unpaused (``before_unpause(api)`` first) with its lag watcher running and no run in flight;
    everything it started is stopped however the block ends."""
    from wavepipe.consumers.kafka_admin import ensure_topic
    from wavepipe.local import airflow as local
    from wavepipe.local.engine_server import LocalEngine
    from wavepipe.pipeline import run_once

    ensure_topic(s, partitions=2)
    log.info("%s: starting this home's Spark engine and Airflow", system)
    try:
        LocalEngine(s).up()
        run_once(s)  # the group's offsets exist; nothing to read yet
        if local.up(s, out=log.info) != 0:
            raise RuntimeError(f"`wavepipe airflow up` failed; see {s.airflow_home / 'logs'}")
        api = AirflowApi(s)
        if before_unpause:
            before_unpause(api)
        api.call("PATCH", "/api/v2/dags/wavepipe_ingest", {"is_paused": False})
        triggerer = local.log_file(s, "triggerer")
        wait_until(lambda: f"watching group {s.group!r}" in triggerer.read_text(), 180, "the lag watcher to start")
        wait_until(lambda: api.settled(), 300, "any run at unpause to finish")
        yield api
    finally:
        local.down(s, out=log.info)
        LocalEngine(s).down(force=True)


def _wavepipe_mode(
    s: Settings, options: TrickleOptions, api: AirflowApi, watcher: DeltaWatcher, stamp: str, mode: str
) -> dict:
    """One mode's sends on a running system, its freshness and the runs that served it."""
    system = "wavepipe_follow" if s.follow_s else "wavepipe"
    if not s.follow_s:  # a follow task keeps running: its loop takes the next waveforms
        wait_until(lambda: api.settled(), 300, "the earlier runs to finish")
    runs_before, commits_before = {r["dag_run_id"] for r in api.runs()}, watcher.commits
    log.info("%s (%s): sending for %.0f s", system, mode, options.seconds)
    began = time.time()
    sent = _produce(s, s.topic, options.schedule(mode), options, f"{mode}-{stamp}")
    watcher.wait_for([w.waveform_id for w in sent], options.drain_s, f"{system} {mode}")
    ended = max(watcher.seen.get(w.waveform_id, [time.time()])[0] for w in sent)
    if not s.follow_s:
        wait_until(lambda: api.settled(), 300, "this mode's runs to finish")
    runs = [r for r in api.runs() if r["dag_run_id"] not in runs_before]
    result = latencies(sent, watcher)
    # a follow task describes its micro-batches after their commits, every few seconds: wait for that
    wait_until(lambda: _described(_run_reports(s, began, ended)), 60, "this mode's runs to be described")
    reports = _run_reports(s, began, ended)
    minutes = max(1e-9, (ended - began) / 60)
    result.update(
        system=system,
        mode=mode,
        runs=len(reports),
        runs_per_minute=round(len(reports) / minutes, 2),
        dag_runs=len(runs),
        run_types=sorted({r["run_type"] for r in runs}),
        failed_runs=len([r for r in runs if r["state"] == "failed"]),
        table_commits=watcher.commits - commits_before,
        stages=_stage_seconds(reports, sent, watcher),
    )
    log.info("%s (%s): %s", system, mode, _line(result))
    return result


def _run_reports(settings: Settings, began: float, ended: float) -> list[dict]:
    """The reports of the wavepipe runs (a DAG run's, or a follow task's micro-batches) planned
    between ``began`` and ``ended`` (wall-clock seconds), whenever their reports were written
    (a description after the commit writes one again)."""
    reports = []
    for path in sorted(settings.reports_dir.glob("*.json")):
        if path.stat().st_mtime >= began:
            report = json.loads(path.read_text())
            planned = datetime.fromisoformat(report["planned_at"]).timestamp() if report.get("planned_at") else None
            if not report.get("skipped") and planned is not None and began <= planned <= ended:
                reports.append(report)
    return reports


def _described(reports: list[dict]) -> bool:
    """Whether every published run of ``reports`` was described (its ``describe`` timing)."""
    return all("describe" in r["timings_s"] for r in reports if (r.get("validation") or {}).get("published"))


#: Where a run's time goes, in the order it goes there: a label and the key of the run's report
#: (``timings_s``) that times it. The row is readable after "publish".
STEPS = {
    "plan": "plan",
    "consume": "consume_max",
    "Spark job": "spark_spark_app_s",
    "expectations": "validate_expectations_s",
    "publish": "publish_total_s",
    "commit, report": "commit",
    "describe (plots, Data Docs; after the commit)": "describe",
}
#: The time from a waveform's ack to the start of the run that published it.
WAITED = "waiting for a run"


def _stage_seconds(reports: list[dict], sent: list[Sent], watcher: DeltaWatcher) -> dict[str, float | None]:
    """Where the time went: the median seconds a waveform waited for the run that published it,
    then each step's median seconds over ``reports``."""
    out: dict[str, float | None] = {WAITED: _median(_waits(reports, sent, watcher))}
    for label, key in STEPS.items():
        out[label] = _median([r["timings_s"][key] for r in reports if key in r["timings_s"]])
    return out


def _waits(reports: list[dict], sent: list[Sent], watcher: DeltaWatcher) -> list[float]:
    """Per waveform readable, from its ack to the plan of the run whose publish made it readable
    (the latest run planned before the commit that added it)."""
    planned = sorted(datetime.fromisoformat(r["planned_at"]).timestamp() for r in reports)
    waits = []
    for s in sent:
        added = watcher.seen.get(s.waveform_id, [None])[0]
        before = [t for t in planned if added is not None and t <= added]
        if before:
            waits.append(max(0.0, before[-1] - s.acked))
    return waits


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


class AirflowApi:
    def __init__(self, settings: Settings):
        from wavepipe.local import airflow as local

        self.local, self.settings = local, settings
        self.token = local.api_token(settings)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        status, answer = self.local._http_json(
            self.local.airflow_url(self.settings) + path, method=method, body=body, token=self.token
        )
        if status >= 300 or not isinstance(answer, dict):
            raise RuntimeError(f"{method} {path} answered {status}: {answer}")
        return answer

    def runs(self) -> list[dict]:
        return self.call("GET", "/api/v2/dags/wavepipe_ingest/dagRuns?limit=1000&order_by=start_date")["dag_runs"]

    def has_dag(self) -> bool:
        """Whether the ingest DAG has been parsed (the API knows it)."""
        status, _ = self.local._http_json(
            self.local.airflow_url(self.settings) + "/api/v2/dags/wavepipe_ingest", token=self.token
        )
        return status == 200

    def settled(self) -> bool:
        """No run of the DAG queued or running (unpausing it starts none: its clock's first run is
        at the next quarter hour)."""
        return all(r["state"] not in ("queued", "running") for r in self.runs())


def _triggerer_cpu(s: Settings, seconds: float) -> float:
    """CPU seconds the triggerer's processes use over ``seconds`` (the topic idle)."""
    from wavepipe.bench.monitor import tree_cpu_s
    from wavepipe.local import airflow as local

    pid = local.running(s)["triggerer"]
    before = tree_cpu_s(pid)
    log.info("the triggerer's CPU over %.0f s ...", seconds)
    time.sleep(seconds)
    return round(tree_cpu_s(pid) - before, 2)


def _load(used: dict[str, float], options: TrickleOptions) -> dict:
    """The lag watcher's own cost in the triggerer, from its CPU with the ingest DAG watching
    (its watcher measuring at least every ``watch_poll_s``) and paused (no watcher), side by side."""
    seconds, poll_s = options.watcher_load_s, options.watch_poll_s
    extra = used["watching"] - used["not-watching"]
    return {
        "seconds": seconds,
        "poll_s": poll_s,
        "triggerer_cpu_s": used,
        "watcher_cpu_ms_per_poll": round(1000 * extra / (seconds / poll_s), 1),
        "watcher_core_percent": round(100 * extra / seconds, 2),
        "broker_requests_per_poll": 2,
    }


# --- Spark Structured Streaming ------------------------------------------------------------------


def _spark_streaming(settings: Settings, options: TrickleOptions, work: Path, stamp: str) -> dict:
    """One streaming query (``spark_streaming_app.py``, spark-submit) on a topic of its own, the
    modes sent one after the other (a warm-up first); stopped with its stop file however it ends."""
    from wavepipe.consumers.kafka_admin import ensure_topic

    kafka_jars = sorted(resolve_spark_kafka_jars(settings).glob("*.jar"))
    jars = ",".join(str(j) for j in [*spark_jars(settings.jars_dir), *kafka_jars])
    s = settings.replace(spark_conf={**settings.spark_conf, "spark.jars": jars}, spark_engine="submit")
    topic, folder = f"trickle-streaming-{stamp}", work / "streaming"
    ensure_topic(s, topic, partitions=2)
    folder.mkdir(parents=True, exist_ok=True)
    app = _StreamingApp(s, topic, folder, options.trigger_s)
    try:
        app.start()
        with DeltaWatcher(folder / "table") as watcher:
            warm = _produce(s, topic, [0.0] * options.warmup, options, f"swarm-{stamp}")
            watcher.wait_for([w.waveform_id for w in warm], options.drain_s, "streaming warm-up")
            return {"results": [_streaming_mode(s, options, topic, watcher, stamp, mode) for mode in options.modes]}
    finally:
        app.stop()


class _StreamingApp:
    """``spark_streaming_app.py`` through spark-submit in a thread: started until its query runs,
    stopped by its stop file."""

    def __init__(self, settings: Settings, topic: str, folder: Path, trigger_s: float):
        self.settings, self.topic, self.folder, self.trigger_s = settings, topic, folder, trigger_s
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._submit, name="spark-streaming", daemon=True)

    def _submit(self) -> None:

        f = self.folder
        try:
            spark_launch.submit(
                self.settings,
                HERE / "spark_streaming_app.py",
                *("--bootstrap", self.settings.bootstrap_servers, "--topic", self.topic, "--out", str(f / "table")),
                *("--checkpoint", str(f / "checkpoint"), "--trigger-s", str(self.trigger_s)),
                *("--ready", str(f / "ready"), "--stop", str(f / "stop")),
            )
        except BaseException as exc:
            self.errors.append(exc)

    def start(self) -> None:
        self.thread.start()
        ready = self.folder / "ready"
        wait_until(lambda: ready.exists() or not self.thread.is_alive(), 300, "the streaming query to start")
        if self.errors or not self.thread.is_alive():
            raise RuntimeError(f"the streaming app stopped before its query started: {self.errors}")

    def stop(self) -> None:
        (self.folder / "stop").touch()
        if self.thread.is_alive():
            self.thread.join(timeout=120)


def _streaming_mode(
    s: Settings, options: TrickleOptions, topic: str, watcher: DeltaWatcher, stamp: str, mode: str
) -> dict:
    """One mode's sends to the running query, its freshness and micro-batches."""
    commits_before = watcher.commits
    log.info("Spark Structured Streaming (%s): sending for %.0f s", mode, options.seconds)
    began = time.time()
    sent = _produce(s, topic, options.schedule(mode), options, f"s{mode}-{stamp}")
    watcher.wait_for([w.waveform_id for w in sent], options.drain_s, f"streaming {mode}")
    ended = max(watcher.seen.get(w.waveform_id, [time.time()])[0] for w in sent)
    result = latencies(sent, watcher)
    batches = watcher.commits - commits_before
    result.update(
        system="spark_streaming",
        mode=mode,
        runs=batches,
        runs_per_minute=round(batches / max(1e-9, (ended - began) / 60), 2),
        trigger_s=options.trigger_s,
        table_commits=batches,
    )
    log.info("Spark Structured Streaming (%s): %s", mode, _line(result))
    return result


def _line(r: dict) -> str:
    return (
        f"p50 {r['p50_s']} s, p95 {r['p95_s']} s, max {r['max_s']} s over {r['readable']}/{r['waveforms']} waveforms; "
        f"{r['runs']} runs or micro-batches ({r['runs_per_minute']}/min); exactly once: {r['exactly_once']}"
    )


LABELS = {
    "wavepipe": "wavepipe, event-driven (Airflow)",
    "wavepipe_follow": "wavepipe, follow task (Airflow)",
    "spark_streaming": "Spark Structured Streaming",
}


def run_trickle(settings: Settings, options: TrickleOptions) -> dict:
    from wavepipe.bench.runner import run_header
    from wavepipe.local.kafka import LocalKafka

    began = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    work = settings.home / "bench" / f"trickle-{stamp}"
    broker = LocalKafka.from_settings(settings)
    log.info("%s", lifecycle.start("the Kafka broker", broker))
    measured: list[dict] = []
    load = None
    runners = {"wavepipe": _wavepipe, "wavepipe_follow": _wavepipe_follow, "spark_streaming": _spark_streaming}
    for system in options.systems:
        out = runners[system](settings, options, work, stamp)
        measured += out["results"]
        load = out.get("watcher_load") or load
    return {
        "watcher_load": load,
        **run_header("trickle", stamp, began, options),
        "results": measured,
    }


def goals(result: dict) -> list[tuple[str, bool | None, str]]:
    """Each wavepipe row against its goal (``FOLLOW_P50_S``, ``EVENT_P50_RATIO``; exactly once),
    beside Spark Structured Streaming's row of the same mode, and the watcher's load."""
    out = []
    for r in (r for r in result["results"] if r["system"].startswith("wavepipe")):
        s = next((x for x in result["results"] if x["system"] == "spark_streaming" and x["mode"] == r["mode"]), None)
        name = f"{LABELS[r['system']]} {r['mode']}"
        if r["system"] == "wavepipe_follow":
            known = r["p50_s"] is not None and s is not None and s["p95_s"] is not None
            out.append(
                (
                    f"{name}: p50 <= {FOLLOW_P50_S:g} s, p95 <= Spark Structured Streaming's, exactly once",
                    (r["p50_s"] <= FOLLOW_P50_S and r["p95_s"] <= s["p95_s"] and r["exactly_once"]) if known else None,
                    f"p50 {r['p50_s']} s, p95 {r['p95_s']} s against {s and s['p95_s']} s, exactly once: {r['exactly_once']}",
                )
            )
        else:
            ratio = r["p50_s"] / s["p50_s"] if s and r["p50_s"] and s["p50_s"] else None
            out.append(
                (
                    f"{name}: p50 <= {EVENT_P50_RATIO:g}x Spark Structured Streaming's, exactly once",
                    None if ratio is None else (ratio <= EVENT_P50_RATIO and r["exactly_once"]),
                    f"p50 {r['p50_s']} s, {'?' if ratio is None else f'{ratio:.1f}'}x, exactly once: {r['exactly_once']}",
                )
            )
    load = result.get("watcher_load")
    if load:
        ms = load["watcher_cpu_ms_per_poll"]
        out.append((f"the lag watcher's CPU per poll < {WATCHER_CPU_MS:g} ms", ms < WATCHER_CPU_MS, f"{ms} ms"))
    return out


def to_markdown(result: dict, chart_name: str = "trickle.png") -> str:
    o, m = result["options"], result["machine"]
    lines = [
        "# Trickle: freshness of event-driven runs",
        "",
        f"`{o['command']}` at wavepipe commit {m.get('wavepipe_commit') or '?'}, started {result['started']} UTC, "
        f"{result['seconds']:.0f} s in all.",
        "",
        f"**Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}; Python {m['python']}; "
        f"Kafka {m['kafka']} (local KRaft broker); pyspark {m['pyspark']}, delta-spark {m['delta_spark']}; "
        f"Airflow services on sqlite, LocalExecutor with 2 slots.",
        "",
        f"Each waveform (~{o['waveform_bytes'] // 1024} KiB) is produced whole and waits for its chunks' acks; "
        "its freshness is the time from that ack to the Delta commit that makes its row readable. "
        f"*steady*: one waveform a second for {o['seconds']:.0f} s; *burst*: {o['burst']} at once every "
        f"{o['burst_every_s']:g} s. wavepipe: the ingest DAG with `watch_records=1`, `watch_poll_s={o['watch_poll_s']:g}`, "
        "through the real Airflow services and the warm Spark engine, validation included: a DAG run per run "
        "(event-driven), or one DAG run whose `follow` task runs micro-batches back to back (`follow_s`, the "
        "follow task). Spark Structured "
        f"Streaming: Kafka source, `foreachBatch` reassembly into Delta, trigger every {o['trigger_s']:g} s. "
        f"Both after {o['warmup']} warm-up waveforms, one system at a time.",
        "",
        f"![freshness]({chart_name})",
        "",
        "## Goals",
        "",
    ]
    for name, met, numbers in goals(result):
        lines.append(f"- {name}: **{'n/a' if met is None else ('met' if met else 'missed')}** ({numbers})")
    lines += [
        "",
        "## Results",
        "",
        "| system | mode | waveforms | p50 s | p95 s | max s | runs or batches | per minute | exactly once |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["results"]:
        once = (
            "yes"
            if r["exactly_once"]
            else f"NO: {r['missing']} missing, {r['doubled']} doubled, {r['checksum_mismatch']} wrong"
        )
        lines.append(
            f"| {LABELS[r['system']]} | {r['mode']} | {r['readable']}/{r['waveforms']} | {r['p50_s']} | {r['p95_s']} | "
            f"{r['max_s']} | {r['runs']} | {r['runs_per_minute']} | {once} |"
        )
    lines += _stages_table(result["results"])
    load = result.get("watcher_load")
    if load:
        used = load["triggerer_cpu_s"]
        lines += [
            "",
            "## The watcher's own load",
            "",
            f"On an idle topic, over {load['seconds']:.0f} s, the triggerer's processes used {used['watching']} CPU s with "
            f"the ingest DAG's watcher measuring at least every {load['poll_s']:g} s, and {used['not-watching']} s with the DAG "
            f"paused (no watcher): about {load['watcher_cpu_ms_per_poll']} ms of CPU per poll, "
            f"{load['watcher_core_percent']}% of one core. Each poll is {load['broker_requests_per_poll']} small requests to "
            "the broker (the group's committed offsets, the partitions' last stable offsets) on clients kept open, "
            "then a long poll for the next record; the topic's partitions once a minute.",
        ]
    ratios = []
    for mode in o["modes"]:
        s = next((r for r in result["results"] if r["system"] == "spark_streaming" and r["mode"] == mode), None)
        for w in (r for r in result["results"] if r["system"].startswith("wavepipe") and r["mode"] == mode):
            if s and w["p50_s"] and s["p50_s"]:
                ratios.append(
                    f"- {mode}: {LABELS[w['system']]}'s p50 is {w['p50_s'] / s['p50_s']:.1f}x Spark Structured "
                    "Streaming's"
                )
    if ratios:
        lines += ["", "## Side by side", "", *ratios]
    return "\n".join(lines) + "\n"


def _stages_table(results: list[dict]) -> list[str]:
    """Where a wavepipe run's time went, per system and mode (medians; none without reports)."""
    rows = [r for r in results if r.get("stages")]
    if not rows:
        return []
    labels = [WAITED, *STEPS]
    return [
        "",
        "## Where a run's time goes",
        "",
        "Medians, from the runs' own reports: how long a waveform waited from its ack for the run that "
        "published it to be planned, then each step of a run. A row is readable once *publish* is done; "
        "*commit, report* comes after, before the next run can start; *describe* after that: in the event-driven "
        "DAG's task before it ends, in the follow task in a thread of its own, for the micro-batches of the last "
        "few seconds at once (each of them shows the time of that whole making).",
        "",
        "| system | mode | " + " | ".join(f"{label} s" for label in labels) + " |",
        "|---|---|" + "---:|" * len(labels),
        *(
            f"| {LABELS[r['system']]} | {r['mode']} | "
            + " | ".join("-" if r["stages"].get(label) is None else f"{r['stages'][label]:.3f}" for label in labels)
            + " |"
            for r in rows
        ),
    ]


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["options"]["modes"]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for r in (r for r in result["results"] if r["mode"] == mode):
            xs, ys = zip(*r["series"], strict=True) if r["series"] else ((), ())
            ax.plot(xs, ys, ".", markersize=4, label=f"{LABELS[r['system']]} (p50 {r['p50_s']} s)")
        ax.axhline(
            FOLLOW_P50_S, color="grey", linestyle="--", linewidth=0.8, label=f"follow goal p50 {FOLLOW_P50_S:g} s"
        )
        ax.set_title(f"{mode}: seconds from ack to readable")
        ax.set_xlabel("send time, s")
        ax.set_ylabel("freshness, s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save(result: dict, out_dir: Path) -> list[Path]:
    """trickle.json, .png and .md in ``out_dir`` (a chart that fails to draw loses nothing)."""
    from wavepipe.bench.results import save_page

    return save_page(result, out_dir, "trickle", to_markdown, lambda r, path: chart(r, path))
