"""The follow loop as an Airflow task: the shipped ingest DAG, event-driven with ``follow_s`` set,
served by `wavepipe airflow up` (api-server, scheduler, dag-processor, triggerer). One DAG run's
``follow`` task publishes each burst as its own micro-batch, without a task start per batch."""

from __future__ import annotations

import json
import re
import time

import psutil
import pytest

from tests.helpers import (
    airflow_api,
    airflow_cli,
    assert_accounted,
    make_settings,
    offsets_at_end,
    output_rows,
    progress,
)
from wavepipe import processes
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.local import airflow as local
from wavepipe.local.airflow_service import killed_line
from wavepipe.local.kafka import free_port
from wavepipe.pipeline import run_once

pytestmark = pytest.mark.integration

DAG_ID = "wavepipe_ingest"
FOLLOW_S = 40.0
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def airflow(kafka, engine, tmp_path_factory):
    settings = make_settings(
        tmp_path_factory.mktemp("follow-task") / "home",
        kafka,
        engine,
        airflow_port=free_port(),
        watch_records=1,
        watch_poll_s=0.5,
        follow_s=FOLLOW_S,
    )
    ensure_topic(settings)
    run_once(settings)  # the group's offsets exist (a run on an empty topic: no Spark work)
    try:
        code, out, seconds = airflow_cli(settings, "up")
        progress(f"\n`wavepipe airflow up` (follow task): exit {code} after {seconds:.1f}s")
        assert code == 0, out[-5000:]
        with airflow_api(settings) as api:
            yield settings, api
    finally:
        airflow_cli(settings, "down", timeout=120)


def _wait(what: str, check, timeout_s: float = TIMEOUT_S):
    began = time.monotonic()
    while not (found := check()):
        assert time.monotonic() - began < timeout_s, f"no {what} after {timeout_s}s"
        time.sleep(0.5)
    return found


def _runs(api) -> list[dict]:
    response = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns", params={"order_by": "start_date", "limit": 100})
    assert response.status_code == 200, response.text
    return response.json()["dag_runs"]


def test_one_follow_task_publishes_each_burst_as_its_own_micro_batch(airflow, spark):
    settings, api = airflow
    assert api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
    triggerer_log = local.log_file(settings, "triggerer")
    _wait("the watcher to start", lambda: f"watching group {settings.group!r}" in triggerer_log.read_text())

    first = produce_demo(settings, count=3, target_bytes=32 * 1024)
    (run,) = _wait("a run started by the watcher", lambda: _runs(api))
    _wait("the first burst to be committed", lambda: offsets_at_end(settings))
    second = produce_demo(settings, count=2, target_bytes=32 * 1024)
    acked = time.time()
    _wait("the second burst to be committed", lambda: offsets_at_end(settings))
    progress(f"second burst committed {time.time() - acked:.1f}s after its ack, by the running follow task")
    state = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}").json()["state"]
    assert state == "running", "both bursts were published while the first DAG run's follow task ran"

    _wait("the follow task to end", lambda: _runs(api)[0]["state"] in ("success", "failed"))
    tasks = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run['dag_run_id']}/taskInstances").json()["task_instances"]
    assert [(t["task_id"], t["state"]) for t in tasks] == [("follow", "success")], tasks
    reports = [json.loads(p.read_text()) for p in sorted(settings.reports_dir.glob("*.json"))]
    published = [r for r in reports if not r.get("skipped")]
    assert len(published) >= 2 and len({r["run_id"] for r in published}) == len(published), "a run per burst"
    for report in published:
        assert_accounted(spark, settings, report)
    sent = first + second
    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    assert all(r[1] == r[2] for r in rows)


def test_a_triggerer_killed_while_it_watches_is_named_by_status_and_up_publishes_its_backlog_once(airflow, spark):
    """Issue 62: the triggerer holding the lag watcher killed with SIGKILL (as the OOM killer does).
    Records sent meanwhile start no run; `wavepipe airflow status` names the triggerer as stopped
    and the command that starts it; `wavepipe airflow up` starts it alone, Airflow hands the dead
    triggerer's watcher to it, and the backlog is published once, bit-exact."""
    settings, api = airflow
    assert api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False}).status_code == 200
    _wait("no run in flight", lambda: all(r["state"] in ("success", "failed") for r in _runs(api)))
    _wait("the watcher to start", lambda: f"watching group {settings.group!r}" in _triggerer_log(settings))
    others = {name: pid for name, pid in local.running(settings).items() if name != "triggerer"}
    supervisor = psutil.Process(local.running(settings)["triggerer"])
    (triggerer,) = supervisor.children()
    triggerer.kill()
    triggerer.wait(30)
    supervisor.wait(30)
    assert killed_line("triggerer", -9) in _triggerer_log(settings)
    left = processes.in_group(supervisor.pid)  # its log server outlives it

    code, out, _ = airflow_cli(settings, "status")
    assert code == 1 and re.search(r"triggerer\s+stopped", out) and "`wavepipe airflow up`" in out, out
    before = {r["dag_run_id"] for r in _runs(api)}
    sent = produce_demo(settings, count=2, target_bytes=32 * 1024)
    time.sleep(10)  # a watcher polls every 0.5 s: with none, no run starts
    assert {r["dag_run_id"] for r in _runs(api)} == before, "a run started with no triggerer"
    assert not offsets_at_end(settings)

    began = time.monotonic()
    code, out, _ = airflow_cli(settings, "up")
    assert code == 0 and "started triggerer" in out, out
    assert not processes.in_group(supervisor.pid), f"the killed triggerer's {left} still run: {out}"
    assert bool(left) == (f"stopped what the last triggerer (pid {supervisor.pid}) left running" in out), out
    assert {name: pid for name, pid in local.running(settings).items() if name != "triggerer"} == others, out
    _wait("the backlog to be committed", lambda: offsets_at_end(settings))
    progress(f"triggerer killed: its backlog committed {time.monotonic() - began:.1f}s after `wavepipe airflow up`")
    rows = [r for r in output_rows(spark, settings) if r[0] in {s.waveform_id for s in sent}]
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent), rows
    assert all(r[1] == r[2] for r in rows)


def _triggerer_log(settings) -> str:
    return local.log_file(settings, "triggerer").read_text(errors="replace")
