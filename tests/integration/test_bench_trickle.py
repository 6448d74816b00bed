"""`wavepipe bench --trickle` kept alive at its smallest size: every system (the event-driven DAG
and the follow task through real Airflow services, Spark Structured Streaming through
spark-submit) on the real broker, each mode's output checked exactly once against what was
produced, the watcher's load measured, the result files written. And a benchmark stopped with
SIGTERM leaves none of what it started running. No timing is asserted: freshness lives in
docs/benchmarks/trickle.md."""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest

from tests.helpers import progress, start_cli
from wavepipe.bench import trickle

pytestmark = pytest.mark.integration

SYSTEMS = ("wavepipe_follow", "wavepipe", "spark_streaming")


def small_options(**changes) -> trickle.TrickleOptions:
    """Ten waveforms a mode (steady: one a second; burst: two bursts of five), one warm-up each."""
    base = {"seconds": 10.0, "burst": 5, "burst_every_s": 5.0, "warmup": 1, "watcher_load_s": 5.0, "drain_s": 180.0}
    return trickle.TrickleOptions(**{**base, **changes})


def test_every_trickle_system_publishes_each_waveform_once_and_says_where_its_time_went(settings, tmp_path):
    options = small_options(systems=SYSTEMS)
    result = trickle.run_trickle(settings, options)
    rows = {(r["system"], r["mode"]): r for r in result["results"]}
    assert set(rows) == {(s, m) for s in SYSTEMS for m in ("steady", "burst")}
    for key, r in rows.items():
        assert r["exactly_once"] and r["readable"] == r["waveforms"] == 10, (key, r)
        assert r["missing"] == r["doubled"] == r["checksum_mismatch"] == 0, key
        assert 0 < r["p50_s"] <= r["p95_s"] <= r["max_s"], key
        assert len(r["series"]) == 10 and r["runs"] >= 1 and r["table_commits"] >= 1, key
    for system in ("wavepipe", "wavepipe_follow"):
        for mode in ("steady", "burst"):
            r = rows[(system, mode)]
            assert r["failed_runs"] == 0, (system, mode, r)
            # where a run's time went, from the runs' own reports: every step timed
            assert set(r["stages"]) == {trickle.WAITED, *trickle.STEPS}, r["stages"]
            assert all(v is not None and v >= 0 for v in r["stages"].values()), (system, mode, r["stages"])
    assert all(r["run_types"] == ["asset_triggered"] for k, r in rows.items() if k[0] == "wavepipe")
    # the follow task: one DAG run (the watcher's) serves every micro-batch of both modes
    follow_runs = [r["dag_runs"] for k, r in rows.items() if k[0] == "wavepipe_follow"]
    assert sum(follow_runs) <= 1, follow_runs
    load = result["watcher_load"]
    assert set(load["triggerer_cpu_s"]) == {"watching", "not-watching"} and load["watcher_cpu_ms_per_poll"] is not None

    paths = trickle.save(result, tmp_path / "out")
    assert [p.name for p in paths] == ["trickle.json", "trickle.png", "trickle.md"]
    assert json.loads(paths[0].read_text())["results"] == result["results"]
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths[2].read_text()
    for r in result["results"]:
        assert f"| {trickle.LABELS[r['system']]} | {r['mode']} | 10/10 | {r['p50_s']} | {r['p95_s']} |" in page
    assert "## Where a run's time goes" in page
    verdicts = trickle.goals(result)
    assert verdicts and all(met is not None for _, met, _ in verdicts), verdicts


def _started_for(folder: str) -> list[psutil.Process]:
    """The processes whose command line or environment names ``folder``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        text = " ".join(proc.info["cmdline"] or []) + " " + json.dumps(proc.info["environ"] or {})
        if folder in text:
            found.append(proc)
    return found


def test_a_benchmark_stopped_with_sigterm_stops_the_airflow_services_and_engine_it_started(settings):
    bench = str(settings.home / "bench")
    proc = start_cli(settings, "-v", "bench", "--trickle", "--systems", "wavepipe_follow", "--seconds", "60")
    lines: list[str] = []
    try:
        began = time.monotonic()
        while not any("Airflow is ready at" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines[-30:])
            lines.append(line)
            assert time.monotonic() - began < 600, "".join(lines[-30:])
        started = [p for p in _started_for(bench) if p.pid != proc.pid]
        # its Spark engine and the four Airflow services (api-server, scheduler, dag-processor, triggerer)
        assert len(started) >= 5, [p.info["cmdline"] for p in started]
        progress(f"SIGTERM to the benchmark, with {len(started)} processes of its own running")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert "stopped by SIGTERM" in out
    _, alive = psutil.wait_procs(started, timeout=30)
    assert alive == [] and [p for p in _started_for(bench) if p.is_running()] == [], [p.info for p in alive]
    # the session's broker was running before the benchmark: it still is
    from wavepipe.consumers.kafka_admin import cluster_metadata

    assert cluster_metadata(settings).brokers
