"""Run pages with no shared disk: a run through `wavepipe airflow up` keeps its page and its Data
Docs in the run state in the bucket (the local SeaweedFS), and an API server whose wavepipe home
is another, empty folder (a second API server on the same metadata DB, as a deployment runs it on
a host of its own) serves them from there to a logged-in user, the worker's own copies gone.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import (
    airflow_api,
    airflow_cli,
    make_settings,
    produce_in_order,
    progress,
    trigger_run,
    wait_for_runs,
    waveform_records,
    with_headers,
)
from wavepipe import pages, processes
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.plan import safe_run_id
from wavepipe.local import airflow as local
from wavepipe.local.kafka import free_port
from wavepipe.local.objectstore import LocalObjectStore
from wavepipe.offline_docs import SITE_FOLDER
from wavepipe.storage import S3Options, open_store

pytestmark = pytest.mark.integration

DAG_ID = "wavepipe_ingest"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """This module's own object store on a free port, stopped at the end."""
    store = LocalObjectStore(tmp_path_factory.mktemp("objectstore"), free_port(), load_settings().tools_dir)
    store.up()
    yield S3Options(**store.client_options())
    store.down()


@pytest.fixture(scope="module")
def airflow(kafka, engine, bucket, tmp_path_factory):
    """``wavepipe airflow up`` whose tasks keep the run state in the bucket; ``down`` afterwards."""
    settings = make_settings(
        tmp_path_factory.mktemp("pages-apart") / "worker",
        kafka,
        engine,
        airflow_port=free_port(),
        state_uri=f"s3://{LocalObjectStore.bucket}/state-{time.time_ns()}",
        s3_endpoint=bucket.endpoint,
        s3_region=bucket.region,
        s3_access_key=bucket.access_key,
        s3_secret_key=bucket.secret_key,
    )
    try:
        code, out, seconds = airflow_cli(settings, "up")
        progress(f"\n`wavepipe airflow up`: exit {code} after {seconds:.1f}s")
        assert code == 0, out[-5000:]
        yield settings
    finally:
        code, out, _ = airflow_cli(settings, "down", timeout=120)
        assert code == 0, out


@pytest.fixture(scope="module")
def api_apart(airflow, tmp_path_factory):
    """A second API server of the same Airflow whose WAVEPIPE_HOME is an empty folder of its own:
    (its settings, its home). Stopped at the end, by its process group."""
    home = tmp_path_factory.mktemp("api-home")
    port = free_port()
    url = f"http://{local.LOOPBACK}:{port}"
    env = {
        **local.server_env(airflow),
        "WAVEPIPE_HOME": str(home),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
    }
    airflow_bin = str(Path(sys.executable).parent / "airflow")
    command = [airflow_bin, "api-server", "--host", local.LOOPBACK, "--port", str(port), "--workers", "1"]
    log = home.parent / "api-apart.log"
    with open(log, "ab") as sink:
        server = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while not _healthy(url):
            assert server.poll() is None, f"the second API server exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the second API server is not up after 180s: {log}"
            time.sleep(1)
        yield airflow.replace(airflow_port=port), home
    finally:
        processes.stop_group(server.pid, lambda: bool(processes.in_group(server.pid)), timeout=30)
        server.wait(timeout=30)


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200
    return False


def _run_to_success(api, settings) -> str:
    """Trigger the DAG with the topic and group of ``settings`` as conf; its run id once it succeeded."""
    run_id = trigger_run(api, DAG_ID, {"topic": settings.topic, "group": settings.group})
    state = wait_for_runs(api, DAG_ID, [run_id])[run_id]
    assert state == "success", f"run {run_id} {state}; task logs under {settings.airflow_home / 'logs'}"
    return run_id


def test_an_api_server_with_an_empty_home_serves_the_run_pages_from_the_bucket(airflow, api_apart, bucket):
    # the clock's runs (default params) find an empty topic; the triggered run has its own
    ensure_topic(airflow)
    settings = airflow.replace(topic=f"{airflow.topic}-pages", group=f"{airflow.group}-pages")
    ensure_topic(settings)
    produce_demo(settings, count=4, target_bytes=32 * 1024)
    # and a producer's waveform over the size limit, its id and source written to attack a page
    hostile_id, hostile_source = '<img src=x onerror="alert(1)">', "ward-1</td><script>alert(2)</script>"
    over = 80 * 1024 * 1024  # by its header; the limit is 64 MiB
    records, _ = waveform_records("over", 2, seed=5)
    changed = {"wp-id": hostile_id.encode(), "wp-source": hostile_source.encode(), "wp-size": str(over).encode()}
    produce_in_order(settings, [with_headers(records, i, **changed) for i in range(2)])
    apart, apart_home = api_apart
    with airflow_api(apart) as api:
        run_id = _run_to_success(api, settings)
        links = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/commit/links")
        assert links.status_code == 200, links.text
        found = links.json()["extra_links"]

        state = open_store(airflow.state_uri, bucket)
        kept = set(state.list_keys())
        name = safe_run_id(run_id)
        assert {f"reports/{name}.html", f"reports/{name}.json", f"reports/{name}.data-docs"} <= kept, sorted(kept)
        own = json.loads(state.get_bytes(f"reports/{name}.data-docs"))
        assert own and all(pages.data_docs_key(path) in kept for path in own), (own, sorted(kept))
        assert pages.data_docs_key("index.html") in kept
        # nothing but the bucket holds the pages now: the worker's copies go, the server's home is empty
        shutil.rmtree(airflow.reports_dir)
        shutil.rmtree(pages.data_docs_root(airflow))

        page_url, docs_url = found["wavepipe run page"], found["Great Expectations Data Docs"]
        page = api.get(httpx.URL(page_url).path)
        assert page.status_code == 200 and name in page.text, page.text[:500]
        assert "file://" not in page.text and 'href="/wavepipe/data-docs/' in page.text
        # it names the quarantined waveform, escaped, and may run no script whatever got through
        assert "<script>" not in page.text and "<img src=x" not in page.text
        named = page.text[page.text.index('id="quarantined"') :].split("</tr>", 2)[1]
        assert "<code>&lt;img src=x onerror=&#34;alert(1)&#34;&gt;</code>" in named, named
        assert "ward-1&lt;/td&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in named and ">too_large<" in named, named
        assert f"{over} bytes by header, 512 in chunks; the maximum is {64 * 1024 * 1024}" in named, named
        assert "1 of 5 waveforms quarantined (20%)" in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none';"), page.headers
        docs = api.get(httpx.URL(docs_url).raw_path.decode())
        assert docs.status_code == 200 and "wavepipe_waveforms" in docs.text, (docs_url, docs.text[:300])
        assert api.get(f"/wavepipe/data-docs/{SITE_FOLDER}/bootstrap.min.css").status_code == 200  # the package's
        report = api.get(f"/wavepipe/reports/{name}.json")
        assert report.status_code == 200 and report.json()["run_id"] == name

        # a logged-in user still gets only checked names out of the state
        for bad in (
            f"/wavepipe/reports/{name}.txt",
            "/wavepipe/reports/%2e%2e",
            f"/wavepipe/data-docs/%2e%2e/%2e%2e/%2e%2e/reports/{name}.json",
            "/wavepipe/data-docs/validations/%2e%2e/index.html",
        ):
            answer = api.get(bad)
            assert answer.status_code == 404, (bad, answer.status_code, answer.text[:300])
    assert httpx.get(f"{local.airflow_url(apart)}/wavepipe/reports/{name}.html").status_code == 401
    assert list(apart_home.iterdir()) == [], "the API server wrote into its home"
