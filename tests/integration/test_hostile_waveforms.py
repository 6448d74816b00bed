"""Waveforms that follow the chunk protocol but are hostile to plotting and rendering, and
waveforms at the size limit, on the real broker and a real Spark: each is ingested bit-exact (or
quarantined/dead-lettered where the protocol says so) and the run commits. Steps that only describe
a run never fail it (issue 15, items 1 and 14)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import START, assert_accounted, output_rows, produce_in_order, quarantine_reasons, with_headers
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.contracts.config import Settings
from wavepipe.contracts.protocol import INT64_MAX, checksum, split_waveform

pytestmark = pytest.mark.integration

I64 = np.iinfo(np.int64)


def _records(waveform_id: str, samples: np.ndarray, rate: float = 100.0, chunk_size: int = 64, **headers):
    """(records, checksum) of one waveform; ``headers`` replace a header on every chunk (the
    protocol requires all chunks to agree), e.g. ``**{"wp-start-ns": b"..."}``."""
    records = split_waveform(
        samples, waveform_id=waveform_id, sample_rate=rate, start_time=START, source="hostile", chunk_size=chunk_size
    )
    for i in range(len(records)):
        records[i] = with_headers(records, i, **headers) if headers else records[i]
    return records, checksum(np.ascontiguousarray(samples).tobytes())


def test_waveforms_hostile_to_plots_and_pages_are_ingested_and_the_run_commits(settings, spark):
    # Thresholds opened to what the protocol allows, so every waveform here passes validation:
    # this test is about the steps that describe a run. That the defaults (1e-3 Hz, 1900-01-01)
    # reject a 1e-9 Hz waveform or a start in 1677 by design is test_validation's business.
    settings = settings.replace(
        validate_sample_rate_min=1e-9,
        validate_start_time_min="1677-09-21T00:00:00Z",
        validate_start_time_max_ahead_s=1e10,
    )
    ensure_topic(settings, partitions=1)  # one staged file, one candidate file
    rng = np.random.default_rng(15)
    waveforms = {  # id -> (records, checksum); the plot takes the three longest (plots.plot_picks)
        "huge-range": _records("huge-range", np.array([1.7e308, -1.7e308, 0, 1], "<f8")),
        "nan-and-inf": _records("nan-and-inf", np.array([np.nan, np.inf, -np.inf, 1.0, 2.0], "<f8")),
        "complex128": _records("complex128", np.array([1 + 2j, np.inf + 0j, 1.7e308 - 1.7e308j, np.nan], "<c16")),
        "constant": _records("constant", np.full(1000, 3.0, "<f4")),
        "one-sample": _records("one-sample", np.array([5.0], "<f4")),
        "rate-1e-9": _records("rate-1e-9", np.arange(4.0), rate=1e-9),
        "rate-1e9": _records("rate-1e9", np.arange(4000.0), rate=1e9),
        "start-earliest": _records("start-earliest", np.arange(4.0), **{"wp-start-ns": str(-INT64_MAX).encode()}),
        "start-latest": _records("start-latest", np.arange(4.0), **{"wp-start-ns": str(INT64_MAX).encode()}),
        "int64-extremes": _records("int64-extremes", np.array([I64.min, I64.max, 0, -1], "<i8")),
        "channels-64": _records("channels-64", rng.normal(size=(100, 64)).astype("<f4"), chunk_size=4096),
        "\u00e9" * 128: _records("\u00e9" * 128, rng.normal(size=10)),  # the longest id allowed: 256 bytes
    }
    # an id of 1000 characters breaks the protocol (1 to 256 bytes): dead-lettered, never plotted
    too_long, _ = _records("too-long", np.arange(4.0))
    too_long = [with_headers(too_long, i, **{"wp-id": b"L" * 1000}) for i in range(len(too_long))]
    records = [r for recs, _ in waveforms.values() for r in recs] + too_long
    produce_in_order(settings, records)

    report = pipeline.run_once(settings)

    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": len(waveforms)}
    assert report["totals"]["dead_letter"] == len(too_long)
    rows = output_rows(spark, settings)
    assert {r[0]: r[1] for r in rows} == {wid: s for wid, (_, s) in waveforms.items()}
    assert all(r[1] == r[2] for r in rows), "payloads must be bit-exact"
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: len(records)}
    assert report["notes"] == [] and report["validation"]["success"]
    assert Path(report["validation"]["plot"]).stat().st_size > 0
    from PIL import Image

    said = Image.open(report["validation"]["plot"]).text
    assert said["Title"].startswith(f"3 of {len(waveforms)} waveforms published: the longest of each source"), said
    assert said["Description"].count("x axis: ") == 3, said["Description"]
    assert Path(report["report_path"]).exists() and Path(report["report_html"]).exists()


def test_a_waveform_of_the_size_limit_is_ingested_and_one_sample_more_is_quarantined(settings, spark):
    # the default limit with the default Spark settings (the fixture changes neither)
    defaults = Settings()
    assert (settings.max_waveform_bytes, settings.spark_driver_memory, settings.spark_master) == (
        defaults.max_waveform_bytes,
        defaults.spark_driver_memory,
        "local[2]",
    )
    ensure_topic(settings, partitions=2)
    limit, chunk = settings.max_waveform_bytes, 512 * 1024
    sums = {}
    # float32 x 4 channels in 512 KiB chunks, as a raw producer would send them; one at a time in memory
    for partition, (wid, size) in enumerate([("at-limit", limit), ("over-limit", limit + 16)]):
        samples = np.random.default_rng(partition).standard_normal((size // 16, 4), dtype=np.float32)
        records, sums[wid] = _records(wid, samples, chunk_size=chunk)
        assert len(records) == -(-size // chunk)
        produce_in_order(settings, records, partition=partition)
        del samples, records

    report = pipeline.run_once(settings)

    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": 1, "quarantined:too_large": 1}
    assert output_rows(spark, settings) == [("at-limit", sums["at-limit"], sums["at-limit"], report["run_id"])]
    assert quarantine_reasons(spark, settings) == {"over-limit": "too_large"}
    ends = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == ends
