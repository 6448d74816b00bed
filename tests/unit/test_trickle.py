"""The trickle benchmark's pure parts: send schedules, percentiles, the exactly-once check, and
its page (the benchmark itself runs the real services: `wavepipe bench --trickle`)."""

from __future__ import annotations

import pytest

from wavepipe.bench.trickle import DeltaWatcher, Sent, TrickleOptions, goals, latencies, save, stats_of


def test_the_schedules_send_one_a_second_or_bursts():
    options = TrickleOptions(seconds=30, burst=4, burst_every_s=10)
    assert options.schedule("steady") == [float(i) for i in range(30)]
    assert options.schedule("burst") == [0.0] * 4 + [10.0] * 4 + [20.0] * 4
    with pytest.raises(ValueError, match="unknown trickle mode 'stedy'"):
        options.schedule("stedy")


def test_percentiles():
    assert stats_of([]) == {"p50_s": None, "p95_s": None, "max_s": None, "mean_s": None}
    stats = stats_of([float(i) for i in range(1, 101)])
    assert (stats["p50_s"], stats["p95_s"], stats["max_s"]) == (50.5, 95.0, 100.0)


def test_exactly_once_counts_what_is_missing_doubled_or_wrong(tmp_path):
    watcher = DeltaWatcher(tmp_path)
    watcher.seen = {"a": [10.0], "b": [12.0, 30.0], "c": [15.0]}
    watcher.checksums = {"a": "sha256:1", "b": "sha256:2", "c": "sha256:x"}
    sent = [Sent("a", "sha256:1", 8.0), Sent("b", "sha256:2", 9.0), Sent("c", "sha256:3", 10.0), Sent("d", "", 11.0)]
    result = latencies(sent, watcher)
    assert (result["readable"], result["missing"], result["doubled"], result["checksum_mismatch"]) == (3, 1, 1, 1)
    assert not result["exactly_once"] and result["max_s"] == 5.0
    assert result["series"] == [[0.0, 2.0], [1.0, 3.0], [2.0, 5.0]]
    watcher.seen, watcher.checksums = {"a": [10.0]}, {"a": "sha256:1"}
    assert latencies(sent[:1], watcher)["exactly_once"]


def test_the_page_states_the_goals_and_a_chart_failure_loses_nothing(tmp_path, monkeypatch):
    from wavepipe.bench import trickle

    row = {
        "p50_s": 20.0,
        "p95_s": 31.0,
        "max_s": 40.0,
        "readable": 5,
        "waveforms": 5,
        "runs": 2,
        "runs_per_minute": 1.0,
    }
    result = {
        "started": "20261125T000000",
        "seconds": 600.0,
        "options": {**TrickleOptions(modes=("steady",)).__dict__},
        "machine": {"cpu": "cpu", "cores": 2, "memory_gib": 24, "os": "Linux", "python": "3.11", "kafka": "4.2.0"}
        | {"pyspark": "4.2.0", "delta_spark": "4.4.0"},
        "watcher_load": {
            "seconds": 120.0,
            "poll_s": 1.0,
            "triggerer_cpu_s": {"not-watching": 3.0, "watching": 6.6},
            "watcher_cpu_ms_per_poll": 30.0,
            "watcher_core_percent": 3.0,
            "broker_requests_per_poll": 2,
        },
        "results": [
            {**row, "system": "wavepipe", "mode": "steady", "exactly_once": True, "series": [[0, 20.0]]},
            {**row, "system": "wavepipe_follow", "mode": "steady", "p50_s": 5.0, "p95_s": 7.0, "exactly_once": True}
            | {"series": [[0, 5.0]]},
            {**row, "system": "spark_streaming", "mode": "steady", "exactly_once": True, "p50_s": 4.0, "p95_s": 5.0}
            | {"series": []},
        ],
    }
    event, follow = "wavepipe, event-driven (Airflow) steady", "wavepipe, follow task (Airflow) steady"
    assert goals(result) == [
        (
            f"{event}: p50 <= 2x Spark Structured Streaming's, exactly once",
            False,
            "p50 20.0 s, 5.0x, exactly once: True",
        ),
        (
            f"{follow}: p50 <= 1 s, p95 <= Spark Structured Streaming's, exactly once",
            False,
            "p50 5.0 s, p95 7.0 s against 5.0 s, exactly once: True",
        ),
        ("the lag watcher's CPU per poll < 50 ms", True, "30.0 ms"),
    ]
    fresh = {**result["results"][1], "p50_s": 0.8, "p95_s": 4.5}
    assert goals({**result, "results": [fresh, result["results"][2]]})[0][1] is True

    def broken(*_):
        raise RuntimeError("no display")

    monkeypatch.setattr(trickle, "chart", broken)
    paths = save(result, tmp_path)
    assert [p.name for p in paths] == ["trickle.json", "trickle.md"]
    page = (tmp_path / "trickle.md").read_text()
    assert (
        "used 6.6 CPU s with the ingest DAG's watcher measuring at least every 1 s, and 3.0 s with the DAG paused"
        in page
    )
    assert (
        "**missed** (p50 20.0 s, 5.0x" in page
        and "event-driven (Airflow)'s p50 is 5.0x Spark Structured Streaming's" in page
        and "follow task (Airflow)'s p50 is 1.2x" in page
    )
