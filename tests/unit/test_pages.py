"""A run's pages in the run state (wavepipe.pages): keys made only of checked names, a worker's
Data Docs links read on any host, what a run keeps and how many, and that keeping them never
fails a run yet lets a programming error through."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from wavepipe import pages, pipeline
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.runfiles import html_path, json_path, plot_path
from wavepipe.run_store import RunStore
from wavepipe.state import LocalState
from wavepipe.storage import StorageUnavailableError

RESULT = "validations/wavepipe_waveforms/run_1/20261126T225540.119237Z/wavepipe_in_client-wavepipe_waveforms.html"


def test_keys_are_made_only_of_checked_names():
    assert pages.report_key("manual__2026-01-01T00_00_00_00_00.html") == (
        "reports/manual__2026-01-01T00_00_00_00_00.html"
    )
    assert pages.report_key("run_1.json") == "reports/run_1.json"
    assert pages.data_docs_key(RESULT) == f"gx/uncommitted/data_docs/local_site/{RESULT}"
    for bad in ("../x.html", "a/b.json", "x.txt", "x.html/..", "", "x.html\n"):
        with pytest.raises(ValueError, match="not a run page"):
            pages.report_key(bad)
    for bad in ("../secret", "validations/../../x", "/etc/passwd", "a//b.html", ".", "a/./b", "a\\..\\b", "a b", ""):
        with pytest.raises(ValueError, match="not a Data Docs page"):
            pages.data_docs_key(bad)


def test_a_workers_data_docs_links_point_at_the_app_on_any_host():
    other = "file:///home/worker/wavepipe/gx/uncommitted/data_docs/local_site"
    assert pages.site_path(f"{other}/{RESULT}") == RESULT
    assert pages.site_path(f"{other}/index.html") == "index.html"
    assert pages.site_path("https://example.org/uncommitted/data_docs/local_site/index.html") is None
    assert pages.site_path("file:///elsewhere/index.html") is None
    html = (
        f'<a href="{other}/index.html">Data Docs</a> <a href="run_1.json">JSON</a> '
        f'<a href="file:///srv/w 2/gx/uncommitted/data_docs/local_site/{RESULT}">results</a>'
    )
    assert pages.served_page(html, "/base/wavepipe") == (
        '<a href="/base/wavepipe/data-docs/index.html">Data Docs</a> <a href="run_1.json">JSON</a> '
        f'<a href="/base/wavepipe/data-docs/{RESULT}">results</a>'
    )


def _site(settings, run_id: str) -> list[Path]:
    """A worker's Data Docs site with a validation of ``run_id``: the index and its result page."""
    site = pages.data_docs_root(settings)
    built = [site / "index.html", site / RESULT.replace("run_1", run_id)]
    for page in built:
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"<p>{page.name} of {run_id}</p>")
    return built


def _run(store: RunStore, run_id: str, at: float) -> None:
    """What a run writes: its Data Docs (validate step), its plot, page and report (commit step)."""
    built = _site(store.settings, run_id)
    pages.keep_data_docs(store, run_id, built[0].parent, built)
    page = html_path(store.settings, run_id)
    plot = plot_path(store.settings, run_id)
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot.write_bytes(b"\x89PNG")
    page.write_text(f"<h1>{run_id}</h1>")
    pages.keep_page(store, run_id)
    store.save_report({"run_id": run_id})
    for key in (f"reports/{run_id}.html", f"reports/{run_id}{pages.OWN_PAGES}"):
        os.utime(Path(store.state.where(key)), (at, at))
    for path in (page, json_path(store.settings, run_id), plot.parent):  # the worker's own copies
        os.utime(path, (at, at))


def _home_reports(store: RunStore) -> list[str]:
    return sorted(p.name for p in store.settings.reports_dir.iterdir())


def test_a_state_apart_from_the_home_keeps_each_runs_pages_and_the_last_runs_only(tmp_path):
    store = RunStore(load_settings(home=tmp_path / "worker", state_uri=str(tmp_path / "state")))
    state = LocalState(tmp_path / "state")  # what the API server reads
    for i, run_id in enumerate(("run_1", "run_2", "run_3")):
        _run(store, run_id, at=1_000_000 + i)
    assert state.read("reports/run_3.html") == b"<h1>run_3</h1>"
    assert (
        state.read(pages.data_docs_key(RESULT.replace("run_1", "run_3")))
        == b"<p>wavepipe_in_client-wavepipe_waveforms.html of run_3</p>"
    )
    assert state.read(pages.data_docs_key("index.html")) == b"<p>index.html of run_3</p>"  # as the last run left it
    assert json.loads(state.read("reports/run_3.data-docs")) == [RESULT.replace("run_1", "run_3")]

    assert pages.prune(store.state, kept=2) == ["run_1"]
    assert state.read("reports/run_1.html") is None and state.read("reports/run_1.data-docs") is None
    assert state.read(pages.data_docs_key(RESULT)) is None
    assert state.read("reports/run_1.json") is None  # its report goes too: the state stays bounded
    assert state.read("reports/run_2.json") is not None
    assert state.read("reports/run_2.html") and state.read(pages.data_docs_key(RESULT.replace("run_1", "run_2")))
    assert state.read(pages.data_docs_key("index.html")) is not None
    assert pages.prune(store.state, kept=2) == []

    home = LocalState(store.settings.home)  # the worker's own copies are bounded alike
    assert _home_reports(store) == [*(f"run_{i}{end}" for i in (1, 2, 3) for end in ("", ".html", ".json"))]
    assert pages.prune(home, kept=2) == ["run_1"]
    assert _home_reports(store) == [*(f"run_{i}{end}" for i in (2, 3) for end in ("", ".html", ".json"))]


def test_a_retried_validation_adds_its_pages_to_the_runs_own(tmp_path):
    store = RunStore(load_settings(home=tmp_path / "worker", state_uri=str(tmp_path / "state")))
    first = _site(store.settings, "run_1")
    pages.keep_data_docs(store, "run_1", first[0].parent, first)
    again = first[0].parent / RESULT.replace("20261126T225540", "20261126T230000")
    again.parent.mkdir(parents=True)
    again.write_text("retried")
    pages.keep_data_docs(store, "run_1", first[0].parent, [first[0], again])
    own = json.loads(store.state.read("reports/run_1.data-docs"))
    assert own == sorted([RESULT, RESULT.replace("20261126T225540", "20261126T230000")])
    store.state.write("reports/run_1.data-docs", b'[1, "../../etc", "' + RESULT.encode() + b'"]')
    assert pages._own_pages(store.state, "run_1") == [RESULT]  # an edited list: only site paths are taken


def test_a_state_that_is_the_home_holds_nothing_twice(tmp_path):
    store = RunStore(load_settings(home=tmp_path / "home", state_uri=""))
    _run(store, "run_1", at=1_000_000)
    assert store.state.read("reports/run_1.html") == b"<h1>run_1</h1>"  # the page itself
    assert store.state.where(pages.data_docs_key(RESULT)) == str(pages.data_docs_root(store.settings) / RESULT)
    assert store.state.read(pages.data_docs_key(RESULT)) is not None
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["gx", "reports"]
    _run(store, "run_2", at=1_000_001)
    assert pages.prune(store.state, kept=1) == ["run_1"]  # its plot goes with its page
    assert _home_reports(store) == ["run_2", "run_2.data-docs", "run_2.html", "run_2.json"]
    assert store.state.read(pages.data_docs_key(RESULT)) is None


def _report(settings, run_id: str) -> dict:
    return {"run_id": run_id, "group": settings.group, "topic": settings.topic, "partitions": {}}


def test_a_store_that_fails_leaves_a_note_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    settings = load_settings(home=tmp_path / "home", state_uri=str(tmp_path / "state"))
    written = LocalState.write

    def failing(self, key: str, data: bytes) -> None:
        if key.endswith(".html"):
            raise StorageUnavailableError("the run state's object store (s3://b/state) failed: no answer")
        written(self, key, data)

    monkeypatch.setattr(LocalState, "write", failing)
    report = _report(settings, "run_1")
    pipeline._write_report(settings, report)
    assert "keeping the run's page in the run state failed: the run state's object store" in report["notes"][-1]
    assert json.loads(json_path(settings, "run_1").read_text())["notes"] == report["notes"]
    assert json.loads(LocalState(tmp_path / "state").read("reports/run_1.json"))["run_id"] == "run_1"
    assert [r.message for r in caplog.records if "run state failed" in r.message] == [
        f"{report['notes'][-1]}; the run goes on (a note in its report)"
    ]


def test_a_programming_error_in_keeping_the_pages_is_not_hidden(tmp_path, monkeypatch):
    settings = load_settings(home=tmp_path / "home", state_uri=str(tmp_path / "state"))

    def broken(store, run_id):
        raise TypeError("keep_page() takes 2 positional arguments but 3 were given")

    monkeypatch.setattr(pages, "keep_page", broken)
    with pytest.raises(TypeError, match="positional arguments"):
        pipeline._write_report(settings, _report(settings, "run_1"))
