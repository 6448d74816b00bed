"""`wavepipe bench --quick` as a smoke test: every system runs on the real broker and Spark, every
output is checked against what was produced, and the three result files agree. No timing is
asserted: speed lives in the benchmark's own report (docs/benchmarks/)."""

from __future__ import annotations

import json

import pytest

from wavepipe.bench.results import goals, to_commit_s
from wavepipe.bench.runner import BenchOptions, run_bench, save
from wavepipe.bench.systems import PUBLISH_STAGE

pytestmark = pytest.mark.integration


def test_quick_bench_runs_every_system_and_checks_every_output(settings, tmp_path):
    options = BenchOptions.quick_options(
        large_bytes=4 * 2**20,
        small_bytes=1 * 2**20,
        out_dir=tmp_path / "out",
        systems=("ceiling_confluent", "wavepipe", "wavepipe_no_qc", "python_consumer", "spark_kafka_source"),
    )
    results = run_bench(settings, options)
    assert [m["error"] for m in results["measurements"] if m["error"]] == []
    warm = [m for m in results["measurements"] if m["workload"] == "warm_small"]
    # two small runs in one home and group, each reading only the ten waveforms produced for it
    assert [m["info"]["repeat"] for m in warm] == [1, 2]
    assert [m["waveforms"] for m in warm] == [10, 10]
    assert [m["info"]["waveforms"].get("output_new") for m in warm] == [10, 10]
    assert warm[1]["check"].startswith("20 waveforms once each"), warm[1]["check"]
    assert {"plan", "consume", "reassemble + validate", "commit"} <= set(warm[1]["stages"])
    assert results["engine_start"] is None  # the tests' engine is shared: its cold start is not taken here
    # the engine's warm-up ran before anything was measured, in its own topic and group, checked like the rest
    [warmup] = results["engine_warmup"]
    assert warmup["error"] is None and warmup["check"].startswith("10 waveforms once each"), warmup
    firsts = [m for m in results["measurements"] if m not in warm and not m["repeat"]]
    measured = {(m["system"], m["workload"], m["scale"]): m for m in firsts}
    expected = {(s, w, 1) for s in options.systems for w in ("large", "small")}
    expected |= {(s, w, 2) for s in options.scale_systems for w in ("large", "small")}
    assert set(measured) == expected and len(firsts) == len(expected)
    # the quality pair once more (quick: one repeat), the other one first, checked like the rest
    repeats = [m for m in results["measurements"] if m["repeat"]]
    assert [(m["system"], m["workload"], m["repeat"]) for m in repeats] == [
        (s, w, 1) for w in ("large", "small") for s in ("wavepipe_no_qc", "wavepipe")
    ]
    for key, m in [*measured.items(), *(((m["system"], m["workload"], "repeat"), m) for m in repeats)]:
        assert m["wall_s"] > 0 and m["mb_s"] > 0, key
        if key[0] == "ceiling_confluent":
            assert m["check"] == f"{m['payload_bytes']} bytes written"
            assert m["of_ceiling"] == 1.0
        else:
            assert m["check"].startswith(f"{m['waveforms']} waveforms once each"), (key, m["check"])
            assert m["of_ceiling"] > 0
    wavepipe = measured[("wavepipe", "large", 2)]
    assert wavepipe["waveforms"] == 2 * measured[("wavepipe", "large", 1)]["waveforms"]
    assert {
        "plan",
        "consume",
        "reassemble + validate",
        "commit",
        "validate: Great Expectations suites",
        "describe: plots and Data Docs, after the commit",
        "describe: Data Docs",
        PUBLISH_STAGE,
    } <= set(wavepipe["stages"])
    assert wavepipe["memory"]["consumer"]["processes"] >= 1
    # the warm small runs read as `wavepipe run` does a small plan: in threads, no reader process
    assert all("consumer" not in m["memory"] for m in warm), [m["memory"].keys() for m in warm]
    assert wavepipe["memory"]["spark_jvm"]["max_process_rss_mb"] > 100
    assert measured[("spark_kafka_source", "small", 1)]["memory"]["spark_jvm"]["max_process_rss_mb"] > 100

    paths = save(results, options.out_dir)
    assert [p.name for p in paths] == ["results.json", "results.md", "throughput.png"]
    assert json.loads(paths[0].read_text())["measurements"] == results["measurements"]
    page = paths[1].read_text()
    assert f"| wavepipe (end to end) | {wavepipe['wall_s']:.1f} |" in page
    assert f"| 2 | {to_commit_s(warm[1]):.1f} | {warm[1]['wall_s']:.1f} |" in page
    assert (
        f"1 throw-away small run(s) like those below warmed the engine up (its JIT, its caches), as a "
        f"long-lived engine is: {warmup['wall_s']:.1f} s." in page
    )
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    verdicts = {name: met for name, met, _ in goals(results)}
    assert None not in verdicts.values(), verdicts  # every goal had its numbers
    assert len([name for name in verdicts if name.startswith("quality metrics add")]) == 2
    for workload in ("large", "small"):  # measuring quality starts no Spark job of its own
        with_qc, without = (measured[(s, workload, 1)]["info"]["spark_jobs"] for s in ("wavepipe", "wavepipe_no_qc"))
        assert with_qc == without and with_qc > 0, (workload, with_qc, without)


def test_consume_scaling_reads_the_same_backlog_over_1_2_and_4_partitions(settings, tmp_path):
    from wavepipe.bench.consume_scaling import measure_consume_scaling
    from wavepipe.bench.consume_scaling import save as save_scaling

    result = measure_consume_scaling(settings, tmp_path / "work", total_bytes=8 * 2**20, repeats=1)
    rows = {(r["partitions"], r["readers"]): r for r in result["rows"]}
    assert set(rows) == {(1, 1), (2, 1), (2, 2), (4, 1), (4, 4)}
    for (partitions, _), row in rows.items():
        assert row["bytes"] == 8 * 2**20 and row["mb_s"] > 0 and row["read_s"] <= row["wall_s"] + 0.05
        assert 0 < len(row["chunks_per_partition"]) <= partitions  # partitions the keyed waveforms went to
        assert sum(row["chunks_per_partition"].values()) == 8 * 16  # 8 waveforms of 16 chunks, each read once
    assert all(row["vs_one_reader"] > 0 for row in rows.values())
    md = save_scaling(result, tmp_path / "out")[1].read_text()
    assert md.count("\n| ") == 6  # header + five measurements


def test_table_layout_measures_every_state_and_finds_every_waveform_once(settings, tmp_path):
    """``wavepipe bench --table-layout``'s functions on its quick case that takes every code path (the
    earlier source/date layout too), cut to two micro-batches per date partition (so compaction has
    files to rewrite) and one read of each kind: the reads still find rows (asserted below)."""
    import dataclasses

    from wavepipe.bench import table_layout
    from wavepipe.bench.table_layout import ZORDERED

    options = dataclasses.replace(
        table_layout.cases(True, "wavepipe bench --table-layout --quick")[-1], batches=4, legacy_batches=1, reads=1
    )
    assert options.legacy_batches and options.sources > 1
    result = table_layout.run_layout(settings, options)

    by = {s["state"]: s for s in result["states"]}
    assert list(by) == ["one batch", "micro-batches", "compacted", ZORDERED]
    for name, s in by.items():
        assert s["errors"] == [], (name, s["errors"])  # every read's rows and bytes as written
        assert s["rows_per_read"] and all(n > 0 for n in s["rows_per_read"]), (name, s["rows_per_read"])
        assert s["rows_per_day_read"] and all(n > 0 for n in s["rows_per_day_read"]), name
        assert s["partitions"] == 2 and s["mb"] > 0, (name, s)  # start times over two dates
        for key in ("read_median_s", "day_median_s", "dedupe_median_s", "dedupe_join_median_s"):
            assert s[key] > 0, (name, key, s[key])
        assert s["vs_one_batch"] > 0 and s["day_vs_one_batch"] > 0 and s["dedupe_vs_one_batch"] > 0, (name, s)
    micro_files = by["micro-batches"]["files"]
    assert micro_files >= options.batches  # a file or more a commit
    for name in ("one batch", "compacted", ZORDERED):
        assert by[name]["files"] == 2 and by[name]["files_per_partition_max"] == 1, (name, by[name])
    compact, zorder = result["optimize"]["compact"], result["optimize"]["zorder"]
    for step in (compact, zorder):  # both rewrote the micro-batches' files, one per date
        assert (step["files_removed"], step["files_added"], step["files_before"]) == (micro_files, 2, micro_files), step
    assert "ZORDER BY" in zorder["sql"] and "ZORDER BY" not in compact["sql"]
    assert result["vacuum"]["files_deleted"] == micro_files and result["vacuum"]["bytes_deleted"] > 0
    commits, legacy = result["commits"], result["commits"]["legacy"]
    assert commits["batches"] == options.batches and commits["partition_by"] == ["date"]
    assert commits["commit_median_s"] > 0 and commits["files_per_commit"] >= 1
    # the earlier layout: a file per source (and date) in each commit
    assert legacy["batches"] == 1 and legacy["partition_by"] == ["source", "date"]
    assert legacy["files_per_commit"] >= options.sources
    assert result["append_s"] > 0 and result["seconds"] > 0
    assert list((settings.home / "bench").iterdir()) == []  # its home and engine went with it

    verdicts = {name: met for name, met, _ in table_layout.goals(result)}
    assert len(verdicts) == 3 and None not in verdicts.values(), verdicts  # every goal had its numbers
    assert verdicts["every waveform exactly once in every state"] is True
    paths = table_layout.save(result, tmp_path / "out")
    assert [p.name for p in paths] == [f"{options.name}.{ext}" for ext in ("json", "png", "md")]
    assert json.loads(paths[0].read_text())["states"] == result["states"]
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths[2].read_text()
    for s in result["states"]:
        row = f"| {s['state']} | {s['files']} | {s['mb']} | {s['partitions']} | {s['files_per_partition_max']} | "
        assert row + f"{s['read_median_s']} | {s['read_min_s']} | {s['read_max_s']} | {s['vs_one_batch']}x |" in page
    assert f"(compaction): {micro_files} files rewritten into 2 in {compact['seconds']} s;" in page
    assert f"on the micro-batches: {micro_files} files rewritten into 2 in {zorder['seconds']} s." in page
    assert f": {result['vacuum']['files_deleted']} replaced files" in page
    assert f"{legacy['files_per_commit']:g} files each" in page
    assert "- met: every waveform exactly once in every state (yes)" in page
    assert f"![read time per layout]({options.name}.png)" in page


def test_txn_state_keeps_one_transaction_entry_where_an_id_per_run_grows(settings, tmp_path):
    """``wavepipe bench --txn-state``'s functions at the smallest size with two samples of the state
    (two checkpoints) and one append through wavepipe's Spark writer to each grown table."""
    from wavepipe.bench import txn_state
    from wavepipe.delta_txn import txn_version

    size = txn_state.TxnStateSize.quick(commits=200, spark_appends=1)
    assert size.sample_every == txn_state.CHECKPOINT_EVERY
    result = txn_state.measure(settings, size)

    schemes = result["schemes"]
    assert list(schemes) == list(txn_state.SCHEMES)
    for scheme, data in schemes.items():
        samples = data["samples"]
        assert [s["commits"] for s in samples] == [100, 200], scheme
        assert [s["checkpoint_version"] for s in samples] == [99, 199], scheme  # a fresh checkpoint each
        assert all(s["checkpoint_bytes"] > 0 and 0 < s["commit_ms_median"] <= s["commit_ms_p95"] for s in samples)
        assert len(data["spark_append_s"]) == 1 and data["spark_append_s_median"] > 0, data
    per_run, stable = schemes["id_per_run"]["samples"], schemes["stable_id"]["samples"]
    assert [s["txn_entries"] for s in per_run] == [100, 200]  # an entry a run, kept in every checkpoint
    assert [s["txn_entries"] for s in stable] == [1, 1]
    assert per_run[1]["checkpoint_bytes"] > per_run[0]["checkpoint_bytes"] > stable[0]["checkpoint_bytes"]
    # the Spark append landed with its transaction: the stable id's version went on from the commits'
    tables = settings.home / "bench" / f"txn-state-{result['started']}" / "tables"
    assert txn_version(str(tables / "stable_id"), txn_state._txn("stable_id", 1)[0]) == 201
    assert txn_version(str(tables / "id_per_run"), txn_state._txn("id_per_run", 201)[0]) == 1

    goals = txn_state.goals(result)
    verdicts = {name: met for name, met, _ in goals}
    assert verdicts["one transaction entry"] is True and verdicts["checkpoint size flat"] is True, goals
    assert isinstance(verdicts["commit time flat"], bool)  # measured, not asserted
    assert txn_state.state_kept(result)  # what the CLI exits on
    paths = txn_state.save(result, tmp_path / "out")
    assert [p.name for p in paths] == ["txn-state.json", "txn-state.png", "txn-state.md"]
    assert json.loads(paths[0].read_text())["schemes"] == schemes
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths[2].read_text()
    assert page.startswith("# Transaction state over 200 micro-batch commits")
    for scheme, data in schemes.items():
        for s in data["samples"]:
            assert f"| {scheme} | {s['commits']:,} | {s['txn_entries']:,} | {s['checkpoint_bytes']:,} |" in page
        assert f"| {scheme} | {data['spark_append_s_median']} |" in page
    assert "(median of 1)" in page and "- met: one transaction entry (1 -> 1)" in page
