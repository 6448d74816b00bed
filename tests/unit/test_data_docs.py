"""What the Great Expectations Data Docs of a run show: each expectation with the thresholds it
used and what it observed, the run's quarantined share with every quarantine reason behind it
(the reassembly's too_large and checksum_mismatch too), what each suite ran on, and nothing of
GX's own (newsletter footer, tutorials banner, walkthrough script); the task's link opens the
run's own results."""

from __future__ import annotations

import html as htmllib
import re
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

import pandas as pd
import pytest

from wavepipe import expectations
from wavepipe.contracts.config import load_settings
from wavepipe.offline_docs import tidy

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _text(page: str) -> str:
    """A page's visible words (scripts and styles left out), spaces collapsed."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", page)))


def test_each_description_states_the_values_used_not_the_settings_names():
    settings = load_settings(
        validate_sample_rate_min=10,
        validate_sample_rate_max=12_000,
        validate_start_time_min="2020-01-01T00:00:00Z",
        validate_start_time_max_ahead_s=3600,
        validate_max_quarantined_share=0.25,
        validate_quarantine_judged_from=50,
    )
    said = {
        getattr(e, "column", None): e.description
        for suite in expectations.suites(settings, NOW).values()
        for e in suite
    }
    assert "between 10 Hz and 12,000 Hz" in said["sample_rate"], said["sample_rate"]
    assert "between 2020-01-01T00:00:00Z and 2026-11-22T13:00:00Z" in said["start_time"], said["start_time"]
    assert "at most 25%" in said["quarantined_share"] and "50 waveforms" in said["quarantined_share"]


def test_the_run_row_lists_every_quarantine_reason_with_its_count():
    waveforms = {
        "output_new": 6,
        "quarantined:too_large": 3,
        "quarantined:checksum_mismatch": 1,
        "quarantined:expect_column_values_to_be_between(sample_rate)": 1,
        "output_redelivered": 2,
    }
    frame = expectations.run_frame(waveforms, judged_from=5)
    row = frame.iloc[0]
    assert (row["waveforms_judged"], row["quarantined"], row["quarantined_share"]) == (11, 5, 5 / 11)
    assert row[expectations.REASONS_COLUMN] == (
        "too_large 3, checksum_mismatch 1, expect_column_values_to_be_between(sample_rate) 1"
    )
    said = expectations.observed_value("expect_column_values_to_be_between", {"column": "quarantined_share"}, frame)
    assert said == "45.45%: 5 of 11 waveforms quarantined (too_large 3, checksum_mismatch 1, " + (
        "expect_column_values_to_be_between(sample_rate) 1)"
    )
    few = expectations.run_frame({"output_new": 2, "quarantined:too_large": 1}, judged_from=100)
    said = expectations.observed_value("expect_column_values_to_be_between", {"column": "quarantined_share"}, few)
    assert said == "not judged (3 waveforms, fewer than needed): 1 quarantined (too_large 1)"
    none = expectations.run_frame({"output_new": 0}, judged_from=1)
    assert pd.isna(none.iloc[0][expectations.REASONS_COLUMN])


def test_observed_values_say_the_range_seen_and_how_many_lie_outside():
    frame = pd.DataFrame(
        {
            "sample_rate": [500.0, 100.0, 0.0001],
            "start_time": pd.to_datetime(["2026-11-01T00:00:00Z", "2026-11-01T00:01:00Z", "2026-11-01T00:02:00Z"]),
            "numbers_finite": [True, True, False],
        }
    )
    between = "expect_column_values_to_be_between"
    rate = expectations.observed_value(between, {"column": "sample_rate", "min_value": 0.001, "max_value": 1e9}, frame)
    assert rate == "0.0001 Hz to 500 Hz in 3 waveforms; 1 outside"
    bounds = {
        "column": "start_time",
        "min_value": "2026-11-01T00:00:30Z",
        "max_value": datetime(2030, 1, 1, tzinfo=UTC),
    }
    assert expectations.observed_value(between, bounds, frame) == (
        "2026-11-01T00:00:00Z to 2026-11-01T00:02:00Z in 3 waveforms; 1 outside"
    )
    assert expectations.observed_value("expect_column_values_to_be_in_set", {"column": "numbers_finite"}, frame) == (
        "True: 2, False: 1 (of 3 waveforms)"
    )
    assert expectations.observed_value(between, {"column": "absent"}, frame) is None
    assert expectations.observed_value(between, {"column": "sample_rate"}, frame.iloc[:0]) == "no values in 0 waveforms"


GX_PAGE = """<html><body>
    <script>
        try {
          if (localStorage.getItem('ge-walkthrough-modal-dismissed') !== 'true') {
            $(".ge-walkthrough-modal").modal();
          }
        } catch(error) {}
    </script>
<span class="h6" >Expectation Suite:</span> <a href="x.html" >wavepipe_run.v3</a><br> Data asset: None<br> Status
<footer>
  <p>Stay current on everything GX with our newsletter <a href="https://greatexpectations.io/newsletter?utm_source=datadocs">Subscribe</a></p>
</footer>
<footer class="alert" id="ge-cta-footer" role="alert" >
    To continue exploring Great Expectations check out one of these tutorials...
</footer>
<script>
  if (sessionStorage.getItem("showCta") !== "false") { $('#ge-cta-footer').removeClass("invisible") }
</script>
<script>var kept = 1;</script>
</body></html>"""


def test_tidy_drops_gx_newsletter_tutorials_and_walkthrough_and_names_the_data_asset():
    out = tidy(GX_PAGE, "validations/wavepipe_run/v3/r1/t/wavepipe_in_client-wavepipe_run.v3.html")
    for gone in ("newsletter", "ge-cta-footer", "tutorials", "walkthrough", "Data asset: None"):
        assert gone not in out, gone
    assert "Data asset: the run as a whole (one row)<br>" in out
    assert "<script>var kept = 1;</script>" in out and "Expectation Suite:" in out
    assert "Data asset" not in tidy(GX_PAGE, "index.html")  # no suite to name: the line goes
    assert tidy(out, "x.html") == out


@pytest.fixture
def built(tmp_path, monkeypatch):
    """Build a run's Data Docs as ``spark_apps.validate.run_suites`` does (a file GX context,
    checkpoints, the results stored, the site built and localized), with each stored result
    shown with what it observed (``expectations.show_observed``) before its pages are built."""
    from wavepipe.spark_apps import validate

    checked = pd.DataFrame(
        {
            "waveform_id": ["ecg-1", "ecg-2", "slow"],
            "checksum": ["sha256:a", "sha256:b", "sha256:c"],
            "partition": [0, 0, 0],
            "first_offset": [0, 5, 9],
            "sample_rate": [500.0, 100.0, 1e-6],
            "start_time": pd.to_datetime(["2026-11-01T00:00:00Z", "2026-11-01T00:01:00Z", "2026-11-01T00:02:00Z"]),
            "numbers_finite": [True, True, True],
            "published_by_other_run": [False, False, False],
        }
    )
    original = validate._check

    def check(context, name, expectation_list, frame, run_id, on_failure):
        out = original(context, name, expectation_list, frame, run_id, on_failure)
        for identifier in out[2]:
            result = context.validation_results_store.get(identifier)
            expectations.show_observed(result, frame)
            context.validation_results_store.set(identifier, result)
        return out

    monkeypatch.setattr(validate, "_check", check)

    def judge_run(rejected: dict) -> pd.DataFrame:
        counts = {"output_new": 2, "quarantined:too_large": 3, "quarantined:checksum_mismatch": 1}
        for found in rejected.values():
            key = f"quarantined:{found['reason']}"
            counts[key] = counts.get(key, 0) + 1
        return expectations.run_frame(counts, judged_from=5)

    settings = load_settings(
        home=str(tmp_path / "home"), validate_sample_rate_min=1, validate_max_quarantined_share=0.9
    )
    notes: list[str] = []
    summaries, rejected, docs = validate.run_suites(settings, "r1", checked, judge_run, NOW, notes)
    (index,) = validate.build_data_docs([docs])
    assert notes == [] and index.startswith("file://")
    pages = {s["suite"]: Path(unquote(urlparse(s["data_docs"]).path)).read_text() for s in summaries}
    return pages, Path(unquote(urlparse(index).path)).read_text(), rejected


def test_a_runs_data_docs_show_observed_values_thresholds_and_every_quarantine_reason(built):
    pages, index, rejected = built
    assert list(rejected) == ["slow"]
    waveforms, run = (
        _text(pages[f"{base}.v{expectations.SUITE_VERSION}"]) for base in ("wavepipe_waveforms", "wavepipe_run")
    )
    assert "Observed Value --" not in waveforms and "-- " not in waveforms.split("Observed Value", 1)[1]
    assert "sample rate between 1 Hz and 1e+09 Hz" in waveforms
    assert "1e-06 Hz to 500 Hz in 3 waveforms; 1 outside" in waveforms, waveforms
    assert "2026-11-01T00:00:00Z to 2026-11-01T00:02:00Z in 3 waveforms; 0 outside" in waveforms
    assert "Data asset: the run's new waveforms (one row each)" in waveforms
    assert "at most 90%" in run
    assert (
        "71.43%: 5 of 7 waveforms quarantined (too_large 3, checksum_mismatch 1, "
        "expect_column_values_to_be_between(sample_rate) 1)"
    ) in run, run
    assert "Data asset: the run as a whole (one row)" in run
    for page in (*pages.values(), index):
        assert "newsletter" not in page and 'id="ge-cta-footer"' not in page and "ge-walkthrough-modal" not in page
        assert "Data asset: None" not in page and "tutorials" not in page


def test_the_task_link_opens_the_runs_own_results_not_the_index():
    from wavepipe.plugins.links import results_page

    site = "file:///w/gx/uncommitted/data_docs/local_site"
    passed = {
        "validation": {
            "data_docs_index": f"{site}/index.html",
            "suites": [
                {"suite": "wavepipe_waveforms.v3", "success": True, "data_docs": f"{site}/validations/w.html"},
                {"suite": "wavepipe_run.v3", "success": True, "data_docs": f"{site}/validations/r.html"},
            ],
        }
    }
    assert results_page(passed) == f"{site}/validations/w.html"
    passed["validation"]["suites"][1]["success"] = False
    assert results_page(passed) == f"{site}/validations/r.html"
    assert results_page({"validation": {"suites": [{"success": True, "data_docs": None}]}}) is None
    assert results_page(None) is None and results_page({}) is None


def test_times_pandas_cannot_hold_are_counted_outside_never_raised():
    """A hostile start time (year 1, year 9999) is outside any bound a run can have; describing
    it must not fail the validation it describes."""
    from datetime import UTC, datetime

    import pandas as pd

    from wavepipe.expectations import observed_value

    times = [datetime(2026, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)]
    frame = pd.DataFrame({"start_time": pd.Series(times, dtype=object)})
    bounds = {"column": "start_time", "min_value": "2000-01-01T00:00:00Z", "max_value": "2100-01-01T00:00:00Z"}
    said = observed_value("expect_column_values_to_be_between", bounds, frame)
    assert said.endswith("in 3 waveforms; 2 outside"), said
    only = pd.DataFrame({"start_time": pd.Series(times[1:], dtype=object)})
    assert observed_value("expect_column_values_to_be_between", bounds, only).endswith("; 2 outside")


def _one_waveform() -> pd.DataFrame:
    """A run's checked frame of one good waveform."""
    return pd.DataFrame(
        {
            "waveform_id": ["w"],
            "checksum": ["sha256:a"],
            "partition": [0],
            "first_offset": [0],
            "sample_rate": [100.0],
            "start_time": pd.to_datetime(["2026-11-01T00:00:00Z"]),
            "numbers_finite": [True],
            "published_by_other_run": [False],
        }
    )


def test_the_data_docs_of_several_runs_are_built_at_once_each_run_keeping_its_own_pages(tmp_path):
    """A follow loop's micro-batches since the last description: one build (the index once), and
    each run's summaries link its own pages, which the run state keeps for it."""
    from wavepipe import pages as run_pages
    from wavepipe.run_store import RunStore
    from wavepipe.spark_apps import validate

    checked = _one_waveform()
    settings = load_settings(home=str(tmp_path / "home"))
    runs = {}
    for run_id in ("r1", "r2"):
        notes: list[str] = []
        judge = lambda rejected: expectations.run_frame({"output_new": 1}, judged_from=1)  # noqa: E731
        runs[run_id] = validate.run_suites(settings, run_id, checked, judge, NOW, notes)[2]
    indexes = validate.build_data_docs(list(runs.values()))
    assert len(set(indexes)) == 1 and indexes[0].startswith("file://")
    store = RunStore(settings)
    for run_id, docs in runs.items():
        assert docs.notes == []
        links = [Path(unquote(urlparse(s["data_docs"]).path)) for s in docs.summaries]
        assert len(links) == 2 and all(link.is_file() for link in links), links
        assert run_id in links[0].as_posix()
        kept = run_pages._own_pages(store.state, run_id)
        assert kept and all(run_id in k for k in kept), kept
    assert validate.build_data_docs([]) == []


def test_gx_keeps_the_results_of_the_last_runs_only_and_their_pages_go_with_them(tmp_path, monkeypatch):
    """GX lists its whole results store at each build: it keeps the last runs' results
    (``pages.PAGES_KEPT``), and the site drops the pages of the others."""
    from wavepipe import pages as run_pages
    from wavepipe.spark_apps import validate

    monkeypatch.setattr(run_pages, "PAGES_KEPT", 2)
    checked = _one_waveform()
    settings = load_settings(home=str(tmp_path / "home"))
    judge = lambda rejected: expectations.run_frame({"output_new": 1}, judged_from=1)  # noqa: E731
    site = run_pages.data_docs_root(settings) / "validations"

    def runs_with(folder: Path) -> set[str]:
        return {p.name for p in folder.glob("*/*/*") if p.is_dir()}

    for run_id in ("r1", "r2", "r3"):
        docs = validate.run_suites(settings, run_id, checked, judge, NOW, [])[2]
        assert validate.build_data_docs([docs])[0].startswith("file://") and docs.notes == []
    assert runs_with(settings.gx_dir / "uncommitted" / "validations") == {"r2", "r3"}
    assert runs_with(site) == {"r2", "r3"}
    assert "r1/" not in (site.parent / "index.html").read_text() and "r3/" in (site.parent / "index.html").read_text()
