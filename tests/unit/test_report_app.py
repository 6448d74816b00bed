"""The API server's run pages app: what it serves, from where, and what it refuses (the routes
without Airflow's login, which tests/integration/test_airflow_ui.py and test_pages_apart.py check
through the real API server)."""

from __future__ import annotations

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from wavepipe import pages
from wavepipe.offline_docs import SITE_FOLDER
from wavepipe.plugins.report_app import build_app, inside
from wavepipe.state import LocalState

RESULT = "validations/wavepipe_waveforms/run_1/20261126T225540.119237Z/wavepipe_in_client-wavepipe_waveforms.html"


def test_only_files_inside_the_folder_are_served(tmp_path):
    (tmp_path / "site" / "validations").mkdir(parents=True)
    (tmp_path / "site" / "validations" / "r.html").write_text("results")
    (tmp_path / "secret").write_text("no")
    (tmp_path / "site" / "out").symlink_to(tmp_path / "secret")
    assert inside(tmp_path / "site", "validations/r.html").read_text() == "results"
    for bad in ("../secret", "out", "/etc/passwd", "validations", "missing.html"):
        with pytest.raises(HTTPException) as raised:
            inside(tmp_path / "site", bad)
        assert raised.value.status_code == 404


@pytest.fixture
def client(tmp_path, monkeypatch):
    """The app on a state apart from this server's (empty) home, the login taken as given."""
    monkeypatch.setenv("WAVEPIPE_HOME", str(tmp_path / "api-home"))
    monkeypatch.setenv("WAVEPIPE_STATE_URI", str(tmp_path / "state"))
    app = build_app()
    (login,) = app.router.dependencies
    app.dependency_overrides[login.dependency] = lambda: None
    state = LocalState(tmp_path / "state")
    docs = "file:///home/worker/gx/uncommitted/data_docs/local_site"
    state.write("reports/run_1.html", f'<a href="{docs}/{RESULT}">results</a>'.encode())
    state.write("reports/run_1.json", b'{"run_id": "run_1"}')
    state.write(pages.data_docs_key(RESULT), b"<h1>results</h1>")
    state.write("gx/secret.json", b"not a page")
    (tmp_path / "secret.html").write_text("outside the state")
    with TestClient(app) as served:
        yield served


def test_pages_are_served_from_the_run_state(client):
    page = client.get("/reports/run_1.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == f'<a href="/wavepipe/data-docs/{RESULT}">results</a>'
    # a run page shows what producers sent: served, it can run no script and load nothing
    assert "script-src" not in page.headers["content-security-policy"]
    assert page.headers["content-security-policy"].startswith("default-src 'none';")
    assert page.headers["x-content-type-options"] == "nosniff"
    report = client.get("/reports/run_1.json")
    assert report.json() == {"run_id": "run_1"} and report.headers["content-type"] == "application/json"
    docs = client.get(f"/data-docs/{RESULT}")
    assert docs.status_code == 200 and docs.text == "<h1>results</h1>" and "text/html" in docs.headers["content-type"]


def test_the_data_docs_assets_come_from_the_packages(client):
    jquery = client.get(f"/data-docs/{SITE_FOLDER}/jquery.min.js")
    assert jquery.status_code == 200 and "jQuery" in jquery.text[:500]
    assert client.get("/data-docs/static/images/logo-long.png").content[:4] == b"\x89PNG"  # GX's own
    assert client.get(f"/data-docs/{SITE_FOLDER}/../../../../secret.html").status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/reports/run_2.html",  # not kept
        "/reports/run_1.txt",  # not a page's name
        "/reports/..%2Fsecret.html",
        "/reports/%2e%2e",
        "/data-docs/%2e%2e/%2e%2e/secret.html",
        "/data-docs/validations/%2e%2e/%2e%2e/%2e%2e/gx/secret.json",
        "/data-docs/validations//x.html",
        "/data-docs/validations/x%20y.html",
        "/data-docs/index.html",  # not kept
    ],
)
def test_what_is_not_a_kept_page_is_not_found(client, path):
    answer = client.get(path)
    assert answer.status_code == 404, (path, answer.text)
    assert "outside the state" not in answer.text and "not a page" not in answer.text


def test_a_store_that_does_not_answer_is_said_so(client, monkeypatch):
    from wavepipe.storage import StorageUnavailableError

    def no_answer(self, key):
        raise StorageUnavailableError("the run state's object store (s3://b/state) failed: no answer")

    monkeypatch.setattr(LocalState, "read", no_answer)
    answer = client.get("/reports/run_1.html")
    assert answer.status_code == 503 and "s3://b/state" in answer.json()["detail"]
