"""`wavepipe bench --soak` kept alive at a small size: the ingest DAG's follow task through the
real Airflow services for a minute and a half, with a trickle, bursts and hostile waveforms on the
real broker and the maintenance DAG run half-way; each good waveform once and bit-exact, each
hostile one quarantined or dead-lettered, and the memory, files and freshness it samples written.
No timing or growth is asserted: those live in docs/benchmarks/soak.md."""

from __future__ import annotations

import json

import pytest

from wavepipe.bench import soak

pytestmark = pytest.mark.integration


def test_a_short_soak_publishes_each_waveform_once_and_samples_every_process_role(settings, tmp_path):
    options = soak.SoakOptions(
        minutes=1.5, every_s=2.0, burst=4, burst_every_s=30.0, hostile_every=5, sample_s=5.0, drain_s=180.0
    )
    result = soak.run_soak(settings, options)

    assert result["exactly_once"], (result["waveforms"], result["hostile"])
    waves, hostile = result["waveforms"], result["hostile"]
    assert waves["readable"] == waves["waveforms"] >= 40 and waves["missing"] == waves["doubled"] == 0, waves
    assert hostile["quarantined"] == hostile["changed_payload"] >= 2, hostile
    assert hostile["dead_lettered"] == hostile["junk"] >= 2 and hostile["published"] == 0, hostile
    maintenance = result["maintenance"]
    assert maintenance["state"] == "success" and 0 < maintenance["seconds"] < result["seconds"], maintenance

    growth = result["growth_after_warmup"]
    assert {"api-server", "scheduler", "dag-processor", "triggerer", "follow_task", "spark_engine"} <= set(growth)
    assert all(g is not None for g in growth.values()), growth
    samples = result["samples"]
    assert len(samples) >= 15 and samples[-1]["state"]["runs"]["files"] > 0, samples[-1]
    assert samples[-1]["tables"]["waveforms"]["files"] > 0
    minutes = result["freshness_per_minute"]
    assert sum(m["waveforms"] for m in minutes) == waves["readable"] and all(m["p95_s"] > 0 for m in minutes)
    assert isinstance(result["state_bounded"], bool) and result["freshness_ratio"] is not None
    assert all(met is not None for _, met, _ in soak.goals(result)), soak.goals(result)

    paths = soak.save(result, tmp_path / "out")
    assert [p.name for p in paths] == ["soak.json", "soak.png", "soak.md"]
    assert json.loads(paths[0].read_text())["growth_after_warmup"] == growth
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| follow_task |" in paths[2].read_text()
