"""`wavepipe airflow up` for real: the four Airflow services, a run triggered through the REST API
with params as conf, the UI in headless Chromium, and `down` leaving no process behind.

One Airflow serves the whole module (starting it costs ~20 s), with its own wavepipe home, topic
and group on the session's Kafka broker, built the same way as the ``settings`` fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from urllib.parse import quote

import httpx
import psutil
import pytest

from tests.helpers import (
    RUN_TIMEOUT_S,
    airflow_api,
    airflow_cli,
    headless_chromium,
    make_settings,
    offsets_at_end,
    output_rows,
    produce_two_windows,
    progress,
    quarter_hour_ago,
    rows_by_id,
    run_cli,
    trigger_run,
    wait_for_runs,
)
from wavepipe import processes
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.plan import safe_run_id
from wavepipe.local import airflow as local
from wavepipe.local.kafka import free_port
from wavepipe.pipeline import run_once
from wavepipe.plugins.airflow_dags import SINGLE_RUNS_ONLY
from wavepipe.plugins.assets import quality_asset
from wavepipe.plugins.operators import REFUSAL_LINE_CHARS

pytestmark = pytest.mark.integration

DAG_ID = "wavepipe_ingest"


def _processes_of(settings, sessions: set[int] = frozenset()) -> dict[int, str]:
    """Live processes (not zombies) of this Airflow: those in the sessions that ``up`` started
    (one per service: its workers and task supervisors stay in it), and any other process whose
    environment names this AIRFLOW_HOME (tasks' Spark JVMs start sessions of their own). Both
    tests are needed: setproctitle (API server, executor workers) rewrites /proc/<pid>/environ."""
    pids = set(processes.with_environment(local.service_marker(settings)))
    for sid in sessions:
        pids.update(processes.in_session(sid))
    found = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found[pid] = " ".join(psutil.Process(pid).cmdline())
    return found


@pytest.fixture(scope="module")
def observers(tmp_path_factory):
    """What a team's Airflow sends its lineage and metrics to: OpenLineage's file transport (a
    JSON-lines file) and a StatsD server (a UDP socket; a thread keeps wavepipe's lines, as the
    scheduler's own metrics would fill the socket's buffer)."""
    lineage = tmp_path_factory.mktemp("openlineage") / "events.jsonl"
    statsd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    statsd.bind(("127.0.0.1", 0))
    statsd.settimeout(0.2)
    received: list[str] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                received.extend(line for line in statsd.recv(65536).decode().splitlines() if ".wavepipe." in line)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage), "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "wavepipe-test",
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    try:
        yield env, lineage, received
    finally:
        stop.set()
        listener.join(5)
        statsd.close()


@pytest.fixture(scope="module")
def airflow(kafka, engine, tmp_path_factory, observers):
    """``wavepipe airflow up`` on a free port, its lineage and metrics going to ``observers``;
    ``down`` afterwards, whatever happened."""
    # a Kafka callback named by dotted path, as a team's token or error callback would be: `up` lists
    # it in the provider's callback allowlist, the Connection carries it, every task imports it
    callback = {"error_cb": "logging.debug"}
    home = tmp_path_factory.mktemp("airflow-ui") / "home"
    settings = make_settings(home, kafka, engine, airflow_port=free_port()).replace(kafka_client_config=callback)
    sessions: set[int] = set()
    try:
        code, out, seconds = airflow_cli(settings, "up", env=observers[0])
        progress(f"\n`wavepipe airflow up`: exit {code} after {seconds:.1f}s\n{out}")
        assert code == 0, out[-5000:]
        sessions.update(pid for pid in local.running(settings).values() if pid)
        yield settings, out, seconds, sessions
    finally:
        code, out, _ = airflow_cli(settings, "down", timeout=120)
        progress(f"`wavepipe airflow down` (teardown): {out.strip()}")
        left = _processes_of(settings, sessions)
        assert code == 0 and not left, f"left running after down: {left}\n{out}"


@pytest.fixture(scope="module")
def api(airflow):
    with airflow_api(airflow[0]) as client:
        yield client


def test_up_reports_the_login_and_is_idempotent(airflow):
    sessions = airflow[3]
    settings, out, *_ = airflow
    password = local.admin_password(settings)
    assert local.airflow_url(settings) in out and f"user: {local.ADMIN_USER}" in out and password in out
    assert str(local.passwords_file(settings)) in out
    assert json.loads(local.passwords_file(settings).read_text()) == {local.ADMIN_USER: password}
    assert oct(local.passwords_file(settings).stat().st_mode & 0o777) == "0o600"

    code, again, _ = airflow_cli(settings, "up")
    assert code == 0 and "already running" in again, again
    code, status, _ = airflow_cli(settings, "status")
    assert code == 0 and status.count("running, pid") == 4 and "healthy" in status, status

    # low parallelism: one API server process under its supervisor (no forked workers), at most 2
    # executor slots
    api_pid = local.running(settings)["api-server"]
    procs = _processes_of(settings, sessions)
    api_group = [pid for pid in procs if os.getsid(pid) == api_pid]
    children = [child.pid for child in psutil.Process(api_pid).children()]
    assert sorted(api_group) == sorted([api_pid, *children]) and len(children) == 1, {p: procs[p] for p in api_group}
    executor_workers = [cmd for cmd in _processes_of(settings, sessions).values() if "LocalExecutor" in cmd]
    assert 1 <= len(executor_workers) <= 2, executor_workers

    # a writer on the sqlite metadata DB waits for the write lock instead of failing after 5 s
    # ("database is locked" from `airflow backfill create` while the scheduler wrote, on a loaded machine)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from airflow import settings; from sqlalchemy import text\n"
            "with settings.engine.connect() as c: print(c.execute(text('PRAGMA busy_timeout')).scalar())",
        ],
        env=local.airflow_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0 and int(probe.stdout.split()[-1]) >= 30_000, (probe.stdout, probe.stderr[-2000:])


def _listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of ``pids``."""
    import psutil

    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    }


def test_every_service_listens_on_loopback_only(airflow):
    """The API server and the log servers of the scheduler and the triggerer (Airflow binds those
    to every interface by itself) listen on 127.0.0.1 only, on this home's ports."""
    settings, *_, sessions = airflow
    ports = local.log_server_ports(settings)
    expected = {settings.airflow_port, ports["worker"], ports["trigger"]}
    deadline = time.monotonic() + 60  # the log servers are subprocesses that start after `up` returns
    while True:
        listening = _listening(set(_processes_of(settings, sessions)))
        if expected <= {port for _, port in listening} or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert expected <= {port for _, port in listening}, (expected, listening)
    assert all(_loopback(address) for address, _ in listening), listening


def _loopback(address: str) -> bool:
    """Whether ``address`` is a loopback address (IPv4-mapped ``::ffff:127.0.0.1`` included)."""
    import ipaddress

    ip = ipaddress.ip_address(address)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def test_trigger_form_params_come_through_the_rest_api(api):
    details = api.get(f"/api/v2/dags/{DAG_ID}/details")
    assert details.status_code == 200, details.text
    params = details.json()["params"]
    # the DAG file may gain params; these are the ones a run needs, and every param must explain itself
    assert {"topic", "group", "max_records", "max_bytes", "skip_lost_offsets", "window_start", "window_end"} <= set(
        params
    )
    assert params["window_start"]["schema"]["format"] == "date-time"
    assert params["topic"]["description"].startswith("Topic to read")
    assert params["topic"]["schema"]["type"] == ["null", "string"]
    assert params["max_records"]["schema"] == {"type": ["null", "integer"], "minimum": 1, "section": SINGLE_RUNS_ONLY}
    assert params["skip_lost_offsets"]["value"] is False
    assert all(p["description"] for p in params.values())
    # none required: every one has a default or may be left empty (the forms mark no flag required)
    assert all("null" in p["schema"]["type"] for p in params.values()), params


def test_a_run_triggered_through_the_rest_api_ingests_and_commits(airflow, api, spark, observers):
    defaults, *_ = airflow
    # A run of the 15-minute clock may start while the test runs, with the default params (the
    # services' topic and group): give it an empty topic, and the triggered run a topic and group
    # of its own, passed as conf.
    ensure_topic(defaults)
    settings = defaults.replace(topic=f"{defaults.topic}-ui", group=f"{defaults.group}-ui")
    ensure_topic(settings)
    sent = produce_demo(settings, count=6, target_bytes=64 * 1024)

    conn = api.get(f"/api/v2/connections/{local.KAFKA_CONN_ID}")
    assert conn.status_code == 200, conn.text
    # wavepipe's type, as the apache-kafka provider defines its own: extra is the librdkafka
    # configuration, servers included
    assert conn.json()["conn_type"] == "wavepipe_kafka" and not conn.json()["host"]
    assert json.loads(conn.json()["extra"])["bootstrap.servers"] == settings.bootstrap_servers
    _assert_the_test_buttons_check_what_a_run_checks(api, conn.json(), defaults)  # the services' settings

    began = time.monotonic()
    run_id = trigger_run(api, DAG_ID, {"topic": settings.topic, "group": settings.group})
    state = wait_for_runs(api, DAG_ID, [run_id])[run_id]
    seconds = time.monotonic() - began
    progress(f"run {run_id}: {state} {seconds:.1f}s after the trigger")
    assert state == "success", f"run {run_id} {state}; task logs under {settings.airflow_home / 'logs'}"

    # the tasks took Kafka from the Airflow Connection (the hook says so in the task log)
    log = api.get(
        f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/plan/logs/1", headers={"Accept": "application/json"}
    )
    assert log.status_code == 200, log.text
    assert f"Kafka from Airflow connection '{local.KAFKA_CONN_ID}': {settings.bootstrap_servers}" in log.text, log.text[
        -3000:
    ]
    # a successful task's log has no ERROR lines; the Spark steps attached to the engine
    for task_id, map_index in (("plan", -1), ("consume", 0), ("reassemble", -1), ("validate", -1), ("commit", -1)):
        entries = api.get(
            f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1",
            params={"full_content": True, "map_index": map_index},
            headers={"Accept": "application/json"},
        ).json()["content"]
        errors = [e for e in entries if str(e.get("level", "")).lower() in ("error", "critical")]
        assert not errors, (task_id, errors[:5])
        if task_id in ("reassemble", "validate"):
            assert any("attached to the Spark engine in" in str(e.get("event")) for e in entries), entries[-20:]

    reports = {r["run_id"]: r for r in (json.loads(p.read_text()) for p in settings.reports_dir.glob("*.json"))}
    assert safe_run_id(run_id) in reports, f"no report of {run_id} among {sorted(reports)}"
    report = reports[safe_run_id(run_id)]
    assert report["balance_errors"] == [] and report["waveforms"] == {"output_new": 6}
    assert report["topic"] == settings.topic and report["group"] == settings.group
    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    assert all(r[1] == r[2] for r in rows) and {r[3] for r in rows} == {safe_run_id(run_id)}
    assert offsets_at_end(settings)
    _assert_published_events(api, settings, run_id, report)
    _assert_lineage(observers[1], settings, run_id, report)
    _assert_the_task_links_open_the_run_page_and_data_docs(api, run_id, report)
    _assert_metrics(observers[2], settings, report)


def test_refusals_are_skipped_runs_with_their_reason_not_failed_ones(airflow, api):
    """What a user typed wrong through the trigger form (a typo'd conf key, a garbage window, a
    typo'd topic) ends the run with its plan task skipped and the reason in short log lines, no
    traceback; no run is failed, and `wavepipe status` lists each refusal. A value of the wrong
    type is refused by Airflow when the run is created, naming the param."""
    defaults, *_ = airflow
    settings = defaults.replace(topic=f"{defaults.topic}-refused", group=f"{defaults.group}-refused")
    ensure_topic(settings, partitions=1)
    produce_demo(settings, count=1, target_bytes=4096)
    run_once(settings, new_group_start="earliest")  # a group with progress, for its status
    wrong_type = api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {"max_records": "abc"}})
    assert wrong_type.status_code == 400 and "max_records" in wrong_type.text, wrong_type.text
    asked = {"topik": settings.topic}, {"window_start": "garbage", "window_end": "2026-11-20T00:15:00Z"}
    asked += ({"topic": f"{settings.topic}-typo", "group": settings.group},)
    runs = [trigger_run(api, DAG_ID, {"topic": settings.topic, "group": settings.group} | conf) for conf in asked]
    assert set(wait_for_runs(api, DAG_ID, runs).values()) == {"success"}
    says_of = ("'topik'; did you mean 'topic'?", "'garbage' is not ISO-8601", "does not exist")
    for run_id, says in zip(runs, says_of, strict=True):
        tasks = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        assert {t["task_id"]: t["state"] for t in tasks if t["task_id"] != "consume"} == dict.fromkeys(
            ("plan", "reassemble", "validate", "commit"), "skipped"
        ), tasks
        assert next(t for t in tasks if t["task_id"] == "plan")["try_number"] == 1  # not retried
        entries = api.get(
            f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/plan/logs/1",
            params={"full_content": True},
            headers={"Accept": "application/json"},
        ).json()["content"]
        events = [str(e.get("event", "")) for e in entries]
        text = "\n".join(events)
        assert "refused, nothing was read or committed:" in text and "Traceback" not in text, text[-2000:]
        reason = [e for e in events if e.startswith("  ")]
        assert reason and all(len(line) <= REFUSAL_LINE_CHARS + 2 for line in reason), reason
        assert says in " ".join(line.strip() for line in reason), reason
        assert not [e for e in entries if str(e.get("level", "")).lower() in ("error", "critical")], entries[-5:]
    failed = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns", params={"state": "failed", "limit": 100}).json()
    assert not [r for r in failed["dag_runs"] if r["dag_run_id"] in runs], failed
    # in the UI: the plan task's log says it in lines that fit the page
    with headless_chromium() as browser:
        page = _log_in(browser, defaults)
        page.goto(f"{local.airflow_url(defaults)}/dags/{DAG_ID}/runs/{quote(runs[0], safe='')}/tasks/plan")
        said = page.get_by_text("refused, nothing was read or committed:").first
        said.wait_for()
        reason = page.get_by_text("did you mean 'topic'?").first
        reason.wait_for()
        box, width = reason.bounding_box(), page.viewport_size["width"]
        assert box and box["x"] + box["width"] <= width, f"the reason runs past the page's edge: {box}"
    code, out = run_cli(settings, "status")
    assert code == 0 and "refused runs in this home" in out, out
    for run_id in runs:
        assert f"{safe_run_id(run_id)}: topic " in out, out


def _assert_the_test_buttons_check_what_a_run_checks(api, conn: dict, settings) -> None:
    """The Connection form's Test button, through the REST API, for wavepipe's two types: green
    for what a run accepts, red (with the reason) for what it refuses or cannot reach."""

    def tested(**body) -> tuple[bool, str, float]:
        began = time.monotonic()
        answer = api.post("/api/v2/connections/test", json={"connection_id": "wp_test", **body})
        assert answer.status_code == 200, answer.text
        return answer.json()["status"], answer.json()["message"], time.monotonic() - began

    assert json.loads(conn["extra"])["error_cb"] == "logging.debug", conn  # by dotted path, allowlisted by `up`
    ok, message, _ = tested(conn_type="wavepipe_kafka", extra=conn["extra"])
    assert ok and f"topic {settings.topic!r} has" in message, message
    unlisted = json.dumps({"bootstrap.servers": settings.bootstrap_servers, "error_cb": "logging.info"})
    ok, message, _ = tested(conn_type="wavepipe_kafka", extra=unlisted)
    assert not ok and "'logging.info' is not in [apache_kafka] callback_allowlist" in message, message
    callback = json.dumps({"bootstrap.servers": settings.bootstrap_servers, "oauth_cb": "team.auth.token"})
    ok, message, _ = tested(conn_type="wavepipe_kafka", extra=callback)
    assert not ok and "oauth_cb='team.auth.token': module 'team.auth' cannot be imported" in message, message
    dead = json.dumps({"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    ok, message, seconds = tested(conn_type="wavepipe_kafka", extra=dead)
    assert not ok and "did not answer" in message and seconds < 30, (message, seconds)
    assert api.get("/api/v2/monitor/health").status_code == 200  # no client left retrying in the server
    host, port = settings.spark_remote.removeprefix("sc://").split("/")[0].split(";")[0].split(":")
    ok, message, _ = tested(conn_type="wavepipe_spark_connect", host=host, port=int(port))
    assert ok and re.search(r"Spark 4\.\d+\.\d+ at sc://.* ran a query", message), message
    ok, message, _ = tested(conn_type="wavepipe_spark_connect", host="127.0.0.1", port=free_port())
    assert not ok and "is not reachable" in message, message


def _assert_the_task_links_open_the_run_page_and_data_docs(api, run_id: str, report: dict) -> None:
    """The commit task's extra links: its run's page and its validation's Data Docs, served by
    the API server to a logged-in user only."""
    links = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/commit/links")
    assert links.status_code == 200, links.text
    found = links.json()["extra_links"]
    page_url, docs_url = found["wavepipe run page"], found["Great Expectations Data Docs"]
    assert page_url.endswith(f"/wavepipe/reports/{safe_run_id(run_id)}.html"), found
    page = api.get(page_url)
    assert page.status_code == 200 and report["run_id"] in page.text, page.text[:500]
    assert "file://" not in page.text and 'href="/wavepipe/data-docs/' in page.text  # its Data Docs links served too
    # this run's own validation results (its per-waveform suite's, which passed), not the index of every run
    own = f"/wavepipe/data-docs/validations/wavepipe_waveforms/v3/{report['run_id']}/"
    assert own in docs_url and docs_url.endswith(".html"), (docs_url, own)
    docs = api.get(docs_url)
    assert docs.status_code == 200 and "wavepipe_waveforms" in docs.text, (docs_url, docs.text[:300])
    assert "Expectation Validation Result" in docs.text and report["run_id"] in docs.text
    assert "greatexpectations.io/newsletter" not in docs.text and 'id="ge-cta-footer"' not in docs.text
    assert httpx.get(page_url).status_code == 401, "the pages are for logged-in users"
    # a path out of the Data Docs folder (dots encoded, as a client that does not normalize sends them)
    assert api.get("/wavepipe/data-docs/%2e%2e/%2e%2e/%2e%2e/airflow/airflow.db").status_code == 404


def _assert_lineage(path, settings, run_id: str, report: dict) -> None:
    """Airflow's OpenLineage provider sent the commit task's lineage: the topic with the ranges
    read, the three tables with their rows, the validation's assertions."""
    deadline = time.monotonic() + 60  # the provider sends from a process of its own
    while True:
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        done = [
            e
            for e in events
            if e["eventType"] == "COMPLETE"
            and e["job"]["name"] == f"{DAG_ID}.commit"
            and e["outputs"]
            and e["run"]["facets"].get("wavepipe_run", {}).get("run_ids") == [safe_run_id(run_id)]
        ]
        if done or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(done) == 1, [(e["eventType"], e["job"]["name"]) for e in events]
    (topic,) = done[0]["inputs"]
    assert (topic["namespace"], topic["name"]) == (f"kafka://{settings.bootstrap_servers}", settings.topic)
    ranges = topic["inputFacets"]["wavepipe_offsetRanges"]["partitions"]
    assert {p: [r["start"], r["end"]] for p, r in ranges.items()} == {
        p: [part["start"], part["end"]] for p, part in report["partitions"].items()
    }
    outputs = {o["name"]: o for o in done[0]["outputs"]}
    tables = (settings.output_table, settings.quarantine_table, settings.dead_letter_table, settings.qc_table)
    assert set(outputs) == set(tables)
    waveforms = outputs[settings.output_table]
    assert waveforms["outputFacets"]["outputStatistics"]["rowCount"] == 6
    assert outputs[settings.qc_table]["outputFacets"]["outputStatistics"]["rowCount"] == report["quality"]["qc_hours"]
    checks = waveforms["facets"]["dataQualityAssertions"]["assertions"]
    assert len(checks) == sum(s["evaluated"] for s in report["validation"]["suites"]) and all(
        c["success"] for c in checks
    ), checks


def _assert_metrics(received: list[str], settings, report: dict) -> None:
    """The run's numbers reached the StatsD server through Airflow's metrics layer (a clock run
    of the module's Airflow may send its own zeros: each expected line is looked for)."""

    def sent(name: str) -> list[tuple[float, str]]:
        found = []
        for line in list(received):
            stat, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if stat == name:
                found.append((float(value), kind))
        return found

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not sent("airflow.wavepipe.run_duration"):
        time.sleep(0.2)
    assert (report["totals"]["records_read"], "c") in sent("airflow.wavepipe.records_read"), received[-50:]
    assert (6, "c") in sent(f"airflow.wavepipe.{DAG_ID}.waveforms_published"), received[-50:]
    assert (0, "g") in sent("airflow.wavepipe.lag_after") and (1, "c") in sent("airflow.wavepipe.validation_passed")
    assert [kind for _, kind in sent("airflow.wavepipe.run_duration")][:1] == ["ms"], received[-50:]


def _assert_published_events(api, settings, run_id: str, report: dict) -> None:
    """The commit task emitted an event for the waveforms table, with the run's id, rows and the
    table's version in its extra; and one for the quality asset, as the demo's dead lead and
    clipped microphone broke quality rules (the served ``wavepipe_quality_alert`` depends on it).
    The qc table's event may be there or not: no DAG depends on that asset, and Airflow sometimes
    drops an event of such an asset, sometimes makes its asset on the fly."""
    assets = api.get("/api/v2/assets", params={"uri_pattern": "/tables/", "limit": 100}).json()["assets"]
    events = [
        e
        for a in assets
        for e in api.get("/api/v2/assets/events", params={"asset_id": a["id"], "limit": 100}).json()["asset_events"]
        if e["source_run_id"] == run_id
    ]
    by_uri = {e["uri"]: e for e in events}
    quality = quality_asset(settings).uri
    wanted = {f"file://{settings.output_table}", quality}
    assert wanted <= set(by_uri) <= wanted | {f"file://{settings.qc_table}"}, events
    assert {e["source_task_id"] for e in events} == {"commit"}
    extra = by_uri[f"file://{settings.output_table}"]["extra"]
    assert (extra["run_id"], extra["rows"], extra["group"]) == (safe_run_id(run_id), 6, settings.group), extra
    assert extra["table_version"] == report["output_table_version"] is not None
    breaches = by_uri[quality]["extra"]
    assert breaches["by_rule"] == report["quality"]["by_rule"] and breaches["flagged"] == report["quality"]["flagged"]
    assert {"dead_channel", "clipped"} <= set(breaches["by_rule"]), breaches


def test_a_backfill_made_short_of_its_windows_is_made_again_whole(airflow, api):
    """On SQLite a backfill whose creation met the lock part-way keeps only some of its runs
    (Airflow's clean-up of it is best effort). Made short here for real (the DAG paused, one of its
    runs deleted before it started), it is cancelled and made again with a run for each window of
    its dry run: for "Missing Runs" its cancelled runs, which never ran, are deleted so that the new
    one takes them; for "All Runs" the new one runs them again."""
    settings = airflow[0]
    token = local.api_token(settings)
    _wait_for_backfills_completed(settings, api)
    paused = api.get(f"/api/v2/dags/{DAG_ID}").json()["is_paused"]
    assert api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": True}).status_code == 200
    first = quarter_hour_ago(30)
    body = {
        "dag_id": DAG_ID,
        "from_date": first.isoformat(),
        "to_date": (first + timedelta(minutes=30)).isoformat(),
        "dag_run_conf": {"topic": f"{settings.topic}-short"},
    }
    try:
        for reprocess in ("none", "completed"):
            asked = {**body, "reprocess_behavior": reprocess}
            dry = api.post("/api/v2/backfills/dry_run", json=asked).json()["backfills"]
            chosen = [local._iso(b["logical_date"]) for b in dry]
            assert len(chosen) == 3, dry
            status, made = local.create_backfill(settings, token, asked)
            assert status == 200, made
            cut = local.runs_made_by(made, local.runs_in(settings, token, asked))[chosen[1]]
            assert cut["state"] == "queued", cut
            deleted = api.delete(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(cut['dag_run_id'])}")
            assert deleted.status_code == 204, deleted.text
            said: list[str] = []
            status, whole, missing = local.made_whole(settings, token, asked, made, chosen, said.append)
            assert (status, missing) == (200, []) and whole["id"] != made["id"], (status, whole, missing)
            assert said == [
                f"backfill {made['id']} of {DAG_ID} was made with 2 of 3 window runs (no run for {chosen[1]}): "
                "cancelling it and making it again"
            ]
            runs = local.runs_made_by(whole, local.runs_in(settings, token, asked))
            assert sorted(runs) == chosen and {r["state"] for r in runs.values()} == {"queued"}, runs
            assert api.get(f"/api/v2/backfills/{made['id']}").json()["completed_at"], "the short one is not open"
            assert api.put(f"/api/v2/backfills/{whole['id']}/cancel").status_code == 200
    finally:  # no backfill of these windows is left open, nor a run (cancelled, they failed)
        for left in local.open_backfills(settings, token, DAG_ID):
            api.put(f"/api/v2/backfills/{left['id']}/cancel")
        for run in local.runs_in(settings, token, body):
            api.delete(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run['dag_run_id'])}")
        api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": paused})


def test_a_backfill_of_two_windows_reprocesses_them_into_identical_output(airflow, api, spark):
    """A backfill over two 15-minute windows: each window's offsets come from
    Kafka's offsets-for-times, the waveform that straddles their edge belongs to the first one,
    each window's rows are replaced (not added to), and the group's offsets do not move."""
    defaults, *_ = airflow
    settings = defaults.replace(topic=f"{defaults.topic}-bf", group=f"{defaults.group}-bf")
    ensure_topic(settings, partitions=1)
    t0 = quarter_hour_ago(2)
    quarter = timedelta(minutes=15)
    first = produce_two_windows(settings, t0)
    incremental = run_once(settings)  # the first pass: the incremental run, committed
    assert incremental["waveforms"] == {"output_new": 4}
    before = rows_by_id(spark, settings)
    group_offsets = committed_offsets(settings, settings.group, settings.topic, [0])
    assert group_offsets == {0: 11}

    began = time.monotonic()
    # `wavepipe airflow backfill`: both windows' runs start at once (the backfill's default max
    # active runs), the second waits for the first's backfill lane
    code, out = _cli_backfill(settings, t0, t0 + quarter)
    assert code == 0 and "2 window run(s) created" in out, out
    unpause = api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False})
    assert unpause.status_code == 200, unpause.text
    runs: dict[str, str] = {}
    while len(runs) < 2:  # the scheduler creates the backfill's runs
        listed = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns", params={"limit": 100}).json()["dag_runs"]
        runs = {  # this backfill's: a failed run of another test's windows is not
            r["dag_run_id"]: r["logical_date"]
            for r in listed
            if r["run_type"] == "backfill" and t0 <= datetime.fromisoformat(r["logical_date"]) <= t0 + quarter
        }
        assert time.monotonic() - began < 120, f"backfill runs not created: {listed}"
        time.sleep(2)
    states = wait_for_runs(api, DAG_ID, sorted(runs))
    progress(f"backfill of 2 windows: {states} after {time.monotonic() - began:.1f}s")
    assert set(states.values()) == {"success"}, f"{states}; task logs under {defaults.airflow_home / 'logs'}"

    by_start = {}
    for run_id in runs:
        report = json.loads((settings.reports_dir / f"{safe_run_id(run_id)}.json").read_text())
        assert report["status"] == "window_replaced" and report["commit"] == {} and not report["balance_errors"]
        by_start[datetime.fromisoformat(report["window"]["start"])] = report
    w1, w2 = by_start[t0], by_start[t0 + quarter]
    # window 1 is offsets [0, 5): A and B's first half; the run read on to 7 to complete B
    assert w1["window"]["offsets"] == {"0": [first["wf-A"], 5]}
    assert (w1["partitions"]["0"]["start"], w1["partitions"]["0"]["end"]) == (0, first["wf-C"])
    assert w1["waveforms"] == {"output_new": 2} and w1["partitions"]["0"]["other_window"] == 0
    # the page leads with the waveforms: written into the window, replacing its earlier rows (as
    # Delta's commit counted them)
    assert (w1["outcome"]["new"], w1["outcome"]["rewritten"], w1["outcome"]["replaced"]) == (0, 2, 2)
    # window 2 is [5, 9): B's last two chunks open it, but B is window 1's; D is after it
    assert w2["window"]["offsets"] == {"0": [5, first["wf-D"]]}
    assert w2["waveforms"] == {"output_new": 1, "other_window": 1}
    assert (w2["outcome"]["rewritten"], w2["outcome"]["replaced"], w2["outcome"]["other_window"]) == (1, 1, 1)
    assert w2["partitions"]["0"]["other_window"] == 2 and w2["partitions"]["0"]["output"] == 2

    after = rows_by_id(spark, settings)
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}  # bit for bit
    # replaced, not added to: the windows' rows are now the window runs', once each
    assert after["wf-A"][2] == after["wf-B"][2] == w1["run_id"]
    assert after["wf-C"][2] == w2["run_id"] and after["wf-D"][2] == incremental["run_id"]
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == group_offsets

    # `wavepipe status`: offsets, lag and pending work per partition, and the runs of both lanes
    code, out = run_cli(settings, "status")
    assert code == 0, out
    # a table like kafka-consumer-groups --describe: partition, committed, end, lag, pending chunks, moved by
    assert re.search(r"PARTITION\s+CURRENT-OFFSET\s+LOG-END-OFFSET\s+LAG\s+PENDING-CHUNKS\s+MOVED-BY", out), out
    assert re.search(r"\n\s+0\s+11\s+11\s+0\s+0\s+-\n", out), out
    assert f"{incremental['run_id']}: committed;" in out
    assert f"{w1['run_id']}: window_replaced [{t0.isoformat()}, {(t0 + quarter).isoformat()});" in out

    _reprocessed_again(settings, api, spark, t0, runs, by_start, group_offsets)


def _cli_backfill(settings, start: datetime, end: datetime, *extra: str) -> tuple[int, str]:
    """`wavepipe airflow backfill` of the test's topic and group."""
    conf = json.dumps({"topic": settings.topic, "group": settings.group})
    window = ("--from-date", start.isoformat(), "--to-date", end.isoformat())
    return run_cli(settings, "airflow", "backfill", *window, "--conf", conf, *extra, timeout=180)


def _backfill(settings, api, start: datetime, end: datetime, reprocess: str, conf: dict) -> dict:
    """A backfill as the UI's dialog makes one (its choice of reprocess behaviour, its params)."""
    _wait_for_backfills_completed(settings, api)
    body = {"dag_id": DAG_ID, "from_date": start.isoformat(), "to_date": end.isoformat(), "dag_run_conf": conf}
    # SQLite's lock answers 503 and may leave an empty backfill behind, which refuses the next try
    # with 409 until the scheduler closes it: the user's retry, as `wavepipe airflow backfill` makes it
    body |= {"reprocess_behavior": reprocess, "max_active_runs": 2}
    status, made = local.create_backfill(settings, local.api_token(settings), body)
    assert status == 200, made
    return made


def _wait_for_backfills_completed(settings, api, timeout_s: float = 240.0) -> None:
    """One backfill of a DAG at a time: the scheduler marks the last one complete (every 30 s of
    its loop) only after its runs ended; a loaded CI machine has taken over 90 s."""
    began = time.monotonic()
    while True:
        listed = api.get("/api/v2/backfills", params={"dag_id": DAG_ID, "limit": 100}).json()["backfills"]
        open_ones = [b for b in listed if not b.get("completed_at")]
        if not open_ones:
            return
        waited = time.monotonic() - began
        assert waited < timeout_s, f"backfill still open after {waited:.0f}s: {open_ones}; {_scheduler_said(settings)}"
        time.sleep(2)


def _scheduler_said(settings, lines: int = 40) -> str:
    """The scheduler log's last lines about backfills and errors, for a failure message."""
    log = settings.airflow_home / "logs" / "scheduler.log"
    if not log.exists():
        return f"no {log}"
    said = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if re.search(r"backfill|error|Traceback", line, re.I)
    ]
    return "scheduler.log:\n" + "\n".join(said[-lines:])


def _reprocessed_again(settings, api, spark, t0, runs, by_start, group_offsets) -> None:
    """Windows that already had window runs: "Missing Runs" (the CLI's --reprocess missing)
    creates nothing and says why; "All Runs" reprocesses both in the same DAG runs, as new
    wavepipe runs, keeping the first runs' reports; "Missing and Errored Runs" retries a window
    whose run was refused, without retries of the refusal."""
    quarter, conf = timedelta(minutes=15), {"topic": settings.topic, "group": settings.group}
    code, out = _cli_backfill(settings, t0, t0 + quarter, "--reprocess", "missing")
    assert code == 1 and "no run created" in out and "--reprocess all" in out, out
    assert all(f"{run_id} (success)" in out for run_id in runs), out
    first_reports = {r["run_id"]: r for r in by_start.values()}
    before = rows_by_id(spark, settings)

    _backfill(settings, api, t0, t0 + quarter, "completed", conf)  # "All Runs"
    # the backfill clears its runs one after another: a run it has not reached yet still shows its
    # first success, so its end is what says both were reprocessed
    _wait_for_backfills_completed(settings, api)
    states = wait_for_runs(api, DAG_ID, sorted(runs))
    assert set(states.values()) == {"success"}, states
    again = {}
    for run_id, report in first_reports.items():
        assert json.loads((settings.reports_dir / f"{run_id}.json").read_text()) == report  # kept as it was
        again[run_id] = json.loads((settings.reports_dir / f"{run_id}.reprocess-1.json").read_text())
        assert again[run_id]["status"] == "window_replaced" and again[run_id]["window"] == report["window"]
        assert again[run_id]["waveforms"] == report["waveforms"]
    after = rows_by_id(spark, settings)
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}  # replaced once, same bytes
    assert {after[w][2] for w in ("wf-A", "wf-B", "wf-C")} == {f"{r}.reprocess-1" for r in first_reports}
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == group_offsets

    # a window refused at its plan (a typo'd topic): skipped at once, not retried, not failed; then
    # "All Runs" with the right params runs the same DAG run again, and it reprocesses the window
    third = t0 + 2 * quarter
    _backfill(settings, api, third, third, "none", {**conf, "topic": f"{settings.topic}-typo"})
    (failed,) = _wait_for_new_runs(api, set(runs), "success")
    plan = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{failed}/taskInstances/plan").json()
    assert (plan["state"], plan["try_number"]) == ("skipped", 1), f"a refusal no retry can change: {plan}"
    log = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{failed}/taskInstances/plan/logs/1").text
    assert f"topic '{settings.topic}-typo' does" in log and "replaces that window's output" not in log
    code, out = run_cli(settings, "status")  # the refused run with its reason; window runs in the trend
    assert code == 0 and f"{safe_run_id(failed)}: topic '{settings.topic}-typo', group" in out, out
    assert f"topic '{settings.topic}-typo' does not exist" in out, out
    assert all(f"{r}.reprocess-1: passed" in out for r in first_reports), out
    _backfill(settings, api, third, third, "completed", conf)
    began = time.monotonic()
    while not (settings.reports_dir / f"{safe_run_id(failed)}.json").exists():
        assert time.monotonic() - began < RUN_TIMEOUT_S, f"the refused window {failed} was not run again"
        time.sleep(2)
    assert wait_for_runs(api, DAG_ID, [failed]) == {failed: "success"}
    report = json.loads((settings.reports_dir / f"{safe_run_id(failed)}.json").read_text())
    assert report["status"] == "window_replaced" and report["waveforms"] == {"output_new": 1}  # D
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == group_offsets


def _wait_for_new_runs(api, known: set[str], state: str) -> list[str]:
    """The backfill runs not in ``known``, once each is in ``state``."""
    began = time.monotonic()
    while True:
        listed = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns", params={"limit": 100}).json()["dag_runs"]
        new = {
            r["dag_run_id"]: r["state"] for r in listed if r["run_type"] == "backfill" and r["dag_run_id"] not in known
        }
        if new and set(new.values()) == {state}:
            return sorted(new)
        assert time.monotonic() - began < RUN_TIMEOUT_S, f"backfill runs {new}, waiting for {state}"
        time.sleep(3)


def _log_in(browser, settings):
    """A page of ``browser`` on the DAG list, logged in as the admin (SimpleAuthManager's form)."""
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    page.set_default_timeout(60_000)
    page.goto(f"{local.airflow_url(settings)}/dags")
    page.wait_for_url("**/auth/login**")
    page.fill("input[name=username]", local.ADMIN_USER)
    page.fill("input[name=password]", local.admin_password(settings))
    page.click("button[type=submit]")
    page.wait_for_url("**/dags")
    page.get_by_role("link", name=DAG_ID).first.wait_for()
    return page


def test_the_ui_in_headless_chromium_lists_the_dag_and_its_trigger_form(airflow):
    settings, *_ = airflow
    with headless_chromium() as browser:
        page = _log_in(browser, settings)
        assert DAG_ID in page.inner_text("body")
        page.get_by_role("button", name="Trigger Dag").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Topic to read (default: wavepipe config `topic`)").wait_for()
        assert f"Trigger Dag - {DAG_ID}" in dialog.inner_text()
        # what only single runs use is one click away, under a title that says why
        dialog.get_by_text(SINGLE_RUNS_ONLY).click()
        dialog.get_by_text("Cap: records per partition in this run").wait_for()
        form = dialog.inner_text()
        for name in ("topic", "group", "max_records", "max_bytes", "skip_lost_offsets", "window_start"):
            assert name in form


def _pick_date(page, index: int, when: datetime) -> None:
    """Type ``when`` (UTC, the UI's zone here) into the ``index``-th date picker of the page."""
    page.get_by_test_id("datetime-input").nth(index).click()
    picker = page.locator("[data-scope=popover][data-part=content][data-state=open]")
    picker.get_by_placeholder("YYYY/MM/DD").fill(when.strftime("%Y/%m/%d"))
    picker.get_by_placeholder("HH:mm").fill(when.strftime("%H:%M"))
    picker.get_by_placeholder("HH:mm").press("Enter")
    page.keyboard.press("Escape")  # closes the picker, not the dialog


def _wait_for_no_backfill(api) -> None:
    """Until no backfill of the DAG is running (a new one is refused with 409 until then)."""
    began = time.monotonic()
    while True:
        listed = api.get("/api/v2/backfills", params={"dag_id": DAG_ID}).json()["backfills"]
        if all(b["completed_at"] for b in listed):
            return
        assert time.monotonic() - began < RUN_TIMEOUT_S, f"backfills still running: {listed}"
        time.sleep(2)


def test_the_backfill_dialog_offers_what_a_backfill_uses_and_its_runs_reprocess_the_window(airflow, api):
    """Through the UI's own backfill dialog: it shows topic and group (what a backfill uses), the
    single runs' params collapsed under a title that says a backfill leaves them empty, and its
    "Override parameters" conf (every param, the single runs' ones null) makes a window run that
    the scheduler runs to success; the group's offsets stay where they were."""
    defaults, *_ = airflow
    settings = defaults.replace(topic=f"{defaults.topic}-dialog", group=f"{defaults.group}-dialog")
    ensure_topic(settings, partitions=1)
    produce_demo(settings, count=2, target_bytes=4096)
    run_once(settings, new_group_start="earliest")  # the group's own progress, which must not move
    offsets = committed_offsets(settings, settings.group, settings.topic, [0])
    start = quarter_hour_ago(24)  # a window before anything was produced: nothing to reprocess
    _wait_for_no_backfill(api)
    with headless_chromium() as browser:
        page = _log_in(browser, defaults)
        page.get_by_role("button", name="Trigger Dag").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Backfill", exact=True).first.click()
        dialog.get_by_text("Run Backfill", exact=True).first.wait_for()
        dialog.get_by_text("Consumer group whose offsets are the progress").wait_for()
        shown = dialog.inner_text()
        assert SINGLE_RUNS_ONLY in shown
        for hidden in ("Cap: records per partition", "Cap: payload bytes", "Reprocess a time window", "go on from the"):
            assert hidden not in shown, f"the backfill dialog shows {hidden!r} without a click"
        assert "This field is required" not in shown
        _pick_date(page, 0, start)  # From
        _pick_date(page, 1, start)  # To: one window
        dialog.get_by_text("All Runs", exact=True).click()
        dialog.get_by_text("Override parameters on existing runs").click()
        dialog.locator("#element_topic").fill(settings.topic)
        dialog.locator("#element_group").fill(settings.group)
        dialog.get_by_text("1 run will be triggered.").wait_for()
        dialog.get_by_role("button", name="Run Backfill").click()
        page.get_by_text("Backfill generated").wait_for()
    (made,) = [
        b for b in api.get("/api/v2/backfills", params={"dag_id": DAG_ID}).json()["backfills"] if not b["completed_at"]
    ]
    assert made["reprocess_behavior"] == "completed" and made["dag_run_conf"]["topic"] == settings.topic
    assert made["dag_run_conf"]["window_start"] is None and made["dag_run_conf"]["max_records"] is None
    began = time.monotonic()
    while True:
        listed = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns", params={"limit": 100}).json()["dag_runs"]
        runs = [r for r in listed if r["run_type"] == "backfill" and r["conf"].get("topic") == settings.topic]
        if runs and runs[0]["state"] in ("success", "failed"):
            break
        assert time.monotonic() - began < RUN_TIMEOUT_S, f"the dialog's backfill run: {runs}"
        time.sleep(2)
    assert runs[0]["state"] == "success", f"{runs}; task logs under {defaults.airflow_home / 'logs'}"
    report = json.loads((settings.reports_dir / f"{safe_run_id(runs[0]['dag_run_id'])}.json").read_text())
    assert datetime.fromisoformat(report["window"]["start"]) == start and "holds no records" in report["skipped"]
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == offsets


def test_up_on_a_busy_port_says_which_setting_to_change(settings):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, _ = airflow_cli(settings.replace(airflow_port=port), "up", timeout=120)
    assert code == 1, out
    assert f"port {port} on 127.0.0.1 is in use" in out and "airflow_port" in out
    assert "WAVEPIPE_AIRFLOW_PORT" in out and not list(settings.airflow_home.glob("*.pid"))


def test_down_stops_every_process(airflow):
    settings, *_, sessions = airflow
    assert _processes_of(settings, sessions), "Airflow should be running before down"
    code, out, seconds = airflow_cli(settings, "down", timeout=120)
    progress(f"`wavepipe airflow down`: {seconds:.1f}s: {out.strip()}")
    assert code == 0 and "stopped" in out, out
    assert _processes_of(settings, sessions) == {}
    assert not list(settings.airflow_home.glob("*.pid"))
    code, status, _ = airflow_cli(settings, "status")
    assert code == 1 and len(re.findall(r"^\S+ +stopped +log: ", status, re.M)) == 4, status
    stopped = ", ".join(local.PROCESSES)
    assert "not answering" in status and f"stopped: {stopped}; `wavepipe airflow up` starts" in status, status
