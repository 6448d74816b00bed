"""What describes a published run is made after its commit (``spark_apps.describe``): one Data Docs
build for several runs, the plots of the last, each run's notes saying what it shares."""

from __future__ import annotations

import pytest

from wavepipe.contracts.config import load_settings
from wavepipe.contracts.steps import Published, Validated, ValidatedRows
from wavepipe.spark_apps import describe


def _description(settings, run_id: str, flagged: int = 0) -> describe.Description:
    result = Validated(
        run_id=run_id, group="g", topic="t", checked_at="now", suite_version=1, success=True, suites=[],
        data_docs_index="", rows=ValidatedRows(waveforms=1, waveform_bytes=1, staged_records=1), thresholds={},
        timings={"expectations_s": 0.1234},
    )  # fmt: skip
    published = Published(
        run_id=run_id, output_table_version=3, quality={"flagged": flagged} if flagged is not None else None
    )
    notes: list[str] = []
    return describe.Description(
        settings, result, published, describe.plots.Picked([{"waveform_id": run_id}], "rule"), run_id, notes
    )


@pytest.fixture
def made(monkeypatch, tmp_path):
    calls: dict[str, list] = {"docs": [], "plot": [], "flagged": []}

    def build(docs):
        calls["docs"].append(list(docs))
        return [f"file:///docs/{d}/index.html" for d in docs]

    monkeypatch.setattr(describe, "build_data_docs", build)
    monkeypatch.setattr(describe.plots, "plot_picked", lambda p, s, run_id, n: calls["plot"].append(run_id) or "p.png")
    monkeypatch.setattr(describe.plots, "plot_flagged", lambda s, run_id, v: calls["flagged"].append(run_id) or "f.png")
    return load_settings(home=str(tmp_path / "home")), calls


def test_several_runs_are_described_at_once_with_the_plots_of_the_last(made):
    settings, calls = made
    runs = [_description(settings, f"r{i}", flagged=2) for i in (1, 2, 3)]
    results = describe.make(runs)
    assert calls["docs"] == [["r1", "r2", "r3"]], "one Data Docs build for all of them"
    assert calls["plot"] == ["r3"] and calls["flagged"] == ["r3"]
    assert [r.data_docs_index for r in results] == [f"file:///docs/r{i}/index.html" for i in (1, 2, 3)]
    assert results[2].plot == "p.png" and results[2].flagged_plot == "f.png" and results[2].notes == []
    for r in results[:2]:
        assert r.plot is None and r.flagged_plot is None
        assert r.notes == ["described with run r3: its plots show that run's waveforms, not this one's"]
    assert results[0].timings["expectations_s"] == 0.123 and "data_docs_s" in results[0].timings
    assert describe.make([]) == []


@pytest.mark.parametrize("flagged", [0, None])
def test_the_flagged_plot_is_drawn_only_when_the_run_published_flagged_waveforms(made, flagged):
    settings, calls = made
    (result,) = describe.make([_description(settings, "r1", flagged=flagged)])
    assert calls["flagged"] == [] and calls["plot"] == ["r1"]
    assert "flagged_plot_s" not in result.timings


def test_a_description_waits_in_the_process_until_its_commit_takes_it_once(made):
    settings, _ = made
    d = _description(settings, "r9")
    describe.defer(d)
    assert describe.take("r9") is d and describe.take("r9") is None
