"""Event-driven runs for real: the shipped ingest DAG with a lag threshold set, served by
`wavepipe airflow up` (api-server, scheduler, dag-processor, triggerer). The watcher in the
triggerer sees new records on the session's broker and the scheduler starts a run; data arriving
during that run leads to one follow-up run, never overlapping it. The shipped downstream DAG,
scheduled on the waveforms table's asset, runs once per run that published, never for an idle one.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime

import pytest
from confluent_kafka.admin import OffsetSpec

from tests.helpers import airflow_api, airflow_cli, make_settings, otlp_metrics_receiver, output_rows, progress
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, list_offsets, partitions_of
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.plan import safe_run_id
from wavepipe.local import airflow as local
from wavepipe.local.kafka import free_port
from wavepipe.pipeline import run_once
from wavepipe.run_store import RunStore

pytestmark = pytest.mark.integration

DAG_ID = "wavepipe_ingest"
DOWNSTREAM = "wavepipe_waveforms_summary"
TIMEOUT_S = 900  # generous: a contended machine running two test files at once is slow


@pytest.fixture(scope="module")
def airflow(kafka, engine, tmp_path_factory):
    """The local Airflow on a free port, its ingest DAG watching its group's lag every second
    (any new record is worth a run); ``down`` afterwards."""
    settings = make_settings(
        tmp_path_factory.mktemp("watcher") / "home",
        kafka,
        engine,
        airflow_port=free_port(),
        watch_records=1,
        watch_poll_s=1.0,
    )
    ensure_topic(settings)
    run_once(settings)  # the group's offsets exist (a run on an empty topic: no Spark work)
    # metrics go to an OpenTelemetry collector, up until the services are down: each exports its
    # last metrics as it exits (to a collector gone, each would retry for a minute)
    with otlp_metrics_receiver() as (otlp, points):
        try:
            # each run dawdles 8 s after it publishes (a larger batch would), so data sent while
            # it runs reaches the watcher before it commits
            env = {
                "WAVEPIPE_FAILPOINTS": "publish.after_write=sleep:8",
                "AIRFLOW__METRICS__OTEL_ON": "True",
                "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_METRIC_EXPORT_INTERVAL": "1000",
            }
            code, out, seconds = airflow_cli(settings, "up", env=env)
            progress(f"\n`wavepipe airflow up` (watching): exit {code} after {seconds:.1f}s")
            assert code == 0, out[-5000:]
            with airflow_api(settings) as api:
                yield settings, api, points
        finally:
            began = time.monotonic()
            code, out, _ = airflow_cli(settings, "down", timeout=120)
            progress(f"`wavepipe airflow down` (teardown, {time.monotonic() - began:.1f}s): {out.strip()}")


def _runs(api, dag_id: str = DAG_ID) -> list[dict]:
    response = api.get(f"/api/v2/dags/{dag_id}/dagRuns", params={"order_by": "start_date", "limit": 100})
    assert response.status_code == 200, response.text
    return response.json()["dag_runs"]


def _when(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def _wait(what: str, check, timeout_s: float = TIMEOUT_S, every_s: float = 0.5):
    """Poll ``check()`` until it returns something true; progress every 15 s."""
    began, said = time.monotonic(), 0.0
    while True:
        found = check()
        if found:
            return found
        elapsed = time.monotonic() - began
        assert elapsed < timeout_s, f"no {what} after {timeout_s}s"
        if elapsed - said >= 15:
            progress(f"  {elapsed:5.0f}s waiting for {what}")
            said = elapsed
        time.sleep(every_s)


def _settled(api, settings) -> bool:
    """No run queued or running, and the group committed every record."""
    if any(r["state"] in ("queued", "running") for r in _runs(api)):
        return False
    parts = partitions_of(settings, settings.topic)
    return committed_offsets(settings, settings.group, settings.topic, parts) == list_offsets(
        settings, settings.topic, parts, OffsetSpec.latest()
    )


def _started_by(api, run_id: str) -> set[str]:
    """The assets whose events started the run (the lag's watcher, the clock)."""
    events = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/upstreamAssetEvents").json()["asset_events"]
    return {e["name"] for e in events}


def _state(api, run_id: str, task_id: str | None = None) -> str | None:
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}" + (f"/taskInstances/{task_id}" if task_id else "")
    return api.get(path).json().get("state")


def test_data_starts_a_run_and_data_during_it_one_follow_up_run(airflow, spark):
    settings, api, points = airflow
    for dag_id in (DOWNSTREAM, DAG_ID):
        unpause = api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": False})
        assert unpause.status_code == 200, unpause.text
    # the DAG processor registers the watchers of an unpaused DAG, the triggerer starts them: the
    # 15-minute clock of the incremental runs stays beside the lag's (unpausing starts no run)
    triggerer_log = local.log_file(settings, "triggerer")
    _wait("the watcher to start", lambda: f"watching group {settings.group!r}" in triggerer_log.read_text())
    _wait("its clock to start", lambda: f"{DAG_ID}: the clock of the incremental runs" in triggerer_log.read_text())
    before = {r["dag_run_id"] for r in _runs(api)}

    first = produce_demo(settings, count=4, target_bytes=64 * 1024)
    acked = time.time()  # produce_demo returns once every chunk is acknowledged

    def new_runs() -> list[dict]:
        return [r for r in _runs(api) if r["dag_run_id"] not in before]

    (run_a,) = _wait("a run started by the watcher", new_runs)
    assert run_a["run_type"] == "asset_triggered", run_a
    a_id = run_a["dag_run_id"]
    progress(f"watcher-triggered run {a_id} queued {_when(run_a['queued_at']) - acked:.1f}s after the data's ack")

    # data while it runs: before and after it planned. The watcher fires for each arrival; the
    # run's commit asks for a follow-up for what it did not plan; the scheduler keeps one run queued
    def fired() -> int:
        return triggerer_log.read_text().count("a run is due")

    _wait("that run to be running", lambda: _state(api, a_id) != "queued")
    sent = fired()
    second = produce_demo(settings, count=3, target_bytes=64 * 1024)
    _wait("the watcher to fire for the second batch", lambda: fired() > sent)
    # an event-driven run is one task, "run": its plan is frozen in the home before it reads
    _wait("that run's plan", lambda: RunStore(settings).has_plan(safe_run_id(a_id)))
    tasks = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{a_id}/taskInstances").json()["task_instances"]
    assert [t["task_id"] for t in tasks] == ["run"], tasks
    sent = fired()
    third = produce_demo(settings, count=3, target_bytes=64 * 1024)
    _wait("the watcher to fire for the third batch", lambda: fired() > sent)
    last_sent = time.time()

    def quiet() -> bool:  # settled, and no run created in the next 5 s (a late event's, the schedule's)
        if not _settled(api, settings):
            return False
        count = len(_runs(api))
        time.sleep(5)
        return len(_runs(api)) == count and _settled(api, settings)

    _wait("every run to finish and the group to commit every record", quiet)
    runs = {r["dag_run_id"]: r for r in _runs(api)}
    assert all(r["state"] == "success" for r in runs.values()), runs
    run_a = runs[a_id]
    a_start, a_end = _when(run_a["start_date"]), _when(run_a["end_date"])
    assert a_end > last_sent, "the first run ended before the later data was sent: nothing tested the follow-up"
    # one follow-up run started by the watcher after the first one ended (the 15-minute clock may
    # add a run of its own when the test crosses a quarter hour); runs never overlapped
    after_a = [r for r in runs.values() if r["dag_run_id"] not in before and r["dag_run_id"] != a_id]
    # (a clock run takes any lag event still pending with it: it is the clock's, not a follow-up)
    started = {r["dag_run_id"]: _started_by(api, r["dag_run_id"]) for r in after_a}
    follow_ups = [r for r in after_a if started[r["dag_run_id"]] == {f"{DAG_ID}__lag"}]
    assert len(follow_ups) == 1 and {r["run_type"] for r in after_a} == {"asset_triggered"}, after_a
    spans = sorted((_when(r["start_date"]), _when(r["end_date"]), r["dag_run_id"]) for r in runs.values())
    for (_, end, earlier), (start, _, later) in itertools.pairwise(spans):
        assert start >= end, f"{later} started before {earlier} ended"

    # the events: the watcher's, one for each arrival during the first run
    (asset,) = api.get("/api/v2/assets", params={"name_pattern": f"{DAG_ID}__lag"}).json()["assets"]
    # the topic as the group reads it, named as the apache-kafka provider names a topic
    assert asset["uri"] == f"kafka://{settings.bootstrap_servers}/{settings.topic}?group={settings.group}"
    assert asset["extra"]["group"] == settings.group
    events = api.get("/api/v2/assets/events", params={"asset_id": asset["id"], "limit": 100}).json()["asset_events"]
    fired = [e for e in events if e["extra"].get("from_trigger")]
    assert fired and {e["extra"]["payload"]["group"] for e in fired} == {settings.group}
    during = [e for e in fired if a_start < _when(e["timestamp"]) < a_end]
    assert len(during) >= 2, [(e["timestamp"], e["extra"]) for e in events]
    report_a = json.loads((settings.reports_dir / f"{safe_run_id(a_id)}.json").read_text())
    assert sum(p["unplanned"] for p in report_a["partitions"].values()) >= len(third), report_a["partitions"]
    # no cap left anything, so the first run's commit asked for no follow-up: the watcher did
    assert not [e for e in events if e["source_run_id"] == a_id], events
    progress(
        f"{len(fired)} watcher events, {len(during)} during run {a_id}; one follow-up run: {follow_ups[0]['dag_run_id']}"
    )

    # every waveform once, bit-exact, and each run that read something has a report
    sent = first + second + third
    rows = output_rows(spark, settings)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    assert all(r[1] == r[2] for r in rows)
    readers = {r[3] for r in rows}
    assert safe_run_id(a_id) in readers and readers <= {safe_run_id(r) for r in runs if r not in before}
    assert {p.stem for p in settings.reports_dir.glob("*.json")} >= readers

    _downstream_ran_once_per_publishing_run(settings, api, [r for r in runs if r not in before])
    _metrics_reached_the_collector(points, settings)


def _metrics_reached_the_collector(points: list, settings) -> None:
    """Each run's numbers reached the OpenTelemetry collector through Airflow's metrics layer,
    tagged with the DAG, topic and group: every publishing run's waveforms among them."""
    _wait("the runs' metrics", lambda: any(name == "airflow.wavepipe.run_duration" for name, _, _ in points), 60)
    ours = [(name, value, tags) for name, value, tags in points if name.startswith("airflow.wavepipe.")]
    tagged = {
        (t.get("dag_id"), t.get("topic"), t.get("group")) for name, _, t in ours if name == "airflow.wavepipe.runs"
    }
    assert tagged == {(DAG_ID, settings.topic, settings.group)}, tagged
    # each run's task process sends its run's count (cumulative per process: repeated each export)
    published = {value for name, value, _ in ours if name == "airflow.wavepipe.waveforms_published"}
    reports = [json.loads(p.read_text()) for p in settings.reports_dir.glob("*.json")]
    assert reports and {r["outcome"]["new"] for r in reports} <= published, (published, ours[-20:])


def _downstream_ran_once_per_publishing_run(settings, api, ingest_runs: list[str]) -> None:
    """The downstream DAG ran once for each ingest run that published waveforms, read back what
    each one's event announced, and did not run for an idle run triggered afterwards."""
    publishing = {safe_run_id(r) for r in ingest_runs if (settings.reports_dir / f"{safe_run_id(r)}.json").exists()}
    assert publishing, ingest_runs
    _wait(
        "the downstream runs",
        lambda: len([r for r in _runs(api, DOWNSTREAM) if r["state"] == "success"]) >= len(publishing),
    )
    down = _runs(api, DOWNSTREAM)
    assert len(down) == len(publishing) and {r["run_type"] for r in down} == {"asset_triggered"}, down
    summaries = []
    for run in down:
        entry = api.get(
            f"/api/v2/dags/{DOWNSTREAM}/dagRuns/{run['dag_run_id']}/taskInstances/summarize/xcomEntries/return_value"
        )
        assert entry.status_code == 200, entry.text
        summaries.extend(entry.json()["value"])
    assert sorted(s["run_id"] for s in summaries) == sorted(publishing), summaries
    assert all(s["read"] == s["announced"] > 0 and s["table_version"] is not None for s in summaries), summaries

    # an idle run (nothing new) publishes nothing: no event, no downstream run
    idle = api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None})
    assert idle.status_code == 200, idle.text
    idle_id = idle.json()["dag_run_id"]
    _wait("the idle run", lambda: _state(api, idle_id) in ("success", "failed"))
    assert _state(api, idle_id) == "success"
    time.sleep(5)  # a scheduler loop or two
    assert len(_runs(api, DOWNSTREAM)) == len(down), "an idle run started the downstream DAG"
    progress(f"downstream: {len(down)} runs for {len(publishing)} publishing runs; none for idle run {idle_id}")
