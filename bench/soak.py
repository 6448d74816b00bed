"""The soak: the ingest DAG's follow task through the real Airflow services for N minutes.

A producer sends a waveform every few seconds and a burst now and then; every so often a send is
hostile instead (a waveform whose payload was changed after its checksum was taken, which must be
quarantined, or a record that is not a chunk, which must be dead-lettered). Half-way, the
maintenance DAG compacts and vacuums the tables while the follow task goes on.

Every ``sample_s`` it records each process role's RSS (the Airflow services, the follow task's
processes, the Spark engine, the broker) and the run state's and the tables' files; per minute,
the freshness of what was sent in it (last chunk acknowledged to row readable,
``trickle.DeltaWatcher``).

The result (``soak.json``): ``minutes``; ``growth_after_warmup`` per role (its RSS in the last
window over its RSS in the first window after the warm-up, minus one); ``exactly_once`` (every
good waveform once and bit-exact, every hostile one quarantined or dead-lettered and none
published); ``state_bounded`` (the run state's files grew in the last window by at most a tenth of
what they grew in the first); ``freshness_ratio`` (the p95 of what was sent in the last window of
sending over that of the first window after the warm-up); and the series behind them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from wavepipe.bench import lifecycle, trickle
from wavepipe.contracts.config import Settings
from wavepipe.maintenance import table_paths
from wavepipe.waiting import WaitError, wait_until

log = logging.getLogger("wavepipe.bench.soak")
#: The soak's goals (issue 62): each role's RSS grows less than this after the warm-up, and the
#: freshness p95 of the last window is within this many times the first window's.
GROWTH_MAX, FRESHNESS_RATIO = 0.10, 1.2
#: The run state's folders under a home (``wavepipe.state``, ``RunStore``).
STATE_FOLDERS = ("runs", "groups", "reports", "dead-letters", "staging", "gx")
MAINTENANCE_DAG = "wavepipe_maintenance"


@dataclass
class SoakOptions:
    minutes: float = 30.0
    every_s: float = 2.0  # one waveform every this many seconds
    burst: int = 10  # and this many at once every burst_every_s
    burst_every_s: float = 120.0
    hostile_every: int = 15  # every Nth waveform is sent hostile: a changed payload, a junk record, in turn
    waveform_bytes: int = 256 * 1024
    sample_s: float = 10.0
    warmup_minutes: float = 5.0  # RSS growth counts from its end
    window_minutes: float = 5.0  # growth and freshness compare the first and last windows after it
    watch_poll_s: float = 1.0
    drain_s: float = 300.0
    command: str = "wavepipe bench --soak"

    def windows(self) -> tuple[float, float]:
        """(warm-up, window) in seconds, scaled down for a soak shorter than 15 minutes."""
        seconds = self.minutes * 60
        warmup = min(self.warmup_minutes * 60, seconds / 3)
        return warmup, min(self.window_minutes * 60, (seconds - warmup) / 2)

    def schedule(self) -> list[tuple[float, int]]:
        """(seconds from the start, waveforms sent then): one every ``every_s``, a burst at each
        multiple of ``burst_every_s`` after the start."""
        out = []
        for k in range(int(self.minutes * 60 / self.every_s)):
            at = k * self.every_s
            burst = k and int(at // self.burst_every_s) > int((at - self.every_s) // self.burst_every_s)
            out.append((at, self.burst if burst else 1))
        return out


@dataclass
class Hostile:
    waveform_id: str
    kind: str  # "changed_payload" (quarantined) or "junk" (dead-lettered)


def run_soak(settings: Settings, options: SoakOptions) -> dict:
    """The soak on this home's broker, in a home of its own under ``<home>/bench``."""
    from wavepipe.bench.runner import run_header
    from wavepipe.local.kafka import LocalKafka

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    broker = LocalKafka.from_settings(settings)
    log.info("%s", lifecycle.start("the Kafka broker", broker))
    follow_s = options.minutes * 60 + options.drain_s + 300
    home = settings.home / "bench" / f"soak-{stamp}"
    s = trickle.system_settings(settings, home, f"soak-{stamp}", follow_s, options.watch_poll_s)
    began = time.monotonic()
    with trickle.airflow_running(s, "soak") as api, trickle.DeltaWatcher(s.output_table) as watcher:
        with Sampler(s, api, broker.pid(), options.sample_s) as sampler:
            sent, hostile, maintenance = _send(s, options, stamp, api)
            watcher.wait_for([w.waveform_id for w in sent], options.drain_s, "the soak's last waveforms")
        if sampler.error:
            raise RuntimeError(sampler.error)
        maintenance = _maintenance_outcome(api, maintenance, options.drain_s)
        checked = _checked(s, sent, hostile, watcher)
    return {
        **run_header("soak", stamp, began, options),
        "minutes": options.minutes,
        **summary(options, sampler.samples, checked),
        "maintenance": maintenance,
    }


def _send(s: Settings, options: SoakOptions, stamp: str, api) -> tuple[list[trickle.Sent], list[Hostile], dict]:
    """The producer's side: each send at its time (``schedule``), the maintenance DAG triggered
    half-way; the good waveforms sent, the hostile ones, and the maintenance run's id."""
    from wavepipe.consumers.producer import ChunkProducer, demo_waveforms

    producer, raw = ChunkProducer(s), _raw_producer(s)
    sent: list[trickle.Sent] = []
    hostile: list[Hostile] = []
    maintenance: dict = {}
    began, n = time.monotonic(), 0
    for k, (at, count) in enumerate(options.schedule()):
        time.sleep(max(0.0, began + at - time.monotonic()))
        good = []
        for w in demo_waveforms(count, seed=k, batch=f"soak-{stamp}-{k}", target_bytes=options.waveform_bytes):
            n += 1
            if n % options.hostile_every:
                good.append(producer.send_waveform(w))
            else:
                hostile.append(_send_hostile(s, raw, w, len(hostile)))
        producer.flush()
        if raw.flush(60):
            raise RuntimeError("the soak's hostile records were not acknowledged in 60 s")
        acked = time.time()
        sent += [trickle.Sent(p.waveform_id, p.checksum, acked) for p in good]
        if not maintenance and at >= options.minutes * 30:
            maintenance = _start_maintenance(api, at)
        if k % 30 == 0:
            log.info(
                "  soak: %d waveforms and %d hostile sent (%.0f of %.0f s)",
                len(sent),
                len(hostile),
                at,
                options.minutes * 60,
            )
    return sent, hostile, maintenance


def _raw_producer(s: Settings):
    from wavepipe.consumers.kafka_admin import new_producer

    return new_producer(s.kafka_config(**{"enable.idempotence": True, "acks": "all"}))


def _send_hostile(s: Settings, raw, w, number: int) -> Hostile:
    """``w`` sent hostile: its chunks with one payload byte changed after the checksum was taken
    (even ``number``), or a record with no chunk headers in its place (odd)."""
    from wavepipe.consumers.producer import facts_of
    from wavepipe.contracts.protocol import split_waveform

    if number % 2:
        raw.produce(s.topic, value=b"not a chunk: " + w.waveform_id.encode(), key=w.waveform_id.encode())
        return Hostile(w.waveform_id, "junk")
    records = split_waveform(w.samples, chunk_size=s.chunk_size, **facts_of(w))
    for i, (key, headers, value) in enumerate(records):
        if i == 0:
            value = bytes([value[0] ^ 0xFF]) + value[1:]
        raw.produce(s.topic, value=value, key=key, headers=headers)
    return Hostile(w.waveform_id, "changed_payload")


def _start_maintenance(api, at: float) -> dict:
    """The maintenance DAG unpaused (its schedule starts no run now) and triggered."""
    api.call("PATCH", f"/api/v2/dags/{MAINTENANCE_DAG}", {"is_paused": False})
    run = api.call("POST", f"/api/v2/dags/{MAINTENANCE_DAG}/dagRuns", {"logical_date": None})
    log.info("  soak: the maintenance DAG triggered at %.0f s (%s)", at, run["dag_run_id"])
    return {"dag_run_id": run["dag_run_id"], "triggered_at_s": round(at, 1)}


def _maintenance_outcome(api, maintenance: dict, timeout_s: float) -> dict | None:
    """The maintenance run's state once it ended (or as it is after ``timeout_s``), and its
    seconds from start to end as Airflow recorded them (None while it has not ended)."""
    if not maintenance:
        return None
    path = f"/api/v2/dags/{MAINTENANCE_DAG}/dagRuns/{maintenance['dag_run_id']}"
    with contextlib.suppress(WaitError):  # said by its state: the soak's numbers are kept either way
        wait_until(lambda: api.call("GET", path)["state"] in ("success", "failed"), timeout_s, "the maintenance run")
    run = api.call("GET", path)
    ran = [datetime.fromisoformat(run[k]) for k in ("start_date", "end_date") if run.get(k)]
    return {
        "dag_run_id": maintenance["dag_run_id"],
        "triggered_at_s": maintenance["triggered_at_s"],
        "state": run["state"],
        "seconds": round((ran[1] - ran[0]).total_seconds(), 1) if len(ran) == 2 else None,
    }


class Sampler:
    """Every ``sample_s``, in a thread: each role's RSS in MiB, and the run state's and the
    tables' files and bytes (``samples``: one dict each, ``t`` seconds from the start)."""

    def __init__(self, s: Settings, api, broker_pid: int | None, sample_s: float):
        self.settings, self.api, self.broker_pid, self.sample_s = s, api, broker_pid, sample_s
        self.samples: list[dict] = []
        self.follow_ti: str | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample(round(time.monotonic() - self._began, 1)))
            except Exception as exc:  # said by run_soak, which fails: a soak with a gap in its samples says nothing
                log.exception("the soak's sampler stopped")
                self.error = f"the soak's sampler stopped: {type(exc).__name__}: {exc}"
                return
            self._stop.wait(self.sample_s)

    def sample(self, t: float) -> dict:
        home = self.settings.home
        return {
            "t": t,
            "rss_mb": role_rss_mb(self._roots(), self._follow_ti()),
            "state": {name: files_under(home / name) for name in STATE_FOLDERS},
            "tables": {name: files_under(Path(path)) for name, path in table_paths(self.settings).items()},
        }

    def _roots(self) -> dict[str, int | None]:
        from wavepipe.local import airflow as local
        from wavepipe.local.engine_server import LocalEngine

        return {
            **local.running(self.settings),
            "spark_engine": LocalEngine(self.settings).pid(),
            "broker": self.broker_pid,
        }

    def _follow_ti(self) -> str | None:
        """The id of the follow task's task instance (its processes' titles name it), once it runs."""
        import httpx

        if self.follow_ti is None:
            try:
                running = self.api.call("GET", "/api/v2/dags/wavepipe_ingest/dagRuns?state=running")["dag_runs"]
                for run in running:
                    path = f"/api/v2/dags/wavepipe_ingest/dagRuns/{run['dag_run_id']}/taskInstances/follow"
                    ti = self.api.call("GET", path)
                    if ti.get("state") == "running":
                        self.follow_ti = ti["id"]
            except (RuntimeError, httpx.HTTPError) as exc:  # not started yet, or the API is busy: asked again next time
                log.info("  soak: the follow task's instance is not known yet (%s)", exc)
        return self.follow_ti


def role_rss_mb(roots: dict[str, int | None], follow_ti: str | None) -> dict[str, float]:
    """Per role, the RSS of its root process and its descendants (MiB); under the scheduler,
    the processes whose titles name the task instance ``follow_ti`` (the executor's worker
    running it, the task's process) and their descendants are the role ``follow_task``."""
    import psutil

    out: dict[str, float] = {}
    for role, pid in roots.items():
        try:
            root = psutil.Process(pid) if pid else None
            tree = [root, *root.children(recursive=True)] if root else []
        except psutil.Error:
            continue
        follow = _follow_processes(tree[1:], follow_ti) if role == "scheduler" and follow_ti else set()
        for proc in tree:
            try:
                name = "follow_task" if proc.pid in follow else role
                out[name] = out.get(name, 0.0) + proc.memory_info().rss / 2**20
            except psutil.Error:  # it ended between the walk and the read
                continue
    return {role: round(mb, 1) for role, mb in out.items()}


def _follow_processes(procs: list, follow_ti: str) -> set[int]:
    import psutil

    found: set[int] = set()
    for proc in procs:
        try:
            if follow_ti in " ".join(proc.cmdline()):
                found |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
        except psutil.Error:
            continue
    return found


def files_under(folder: Path) -> dict[str, int]:
    """The files under ``folder`` and their bytes (0 and 0 when it does not exist). A folder or
    file removed while it is walked (a run's folder pruned) is left out: ``os.walk`` skips a
    folder it cannot list."""
    files = size = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                size += os.stat(os.path.join(parent, name)).st_size
                files += 1
    return {"files": files, "bytes": size}


def _checked(s: Settings, sent: list[trickle.Sent], hostile: list[Hostile], watcher: trickle.DeltaWatcher) -> dict:
    """Exactly once: each good waveform once and bit-exact (``trickle``'s check), each changed
    payload in the quarantine table, each junk record in the dead-letter table, no hostile id
    published; and the freshness of each good waveform."""
    import deltalake

    good = trickle.latencies(sent, watcher)
    quarantined = set(
        deltalake.DeltaTable(s.quarantine_table).to_pyarrow_table(columns=["waveform_id"]).column(0).to_pylist()
    )
    dead = deltalake.DeltaTable(s.dead_letter_table).to_pyarrow_table(columns=["key"]).column(0).to_pylist()
    dead_keys = {bytes(k).decode(errors="replace") for k in dead if k is not None}
    changed = [h.waveform_id for h in hostile if h.kind == "changed_payload"]
    junk = [h.waveform_id for h in hostile if h.kind == "junk"]
    hostile_ok = {
        "changed_payload": len(changed),
        "quarantined": len([w for w in changed if w in quarantined]),
        "junk": len(junk),
        "dead_lettered": len([w for w in junk if w in dead_keys]),
        "published": len([h for h in hostile if h.waveform_id in watcher.seen]),
    }
    whole = hostile_ok["quarantined"] == len(changed) and hostile_ok["dead_lettered"] == len(junk)
    return {
        "exactly_once": bool(good["exactly_once"] and whole and not hostile_ok["published"]),
        "waveforms": {k: good[k] for k in ("waveforms", "readable", "missing", "doubled", "checksum_mismatch")},
        "hostile": hostile_ok,
        "freshness": good["series"],
    }


def summary(options: SoakOptions, samples: list[dict], checked: dict) -> dict:
    """The soak's figures from its samples and checks (see the module's docstring)."""
    warmup, window = options.windows()
    end = samples[-1]["t"] if samples else options.minutes * 60
    first, last = (warmup, warmup + window), (end - window, end)
    roles = sorted({role for x in samples for role in x["rss_mb"]})
    growth = {}
    for role in roles:
        base, now = (_median([x["rss_mb"].get(role) for x in samples if a <= x["t"] <= b]) for a, b in (first, last))
        growth[role] = round(now / base - 1, 3) if base and now else None
    state = [(x["t"], sum(x["state"][f]["files"] for f in STATE_FOLDERS if f != "staging")) for x in samples]
    grew_first, grew_last = (_at(state, b) - _at(state, a) for a, b in (first, last))
    fresh = checked["freshness"]
    sending = (options.minutes * 60 - window, options.minutes * 60)  # the drain after it sends nothing
    p95 = [_p95([lat for t, lat in fresh if a <= t <= b]) for a, b in (first, sending)]
    return {
        "growth_after_warmup": growth,
        "exactly_once": checked["exactly_once"],
        "state_bounded": grew_last <= max(0.1 * grew_first, STATE_NOISE_FILES),
        "state_files_grew": {"first_window": grew_first, "last_window": grew_last},
        "windows_s": {"warmup": warmup, "window": window, "end": end},
        "freshness_p95_s": {"first_window": p95[0], "last_window": p95[1]},
        "freshness_ratio": round(p95[1] / p95[0], 2) if p95[0] and p95[1] is not None else None,
        "freshness_per_minute": _per_minute(fresh),
        "waveforms": checked["waveforms"],
        "hostile": checked["hostile"],
        "samples": samples,
    }


#: Files the run state may hold more at one sample than at another without growing: a micro-batch
#: in flight (its run's records, its lock).
STATE_NOISE_FILES = 10


def _median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _p95(values: list[float]) -> float | None:
    return trickle.stats_of(values)["p95_s"]


def _at(series: list[tuple[float, int]], t: float) -> int:
    """The value of ``series`` (time, value) at its last sample at or before ``t`` (its first if none)."""
    before = [v for at, v in series if at <= t]
    return before[-1] if before else (series[0][1] if series else 0)


def _per_minute(fresh: list[list[float]]) -> list[dict]:
    """Per minute of sending: the waveforms sent in it and their freshness p50 and p95."""
    minutes: dict[int, list[float]] = {}
    for t, lat in fresh:
        minutes.setdefault(int(t // 60), []).append(lat)
    return [
        {"minute": m, "waveforms": len(v), "p50_s": trickle.stats_of(v)["p50_s"], "p95_s": trickle.stats_of(v)["p95_s"]}
        for m, v in sorted(minutes.items())
    ]


def goals(result: dict) -> list[tuple[str, bool | None, str]]:
    """The soak against its goals: (goal, met or None when unknown, the numbers)."""
    growth = result["growth_after_warmup"]
    known = [g for g in growth.values() if g is not None]
    worst = max(growth, key=lambda r: growth[r] if growth[r] is not None else -1) if known else None
    ratio = result["freshness_ratio"]
    return [
        (
            "exactly once: each good waveform once and bit-exact, each hostile one quarantined or dead-lettered",
            result["exactly_once"],
            f"{result['waveforms']}, hostile {result['hostile']}",
        ),
        (
            f"every process role's RSS grows < {GROWTH_MAX:.0%} after the warm-up",
            all(g < GROWTH_MAX for g in known) if known else None,
            f"largest: {worst} {growth.get(worst)}" if worst else "no samples",
        ),
        ("the run state's files bounded", result["state_bounded"], f"{result['state_files_grew']}"),
        (
            f"freshness p95 in the last window <= {FRESHNESS_RATIO}x the first",
            ratio <= FRESHNESS_RATIO if ratio is not None else None,
            f"{result['freshness_p95_s']} (ratio {ratio})",
        ),
    ]


def to_markdown(result: dict, chart_name: str = "soak.png") -> str:
    warm, window, end = (result["windows_s"][k] for k in ("warmup", "window", "end"))
    first, last = result["samples"][0] if result["samples"] else {}, result["samples"][-1] if result["samples"] else {}
    lines = [
        "# Soak: the follow task through Airflow",
        "",
        f"`{result['options']['command']}`, {result['minutes']:g} minutes, started {result['started']}; "
        f"warm-up {warm:.0f} s, windows of {window:.0f} s (the first after the warm-up, the last before {end:.0f} s).",
        "",
        "| goal | met | numbers |",
        "|---|---|---|",
        *(
            f"| {name} | {'n/a' if met is None else ('yes' if met else 'NO')} | {numbers} |"
            for name, met, numbers in goals(result)
        ),
        "",
        "## Memory per process role (RSS, MiB)",
        "",
        "| role | first sample | last sample | growth after the warm-up |",
        "|---|---:|---:|---:|",
        *(
            f"| {role} | {first.get('rss_mb', {}).get(role)} | {last.get('rss_mb', {}).get(role)} | {g} |"
            for role, g in result["growth_after_warmup"].items()
        ),
        "",
        "## Files (first sample, last sample)",
        "",
        "| where | files | MiB |",
        "|---|---|---|",
        *(
            f"| {kind} `{name}` | {first[kind][name]['files']} -> {last[kind][name]['files']} | "
            f"{first[kind][name]['bytes'] / 2**20:.1f} -> {last[kind][name]['bytes'] / 2**20:.1f} |"
            for kind in ("state", "tables")
            if first
            for name in first[kind]
        ),
        "",
        "## Freshness per minute of sending (s)",
        "",
        "| minute | waveforms | p50 | p95 |",
        "|---:|---:|---:|---:|",
        *(
            f"| {m['minute']} | {m['waveforms']} | {m['p50_s']} | {m['p95_s']} |"
            for m in result["freshness_per_minute"]
        ),
        "",
        _maintenance_line(result["maintenance"]),
        "",
        f"![soak]({chart_name})",
        "",
    ]
    return "\n".join(lines)


def _maintenance_line(run: dict | None) -> str:
    if not run:
        return "No maintenance run was triggered (the soak ended before its middle)."
    took = f" in {run['seconds']:g} s" if run.get("seconds") is not None else ""
    return (
        f"The `{MAINTENANCE_DAG}` run {run['dag_run_id']}, triggered {run['triggered_at_s']:g} s into the "
        f"soak: {run['state']}{took}."
    )


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, fresh) = plt.subplots(2, 1, figsize=(10, 7))
    for role in result["growth_after_warmup"]:
        points = [(x["t"] / 60, x["rss_mb"][role]) for x in result["samples"] if role in x["rss_mb"]]
        if points:
            mem.plot(*zip(*points, strict=True), label=role)
    mem.set_xlabel("minutes")
    mem.set_ylabel("RSS, MiB")
    mem.legend(fontsize=7, ncol=3)
    per = result["freshness_per_minute"]
    fresh.plot([m["minute"] for m in per], [m["p50_s"] for m in per], label="p50")
    fresh.plot([m["minute"] for m in per], [m["p95_s"] for m in per], label="p95")
    fresh.set_xlabel("minute of sending")
    fresh.set_ylabel("freshness, s")
    fresh.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save(result: dict, out_dir: Path) -> list[Path]:
    """soak.json, .png and .md in ``out_dir`` (a chart that fails to draw loses nothing)."""
    from wavepipe.bench.results import save_page

    return save_page(result, out_dir, "soak", to_markdown, chart)
