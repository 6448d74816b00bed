"""The benchmark's pure parts: which process is which, and how goals follow from numbers."""

from __future__ import annotations

import pytest

from wavepipe.bench.monitor import role_of
from wavepipe.bench.results import goals, markdown
from wavepipe.bench.systems import DESCRIBE_STAGE


def test_processes_are_filed_under_their_role():
    assert (
        role_of(["/usr/lib/jvm/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "app.py"]) == "spark_jvm"
    )
    assert role_of(["/venv/bin/python", "-m", "pyspark.daemon"]) == "spark_python_workers"
    assert role_of(["/venv/bin/python3", "/repo/spark_apps/reassemble.py", "--run-id", "r"]) == "spark_python_driver"
    assert (
        role_of(["/venv/bin/python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]) == "consumer"
    )
    assert role_of(["/venv/bin/python", "-c", "from multiprocessing.resource_tracker import main;main(5)"]) is None
    assert role_of(["/usr/bin/kcat", "-C"]) == "consumer"
    assert role_of(["/bin/bash", "spark-submit"]) is None


def _m(system, workload, scale, wall, consumer=None, jvm=None, of_ceiling=None):
    memory = {}
    if consumer:
        memory["consumer"] = {"peak_rss_mb": consumer, "max_process_rss_mb": consumer, "cpu_s": 1.0, "processes": 2}
    if jvm:
        memory["spark_jvm"] = {"peak_rss_mb": jvm, "max_process_rss_mb": jvm, "cpu_s": 1.0, "processes": 1}
    return {
        "system": system,
        "workload": workload,
        "scale": scale,
        "waveforms": 10,
        "chunks": 160,
        "payload_bytes": 10 * 2**20,
        "wall_s": wall,
        "mb_s": 10.0,
        "chunks_s": 100,
        "of_ceiling": of_ceiling,
        "stages": {"consume": wall / 2},
        "memory": memory,
        "check": "ok",
        "error": None,
        "info": {},
    }


def _results(measurements):
    machine = {
        "cpu": "cpu",
        "cores": 2,
        "memory_gib": 24,
        "os": "Linux",
        "python": "3.11",
        "kafka": "4.2.0",
        "pyspark": "4.2.0",
        "delta_spark": "4.4.0",
        "confluent_kafka": "2",
        "librdkafka": "2",
        "kcat": None,
    }
    return {
        "command": "wavepipe bench",
        "started_at": "t",
        "seconds": 1.0,
        "machine": machine,
        "options": {"scale": 4, "partitions": 4, "parallelism": 2},
        "skipped": [],
        "measurements": measurements,
    }


def _warm(repeat, wall, spark_jobs=None, described=0.0):
    """A warm small run of ``wall`` seconds, ``described`` of them after its commit."""
    m = _m("wavepipe", "warm_small", 1, wall)
    m["info"] = {"repeat": repeat, "spark_jobs": spark_jobs}
    m["stages"] = {"plan": 0.1, "consume": 0.5, "reassemble + validate": wall - 1.0 - described, "commit": 0.4}
    if described:
        m["stages"][DESCRIBE_STAGE] = described
    return m


def test_goals_follow_from_the_numbers():
    results = _results(
        [
            _m("ceiling_confluent", "large", 1, 2.0, of_ceiling=1.0),
            _m("wavepipe", "large", 1, 5.0, consumer=100, jvm=1000, of_ceiling=0.4),
            _m("python_consumer", "large", 1, 9.0),
            _m("spark_kafka_source", "large", 1, 6.0),
            _m("wavepipe", "large", 4, 18.0, consumer=110, jvm=1300, of_ceiling=0.1),
            _m("python_consumer", "large", 4, 20.0),
            _warm(1, 12.0),
            _warm(3, 1.0),
            _warm(2, 6.0, spark_jobs=8),
            _warm(4, 2.5, described=1.0),  # 1.5 s to its commit
        ]
    )
    results["engine_start"] = {"up_s": 7.5, "attach_and_first_query_s": 1.25, "warm_query_s": 0.05}
    results["engine_warmup"] = [
        {"repeat": 1, "wall_s": 9.25, "check": "ok", "error": None},
        {"repeat": 2, "wall_s": 0, "check": "", "error": "RuntimeError: boom"},
    ]
    verdicts = {name: (met, numbers) for name, met, numbers in goals(results)}
    assert verdicts["wavepipe >= 2.0x Spark Kafka source + group-by (large)"] == (False, "1.20x")
    assert verdicts["wavepipe >= 1.0x hand-written Python consumer (large)"] == (True, "1.80x")
    assert verdicts["wavepipe >= 1.0x hand-written Python consumer (large x4)"] == (True, "1.11x")
    assert verdicts["wavepipe end to end >= 15% of the ceiling (large x4)"] == (False, "10% of the ceiling")
    # the steady state: the median of the runs after the first (1.0, 1.5, 6.0), not the first's 12 s
    assert verdicts["a small run (ten 1 MiB waveforms) with the engine warm takes <= 1 s from plan to commit"] == (
        False,
        "1.5 s, the median of 3 run(s) after the first; the first took 12.0 s; with their description after "
        "the commit, 2.5 s",
    )
    growth = {k: v for k, v in verdicts.items() if "grows" in k and "(large)" in k}
    assert growth["wavepipe Kafka reader / consumer processes peak RSS grows < 20% at 4x (large)"] == (
        True,
        "100 -> 110 MB (+10%)",
    )
    assert growth["wavepipe Spark JVM peak RSS grows < 20% at 4x (large)"] == (False, "1000 -> 1300 MB (+30%)")
    assert not any("Python driver" in k for k in growth)  # a role neither run had is no goal
    assert all(met is None for name, (met, _) in verdicts.items() if "(small)" in name)  # nothing measured there
    assert verdicts["the validation gate adds <= 1/3 to wavepipe's wall time (large)"][0] is None  # no gate stages

    page = markdown(results, "chart.png")
    assert "- wavepipe Spark JVM peak RSS grows < 20% at 4x (large): **missed** (1000 -> 1300 MB (+30%))" in page
    assert "| wavepipe (end to end) | large | 5.0 | 18.0 | 3.60 | spark_jvm: 1000 -> 1300 |" in page
    assert "7.5 s until it accepts connections, then 1.2 s for a new session" in page
    assert "| 1 | 12.0 | 12.0 | - | 0.1 | 0.5 | 11.0 | 0.4 |" in page
    assert "| 2 | 6.0 | 6.0 | 8 | 0.1 |" in page  # the Spark jobs the engine counted for the run
    assert (
        "2 throw-away small run(s) like those below warmed the engine up (its JIT, its caches), as a long-lived "
        "engine is: 9.2 s, failed." in page
    )
    assert page.index("| 1 | 12.0 |") < page.index("| 2 | 6.0 |") < page.index("| 3 | 1.0 |")


def test_a_failed_warm_run_is_left_out_and_one_run_is_its_own_steady_state():
    failed = dict(_warm(2, 1.0), error="RuntimeError: boom")
    verdicts = {name: (met, numbers) for name, met, numbers in goals(_results([_warm(1, 7.0), failed]))}
    assert verdicts["a small run (ten 1 MiB waveforms) with the engine warm takes <= 1 s from plan to commit"] == (
        False,
        "7.0 s, one run, the first in its home",
    )


def test_the_gate_goal_follows_from_the_stages():
    wp = _m("wavepipe", "small", 1, 40.0)
    wp["stages"] = {
        "consume": 4.0,
        "validate: Great Expectations suites": 5.0,
        "describe: Data Docs": 1.0,  # after the commit: not the gate's
        "validate: checked columns (from the manifest, no payload)": 4.0,
        "publish: assemble from the staged chunks, write the output once": 9.0,
    }
    slow = dict(_m("wavepipe", "large", 1, 40.0), stages={"validate: waveform plot": 12.0})
    verdicts = {name: (met, numbers) for name, met, numbers in goals(_results([wp, slow]))}
    assert verdicts["the validation gate adds <= 1/3 to wavepipe's wall time (small)"] == (
        True,
        "+9.0 s on 31.0 s (29%; publishing, the run's one write of the output, not included)",
    )
    assert verdicts["the validation gate adds <= 1/3 to wavepipe's wall time (large)"][0] is False


def test_a_server_beside_the_measured_system_is_not_counted_as_its_memory():
    """The Spark engine, a child of the benchmark process, idles while other systems run: its JVM
    must not appear as theirs."""
    import subprocess
    import sys
    import time

    from wavepipe.bench.monitor import Monitor

    # a stand-in process whose command line reads as a Spark JVM (only the role is looked at)
    server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "org.apache.spark.deploy.SparkSubmit"]
    )
    try:
        time.sleep(0.3)
        with Monitor(interval=0.05) as counted:
            time.sleep(0.3)
        with Monitor(interval=0.05, ignore_pid=server.pid) as beside:
            time.sleep(0.3)
    finally:
        server.kill()
        server.wait()
    # (the test process may have Spark processes of its own, e.g. a test worker's engine)
    jvms = [m.stats().get("spark_jvm", {}).get("processes", 0) for m in (counted, beside)]
    assert jvms[0] - jvms[1] == 1, jvms


def test_a_process_running_before_a_measurement_counts_only_the_cpu_it_spends_during_it():
    """An engine's Python workers outlive a run: the CPU they spent for earlier runs is not the
    next one's (it was: the workers' CPU grew from one measurement to the next)."""
    import subprocess
    import sys
    import time

    from wavepipe.bench.monitor import Monitor

    burn = "import time; t = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    worker = subprocess.Popen([sys.executable, "-c", burn, "pyspark.daemon"])
    try:
        time.sleep(1.0)  # it has burnt its 0.6 s of CPU, and sleeps
        with Monitor(interval=0.05) as idle:
            time.sleep(0.3)
    finally:
        worker.kill()
        worker.wait()
    assert idle.stats().get("spark_python_workers", {}).get("cpu_s", 0.0) < 0.3, idle.stats()


def test_the_txn_state_goals_hold_only_when_the_stable_ids_state_stays_flat():
    from wavepipe.bench import txn_state

    def sample(commits, entries, size, ms):
        return {
            "commits": commits,
            "txn_entries": entries,
            "checkpoint_bytes": size,
            "commit_ms_median": ms,
            "commit_ms_p95": ms,
        }

    flat = [sample(500, 1, 13877, 30.0), sample(10_000, 1, 13877, 31.0)]
    grown = [sample(500, 500, 80_000, 30.0), sample(10_000, 10_000, 1_500_000, 70.0)]
    result = {
        "commits": 10_000,
        "started": "t",
        "schemes": {"id_per_run": {"samples": grown}, "stable_id": {"samples": flat}},
    }
    assert [met for _, met, _ in txn_state.goals(result)] == [True, True, True]
    assert "| id_per_run | 10,000 | 10,000 | 1,500,000 |" in txn_state.to_markdown(result)
    assert txn_state.state_kept(result)
    result["schemes"]["stable_id"]["samples"] = [flat[0], sample(10_000, 1, 13877, 130.0)]  # the log's files
    assert [met for _, met, _ in txn_state.goals(result)] == [True, True, False]
    assert txn_state.state_kept(result)  # the CLI's exit: the state's goals, not the commit time's
    result["schemes"]["stable_id"]["samples"] = grown
    assert [met for _, met, _ in txn_state.goals(result)] == [False, False, False]
    assert not txn_state.state_kept(result)


def test_the_txn_state_sizes_sample_at_checkpoints_at_least_twice():
    from wavepipe.bench.txn_state import TxnStateSize

    full, quick = TxnStateSize(), TxnStateSize.quick()
    assert (full.commits, full.sample_every, quick.commits, quick.sample_every) == (10_000, 500, 500, 100)
    assert full.commits // full.sample_every == 20 and quick.commits // quick.sample_every == 5
    for wrong in ({"sample_every": 150}, {"commits": 100}, {"spark_appends": 0}):
        with pytest.raises(ValueError):  # off the checkpoints, one sample (first = last), nothing timed
            TxnStateSize.quick(**wrong)


def test_the_cpu_and_object_store_goals_follow_from_the_sampled_processes_and_walls():
    wp = _m("wavepipe", "large", 1, 10.0, consumer=100, jvm=1000)  # 1 + 1 CPU seconds
    hand = _m("python_consumer", "large", 1, 12.0, consumer=100)  # 1 CPU second
    s3 = _m("wavepipe_s3", "large", 1, 14.0)
    results = _results([wp, hand, s3])
    results["options"]["systems"] = ["wavepipe", "python_consumer", "wavepipe_s3"]
    verdicts = {name: (met, numbers) for name, met, numbers in goals(results)}
    assert verdicts["wavepipe's CPU seconds <= 1.5x hand-written Python consumer's (large)"] == (
        False,
        "2.0 s against 1.0 s (2.00x)",
    )
    assert verdicts["wavepipe on the local object store <= 1.5x the local run (large)"] == (
        True,
        "14.0 s against 10.0 s (1.40x)",
    )
    assert verdicts["wavepipe's CPU seconds <= 1.5x hand-written Python consumer's (small)"] == (None, "not measured")


def test_the_quality_goal_compares_the_medians_of_the_alternated_runs_and_their_spark_jobs():
    from wavepipe.bench.results import figures, goals

    def run(system, wall, repeat=0, jobs=1):
        return {**_m(system, "large", 1, wall), "repeat": repeat, "info": {"spark_jobs": jobs}}

    # one slow first run would miss the goal alone; the medians (10.0 and 9.5) meet it
    pair = [run("wavepipe", 12.0), run("wavepipe_no_qc", 9.4), run("wavepipe_no_qc", 9.5, 1), run("wavepipe", 10.0, 1)]
    pair += [run("wavepipe", 9.9, 2), run("wavepipe_no_qc", 9.8, 2)]
    results = _results(pair)
    results["options"]["systems"] = ["wavepipe", "wavepipe_no_qc"]
    (quality,) = [g for g in goals(results) if g[0].startswith("quality metrics") and "(large)" in g[0]]
    assert (
        quality[1] is True
        and "median 10.0 s against 9.5 s (1.05x; runs 9.9, 10.0, 12.0 and 9.4, 9.5, 9.8 s)" in quality[2]
    )
    assert figures(results)["wavepipe large x1 wall/wavepipe_no_qc"] == 10.0 / 9.5
    assert figures(results)["wavepipe_no_qc large x1 median wall_s"] == 9.5
    assert figures(results)["wavepipe large x1 wall_s"] == 12.0, "the tables and figures keep the first measurements"
    results["measurements"][3]["info"]["spark_jobs"] = 2
    assert next(g for g in goals(results) if g[0].startswith("quality metrics"))[1] is False, "a Spark job more"
