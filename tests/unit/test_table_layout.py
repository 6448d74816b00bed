"""The table-layout benchmark's pure parts: the reads it expects, its goals and its page (the
benchmark itself runs on the Spark engine: `wavepipe bench --table-layout`)."""

from __future__ import annotations

from wavepipe.bench import table_layout
from wavepipe.bench.table_layout import ZORDERED, LayoutOptions, _queries, _rows, cases, goals, save


def test_rows_and_expected_reads_agree():
    options = LayoutOptions(batches=10, sources=2, per_batch=4, waveform_bytes=64, hours=10.0, reads=3)
    rows = [r for b in range(options.batches) for r in _rows(options, b)]
    assert len({r[0] for r in rows}) == 40 and {len(r[12]) for r in rows} == {64}
    for source, begin, end, expected in _queries(options):
        assert expected == sum(1 for r in rows if r[1] == source and begin <= r[2] < end) > 0
    day = LayoutOptions(batches=4, per_batch=6, waveform_bytes=8)  # 24 hours from noon: two dates
    assert {str(r[3]) for b in range(4) for r in _rows(day, b)} == {"2026-11-20", "2026-11-21"}


def _state(name, median, errors=()):
    return {
        "state": name,
        "files": 8,
        "mb": 1.0,
        "partitions": 8,
        "files_per_partition_max": 1,
        "read_median_s": median,
        "read_min_s": median,
        "read_max_s": median,
        "vs_one_batch": round(median / 0.5, 2),
        "day_median_s": median * 4,
        "day_vs_one_batch": round(median / 0.5, 2),
        "errors": list(errors),
    }


def _result(states):
    step = {"files_removed": 160, "files_added": 8, "seconds": 5.0}
    return {
        "started": "20261125T070000",
        "seconds": 100.0,
        "options": dict(LayoutOptions(command="wavepipe bench --table-layout").__dict__),
        "machine": {
            "cpu": "cpu",
            "cores": 2,
            "memory_gib": 24,
            "os": "Linux",
            "python": "3.11",
            "pyspark": "4",
            "delta_spark": "4",
            "wavepipe_commit": "abc",
        },
        "append_s": 80.0,
        "one_batch_write_s": 5.0,
        "optimize": {"compact": step, "zorder": step},
        "vacuum": {"files_deleted": 168, "bytes_deleted": 4e6, "seconds": 3.0},
        "states": states,
    }


def test_goals_and_the_page(tmp_path, monkeypatch):
    met = _result(
        [
            _state("one batch", 0.5),
            _state("micro-batches", 1.4),
            _state("compacted", 0.55),
            _state(ZORDERED, 0.4),
        ]
    )
    assert [g[1] for g in goals(met)] == [True, True, True]
    missed = _result(
        [
            _state("one batch", 0.5),
            _state("micro-batches", 1.4, ["a read found 3 rows, expected 4"]),
            _state("compacted", 0.7),
            _state(ZORDERED, 0.4),
        ]
    )
    assert [g[1] for g in goals(missed)] == [False, True, False]
    assert "a read found 3 rows" in goals(missed)[2][2]

    def broken_chart(result, path):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(table_layout, "chart", broken_chart)  # the chart only describes: the rest is saved
    paths = save(missed, tmp_path)
    assert [p.name for p in paths] == ["table-layout.json", "table-layout.md"]
    page = (tmp_path / "table-layout.md").read_text()
    assert "| compacted | 8 | 1.0 | 8 | 1 | 0.7 |" in page and "MISSED: compacted: a read within 1.2x" in page
    assert "(compaction): 160 files rewritten into 8 in 5.0 s;" in page
    # a compaction that found nothing to rewrite says why on the page instead of failing it
    missed["optimize"]["zorder"] = {"table": "waveforms", "skipped": "2 partition(s), 2 file(s): each holds one file"}
    page = table_layout.to_markdown(missed)
    assert "on the micro-batches: rewrote nothing (2 partition(s), 2 file(s): each holds one file)." in page


def test_the_cases_and_what_a_commit_costs_on_the_page(tmp_path):
    few, many = cases(False, "wavepipe bench --table-layout")
    assert (few.sources, many.sources, many.per_batch, many.legacy_batches) == (4, 1000, 1000, 3)
    assert {r[1] for r in _rows(many, 0)} == {f"station-{i}" for i in range(1000)}, "every source in every batch"
    assert [c.name for c in cases(True, "")] == ["table-layout", "table-layout-1000-sources"]
    result = _result([_state("one batch", 0.5), _state("micro-batches", 0.6), _state("compacted", 0.5)])
    result["options"] = dict(many.__dict__)
    result["commits"] = {
        "partition_by": ["date"],
        "files_per_commit": 1.0,
        "commit_median_s": 0.5,
        "commit_max_s": 0.9,
        "seconds": 20.0,
        "legacy": {
            "partition_by": ["source", "date"],
            "batches": 3,
            "files_per_commit": 1000.0,
            "commit_median_s": 6.0,
            "commit_max_s": 7.0,
            "seconds": 18.0,
        },
    }
    paths = save(result, tmp_path)
    assert paths[0].name == "table-layout-1000-sources.json"
    page = (tmp_path / "table-layout-1000-sources.md").read_text()
    assert "from 1000 sources" in page and "partitioned by date: 1 file(s), 0.5 s" in page
    assert "partitioned by source, date (wavepipe up to 77ad3ff), 3 commits: 1000 files each, 6.0 s" in page
    assert "12.0x the time" in page and "![read time per layout](table-layout-1000-sources.png)" in page
