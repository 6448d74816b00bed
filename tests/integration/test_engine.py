"""The Spark engine runs attach to (a Spark Connect server), on the real broker: started on demand
and by hand, shared by runs without growing, restarted between steps or when it holds too much
without losing or doubling a waveform, and, when it cannot be reached, one line that says what to
fix, before anything is read."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.helpers import assert_accounted, output_rows, produce_in_order, run_cli, start_cli, waveform_records
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.local.engine_server import LocalEngine

pytestmark = pytest.mark.integration


def _produce(settings, tag: str, n: int, seed: int) -> dict[str, str]:
    expected = {}
    for i in range(n):
        records, digest = waveform_records(f"{tag}-{i}", 3, seed=seed + i)
        produce_in_order(settings, records, partition=i % 2)
        expected[f"{tag}-{i}"] = digest
    return expected


def test_the_engine_starts_on_demand_is_shared_by_runs_and_restarts_between_steps(own_engine, spark):
    settings = own_engine
    engine = LocalEngine(settings)
    ensure_topic(settings)
    assert engine.pid() is None

    # the first run starts this home's engine (while its readers read) and leaves it running
    expected = _produce(settings, "a", 4, seed=1)
    code, out = run_cli(settings, "run")
    assert code == 0, out[-3000:]
    assert "Spark engine started at sc://127.0.0.1:" in out and "attached to the Spark engine in" in out, out[-3000:]
    assert "great_expectations._docs_decorators" not in out, "a library's import chatter fills the run's output"
    pid = engine.pid()
    assert pid is not None
    code, out = run_cli(settings, "spark", "up")
    assert code == 0 and f"already running at sc://127.0.0.1:{settings.spark_connect_port} (pid {pid})" in out, out

    # runs in other processes share one session on it: its Python workers do not grow per run
    after_first = engine.memory().python_processes
    for tag, seed in (("b", 10), ("c", 20)):
        expected |= _produce(settings, tag, 2, seed=seed)
        code, out = run_cli(settings, "run")
        assert code == 0, out[-3000:]
    assert engine.pid() == pid, "the same engine served every run"
    assert engine.memory().python_processes <= max(after_first, 3), engine.status()
    code, out = run_cli(settings, "spark", "status")
    assert code == 0 and re.search(r"memory: JVM \d+ MB, \d+ Python worker process\(es\) \d+ MB", out), out

    # a restart between reassemble and validate: the run goes on, on the new engine, exactly once
    expected |= _produce(settings, "d", 2, seed=30)
    plan = pipeline.plan_step(settings, "restarted")
    for p in pipeline.partitions_to_read(plan):
        pipeline.consume_step(settings, "restarted", p)
    pipeline.reassemble_step(settings, "restarted")
    engine.restart()
    assert engine.pid() not in (None, pid)
    pipeline.validate_step(settings, "restarted")
    report = pipeline.commit_step(settings, "restarted")
    assert report["waveforms"] == {"output_new": 2}
    assert_accounted(spark, settings, report)

    # an engine holding more than its limit is restarted before the next step, when no step uses it
    expected |= _produce(settings, "e", 2, seed=40)
    before = engine.pid()
    code, out = run_cli(settings.replace(spark_engine_max_rss_mb=1), "run")
    assert code == 0, out[-3000:]
    assert "(limit 1 MB): restarting it" in out, out[-3000:]
    assert engine.pid() not in (None, before)

    rows = output_rows(spark, settings)
    assert {r[0]: r[1] for r in rows} == expected and all(r[1] == r[2] for r in rows)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 18, 1: 18}

    # `wavepipe spark down` waits for the steps attached to the engine (each holds the in-use
    # lock, as this test does here); no automatic restart happens under them either
    stopped: dict = {}
    with engine.in_use():
        waiter = threading.Thread(target=lambda: stopped.update(out=run_cli(settings, "spark", "down")))
        waiter.start()
        waiter.join(10)
        assert waiter.is_alive() and engine.pid() is not None, "down stopped the engine under a step"
        assert not engine.idle()
    waiter.join(60)
    code, out = stopped["out"]
    assert code == 0 and "a step is using the Spark engine: waiting until it ends" in out, out
    assert "Spark engine stopped" in out and engine.pid() is None, out


def test_an_unreachable_engine_is_one_line_before_anything_is_read(settings):
    ensure_topic(settings)
    _produce(settings, "x", 2, seed=50)
    began = time.monotonic()
    code, out = run_cli(settings.replace(spark_remote="sc://127.0.0.1:1"), "run")
    seconds = time.monotonic() - began
    assert code == 1, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[-1] == (
        "wavepipe run failed: the Spark engine at sc://127.0.0.1:1 is not reachable: check that the "
        "Spark Connect server sc://127.0.0.1:1 is up and reachable (the spark_remote setting, or the "
        "Airflow Connection wavepipe_spark)"
    ), out
    assert not any("Traceback" in line or "RETRIES_EXCEEDED" in line for line in lines), out
    assert seconds < 60, f"{seconds:.0f}s: an unreachable engine is said at once, not after retries"
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}
    assert not list((settings.staging_dir).rglob("*.parquet")), "nothing was read for a run that cannot be processed"


def test_an_engine_killed_under_a_run_is_said_in_one_line_within_seconds_and_the_retry_resumes(own_engine, spark):
    import os
    import signal

    ensure_topic(own_engine)
    expected = _produce(own_engine, "k", 4, seed=70)
    # every waveform's bytes are assembled in a Spark task that dawdles, so the kill lands inside one
    run = start_cli(own_engine, "run", "--run-id", "killed", failpoints="assemble.batch=sleep:60")
    seen = []
    for line in run.stdout:  # until the run is on the engine
        seen.append(line)
        if "Spark step reassemble" in line and "started" in line:
            break
    time.sleep(2)
    pid = LocalEngine(own_engine).pid()
    assert pid, "".join(seen)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    out = "".join(seen) + run.stdout.read()
    run.wait(timeout=120)
    seconds = time.monotonic() - killed
    assert run.returncode == 1, out[-3000:]
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert re.match(
        rf"wavepipe run failed: the Spark engine's JVM \(pid {pid}\) exited during Spark step \w+\. ", last
    ), last
    assert "`wavepipe run` resumes the run" in last and "server.log" in last, last
    assert "Traceback" not in out and "_InactiveRpcError" not in out and "StatusCode" not in out, out[-3000:]
    # seconds, not the client's retries (31-42 s before the watch); 2-6 s alone, 13 s once on a loaded machine
    assert seconds < 25, f"{seconds:.1f}s from the kill to the one line (was 31-42 s)"
    assert committed_offsets(own_engine, own_engine.group, own_engine.topic, [0, 1]) == {0: None, 1: None}

    report = pipeline.run_once(own_engine)  # resumes the run on a new engine
    assert report["run_id"] == "killed"
    assert_accounted(spark, own_engine, report)
    assert {r[0]: r[1] for r in output_rows(spark, own_engine)} == expected


def test_a_steps_progress_lines_say_the_engines_stages(settings, monkeypatch, caplog):
    """Spark Connect's progress handler feeds a step's progress lines: the operation running
    now (stages, tasks, bytes read) and the operations done."""
    from wavepipe import engine_client, spark_launch

    monkeypatch.setattr(spark_launch, "PROGRESS_EVERY_S", 0.2)
    caplog.set_level("INFO", logger=spark_launch.log.name)
    with (
        engine_client.attached(settings) as session,
        engine_client.stage_progress(session) as stages,
        spark_launch.progress("Spark step test", detail=stages.summary),
    ):
        total = session.range(0, 20_000_000, numPartitions=8).selectExpr("sum(id % 7)").collect()[0][0]
        time.sleep(0.5)  # a tick after the operation
    assert total == sum(i % 7 for i in range(7)) * (20_000_000 // 7) + sum(range(20_000_000 % 7))
    assert stages.summary() == "Spark: 1 operation(s) done"
    ticks = [r.getMessage() for r in caplog.records if "Spark step test: running for" in r.getMessage()]
    assert any(t.endswith("; Spark: 1 operation(s) done") for t in ticks), ticks
