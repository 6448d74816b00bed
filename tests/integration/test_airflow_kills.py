"""Issue 62: Airflow's own processes killed under a run of the shipped ingest DAG, through the
real services that `wavepipe airflow up` starts. Each kill is a SIGKILL (as the OOM killer sends
it) at a step where a ``stop`` failpoint froze the run's task; each run ends exactly once, by
Airflow's own retry or the one command the logs name (`wavepipe airflow up`)."""

from __future__ import annotations

import contextlib
import re
import time
import uuid

import psutil
import pytest

from tests.helpers import (
    airflow_api,
    airflow_cli,
    assert_delta_rs_reads_as_spark,
    frozen_in,
    make_settings,
    offsets_at_end,
    output_rows,
    progress,
    run_state,
    trigger_run,
)
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.local import airflow as local
from wavepipe.local.airflow_service import killed_line
from wavepipe.local.kafka import free_port

pytestmark = pytest.mark.integration

DAG_ID = "wavepipe_ingest"
#: Where each task of a run freezes (SIGSTOP), so that a service is killed at exactly that step.
STOPS = "plan.after_claim=stop,consume.record=stop,publish.before_commit=stop,commit.before_offsets=stop"
#: The task that each failpoint of ``STOPS`` freezes in.
TASK_AT = {"plan": "plan", "consume": "consume", "publish": "validate", "commit": "commit"}
#: The ingest DAG's tasks, sorted.
TASKS = ["commit", "consume", "plan", "reassemble", "validate"]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def airflow(kafka, engine, tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow-kills") / "home"
    settings = make_settings(home, kafka, engine, airflow_port=free_port()).replace(partitions=1)
    ensure_topic(settings)
    try:
        _up(settings)
        with airflow_api(settings) as api:
            yield settings, api
    finally:
        airflow_cli(settings, "down", timeout=120)


def _up(settings) -> str:
    code, out, _ = airflow_cli(settings, "up", env={"WAVEPIPE_FAILPOINTS": STOPS})
    assert code == 0, out[-5000:]
    return out


def _frozen_or_none(settings) -> psutil.Process | None:
    """A process under the services that a ``stop`` failpoint froze, if one is."""
    for pid in filter(None, local.running(settings).values()):
        with contextlib.suppress(psutil.Error):
            for proc in frozen_in(psutil.Process(pid)):
                return proc
    return None


def _task_of(api, run_id: str, proc: psutil.Process) -> str | None:
    """The task id of the frozen ``proc`` in run ``run_id`` (its title, or its parent's, names its
    task instance's id); "" for another run's (a tick of the DAG's 15-minute clock), None when
    the API did not answer (on SQLite a read can meet a write's lock)."""
    titles = " ".join([*proc.cmdline(), *(" ".join(p.cmdline()) for p in proc.parents())])
    answer = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")
    if answer.status_code != 200:
        return None
    return next((t["task_id"] for t in answer.json()["task_instances"] if t["id"] in titles), "")


def _kill_service(settings, service: str) -> None:
    """SIGKILL ``service``'s Airflow process, the child of wavepipe's supervisor, whose log then
    names the command that starts it again."""
    supervisor = psutil.Process(local.running(settings)[service])
    (proc,) = supervisor.children()
    proc.kill()
    proc.wait(30)
    supervisor.wait(30)
    log = local.log_file(settings, service).read_text(errors="replace")
    assert killed_line(service, -9) in log, log[-2000:]  # the tasks it left may still log


def _kill_then_up(settings, service: str, frozen: psutil.Process, in_step: bool) -> None:
    """Kill ``service`` while ``frozen`` is in its step; `wavepipe airflow status` must then name
    it stopped and the command that starts it, and `wavepipe airflow up` must start it. The task
    goes on at once and ends its step without the service, or, ``in_step``, only after `up`, so
    that `up` meets it in its step."""
    _kill_service(settings, service)
    if not in_step:
        frozen.resume()
        time.sleep(3)
    code, out, _ = airflow_cli(settings, "status")
    assert code == 1 and re.search(rf"{service}\s+stopped", out) and "`wavepipe airflow up`" in out, out
    assert f"started {service}" in _up(settings)
    if in_step:
        frozen.resume()


def _drive(settings, api, run_id: str, kills: dict[str, str]) -> float:
    """Let the run go to its end, resuming each frozen task; at the first freeze of the task
    ``TASK_AT[step]`` for each step of ``kills``, SIGKILL what it names: an Airflow service
    (``_kill_then_up``) or ``"task"``, the frozen task's own process. Returns the seconds from the
    last kill to the run's end."""
    pending = {TASK_AT[step]: killed for step, killed in kills.items()}
    began = last_kill = time.monotonic()
    while run_state(api, DAG_ID, run_id) not in ("success", "failed"):
        assert time.monotonic() - began < TIMEOUT_S, f"run {run_id} not ended after {TIMEOUT_S}s"
        frozen = _frozen_or_none(settings)
        if frozen is None:
            time.sleep(0.3)
            continue
        task = _task_of(api, run_id, frozen)
        if task is None:
            time.sleep(0.3)
            continue
        killed = pending.pop(task, None)
        if killed:
            progress(f"{killed} killed while {task} ran")
            last_kill = time.monotonic()
        if killed == "task":
            frozen.kill()
        elif killed:
            _kill_then_up(settings, killed, frozen, in_step=task == "commit")
        else:
            frozen.resume()
    assert not pending, f"never frozen in {sorted(pending)}"
    return time.monotonic() - last_kill


def _assert_exactly_once(settings, api, spark, run_id: str, sent) -> list[tuple[str, str, int]]:
    """The run succeeded, every waveform sent is published once and bit-exact, the offsets are at
    the topic's end; the run's (task, state, try) list."""
    assert run_state(api, DAG_ID, run_id) == "success", f"task logs under {settings.airflow_home / 'logs'}"
    assert offsets_at_end(settings)
    assert_delta_rs_reads_as_spark(spark, settings.output_table)
    ids = {s.waveform_id for s in sent}
    rows = [r for r in output_rows(spark, settings) if r[0] in ids]
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent), rows
    assert all(r[1] == r[2] for r in rows)
    tis = api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    return [(t["task_id"], t["state"], t["try_number"]) for t in tis]


def _run_with_kills(airflow, spark, kills: dict[str, str]):
    """A run of three waveforms on a topic and group of its own (the clock's runs read the
    services' own, empty topic), with ``kills`` (``_drive``)."""
    defaults, api = airflow
    tag = uuid.uuid4().hex[:6]
    settings = defaults.replace(topic=f"{defaults.topic}-{tag}", group=f"{defaults.group}-{tag}")
    ensure_topic(settings)
    sent = produce_demo(settings, count=3, target_bytes=32 * 1024)
    run_id = trigger_run(api, DAG_ID, {"topic": settings.topic, "group": settings.group})
    seconds = _drive(settings, api, run_id, kills)
    tries = _assert_exactly_once(settings, api, spark, run_id, sent)
    progress(f"{kills}: the run ended {seconds:.1f}s after the last kill; tasks {tries}")
    return tries, seconds


def test_the_scheduler_killed_in_consume_publish_and_commit_ends_the_run_exactly_once(airflow, spark):
    """In consume and publish, the task ends its step while no scheduler runs, and the scheduler
    that `up` starts goes on from there. In commit, `up` stops what the dead scheduler left (as a
    service manager restarting it would), the task's supervisor with it: the task commits but
    cannot report it, and Airflow's retry finds the run committed."""
    kills = {"consume": "scheduler", "publish": "scheduler", "commit": "scheduler"}
    tries, seconds = _run_with_kills(airflow, spark, kills)
    # the stopped commit is reset at the new scheduler's orphan check (every ORPHAN_CHECK_S, once
    # the dead one's heartbeat is 30 s old), not after Airflow's default 300 s
    assert seconds < 300, f"the run ended {seconds:.0f}s after the commit's scheduler was killed"
    assert sorted(tries) == [(t, "success", 2 if t == "commit" else 1) for t in TASKS], tries


def test_the_task_process_killed_while_it_publishes_is_retried_by_airflow_exactly_once(airflow, spark):
    tries, _ = _run_with_kills(airflow, spark, {"publish": "task"})
    assert ("validate", "success", 2) in tries, tries


def test_the_dag_processor_and_the_api_server_killed_under_a_run_end_it_exactly_once(airflow, spark):
    """Without the API server the consume task cannot push its XCom and fails; Airflow retries it
    once `up` has started the server again."""
    _run_with_kills(airflow, spark, {"plan": "dag-processor", "consume": "api-server"})
