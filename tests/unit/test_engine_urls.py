"""How a run finds its Spark engine: URLs, the shared session, secrets in URLs (no server needed)."""

from __future__ import annotations

import uuid

import pytest

from wavepipe.contracts.config import SettingsError, load_settings
from wavepipe.engine_client import _host_port, remote_url, shared_session_id, with_session_id


def test_a_remote_url_gets_the_homes_shared_session_unless_it_names_one(tmp_path):
    settings = load_settings(home=tmp_path, spark_remote="sc://spark.example:15002/;token=abc;use_ssl=true")
    url, hint = remote_url(settings)
    assert url.startswith("sc://spark.example:15002/;token=abc;use_ssl=true;session_id=")
    session = url.rsplit("session_id=", 1)[1]
    assert uuid.UUID(session).version == 4, "Spark Connect accepts only UUIDs as session ids"
    assert remote_url(settings)[0] == url, "every run of the home attaches to the same session"
    assert "abc" not in hint and "spark.example:15002" in hint and "wavepipe_spark" in hint
    other_home = load_settings(home=tmp_path / "other", spark_remote=settings.spark_remote)
    assert remote_url(other_home)[0] != url
    named = settings.replace(spark_remote="sc://h:1/;session_id=" + str(uuid.uuid4()))
    assert remote_url(named)[0] == named.spark_remote


def test_session_ids_and_addresses():
    assert shared_session_id("a") == shared_session_id("a") != shared_session_id("b")
    assert with_session_id("sc://h:1", "s") == "sc://h:1/;session_id=s"
    assert with_session_id("sc://h:1/;session_id=old;token=t", "s") == "sc://h:1/;token=t;session_id=s"
    assert _host_port("sc://h.example:15003/;token=t") == ("h.example", 15003)
    assert _host_port("sc://h.example") == ("h.example", 15002)


@pytest.mark.parametrize(
    "value, ok",
    [
        ("", True),
        ("sc://host:15002", True),
        ("sc://host", True),
        ("sc://host:15002/;token=x;use_ssl=true", True),
        ("http://host:15002", False),
        ("sc://host:port", False),
        ("sc:// host", False),
        ("sc://host:0", False),
        ("sc://host:99999", False),
        ("sc://host/path", False),
        ("sc://host/;token=abc==", False),  # an unencoded '=' in a value: pyspark refuses it
        ("sc://host/;session_id=not-a-uuid", False),
        ("sc://host/;session_id=" + str(uuid.UUID(int=1)), True),
    ],
)
def test_spark_remote_is_checked_where_it_is_read(value, ok, monkeypatch):
    monkeypatch.setenv("WAVEPIPE_SPARK_REMOTE", value)
    if ok:
        assert load_settings().spark_remote == value
    else:
        with pytest.raises(SettingsError, match="WAVEPIPE_SPARK_REMOTE: spark_remote must be empty"):
            load_settings()


def test_one_server_is_one_session_however_its_url_is_spelled(tmp_path):
    """The CLI's ``sc://h:15002`` and the Airflow hook's ``sc://h:15002/`` attach to one session (one
    Python worker daemon on the server, and a retry can interrupt what the other started)."""
    spellings = [
        "sc://spark-connect:15002",
        "sc://spark-connect:15002/",
        "sc://Spark-Connect:15002/;token=x",
        "sc://spark-connect/;use_ssl=false",
    ]
    sessions = {
        remote_url(load_settings(home=tmp_path, spark_remote=u))[0].rsplit("session_id=", 1)[1] for u in spellings
    }
    assert len(sessions) == 1
    other_user = load_settings(home=tmp_path, spark_remote="sc://spark-connect:15002/;user_id=bob")
    assert remote_url(other_user)[0].rsplit("session_id=", 1)[1] not in sessions


def test_a_token_never_reaches_an_error_or_a_hint(tmp_path):
    with pytest.raises(SettingsError) as refused:
        load_settings(spark_remote="sc://h:99999/;token=s3cret")
    assert "s3cret" not in str(refused.value) and "token=*****" in str(refused.value)
    _, hint = remote_url(load_settings(home=tmp_path, spark_remote="sc://h:15002/;token=s3cret"))
    assert "s3cret" not in hint


def test_a_token_in_the_url_is_masked_wherever_settings_are_shown():
    settings = load_settings(spark_remote="sc://h:15002/;token=s3cret;user_id=me")
    shown = settings.as_dict(redact=True)["spark_remote"]
    assert shown == "sc://h:15002/;token=*****;user_id=me"
    with pytest.raises(SettingsError, match="spark_engine must be connect or submit, got 'conect'"):
        load_settings(spark_engine="conect")


def test_a_jobs_kind_is_the_outermost_relation_or_command_of_its_plan():
    from wavepipe.engine_client import plan_kind

    name = 'Spark Connect - session_id: "s"\nplan {\n  root {\n    common {\n      plan_id: 4\n    }\n    aggregate {\n ...'
    assert plan_kind(name) == "aggregate"
    assert (
        plan_kind('Spark Connect - session_id: "s"\nplan {\n  command {\n    write_operation {\n ...')
        == "write_operation"
    )
    assert plan_kind("something else") == "?"


def test_stage_progress_sums_the_running_operations_stages():
    from types import SimpleNamespace

    from wavepipe.engine_client import StageProgress

    progress = StageProgress()
    assert progress.summary() is None

    def stage(done: bool, tasks: int, completed: int, read: int):
        return SimpleNamespace(done=done, num_tasks=tasks, num_completed_tasks=completed, num_bytes_read=read)

    progress(
        stages=[stage(True, 8, 8, 50_000_000), stage(False, 8, 3, 2_500_000)],
        inflight_tasks=5,
        operation_id="a",
        done=False,
    )
    assert progress.summary() == "Spark: now 1/2 stage(s), 11/16 task(s), 52.5 MB read"
    progress(stages=[], inflight_tasks=0, operation_id="a", done=True)
    assert progress.summary() == "Spark: 1 operation(s) done"


def test_the_job_list_is_asked_again_after_a_quick_failure_never_after_a_timeout(monkeypatch):
    import time

    import httpx

    from wavepipe import engine_client

    calls = []

    def flaky(ui, tag):
        calls.append(tag)
        if len(calls) == 1:
            raise ValueError("500 while the UI starts")
        return [{"id": 1}]

    monkeypatch.setattr(engine_client, "spark_jobs", flaky)
    monkeypatch.setattr(engine_client.time, "sleep", lambda s: None)
    assert engine_client._listed_jobs("http://ui", "t") == [{"id": 1}] and len(calls) == 2

    calls.clear()
    clock = [time.monotonic()]

    def slow(ui, tag):  # the request takes the whole timeout
        calls.append(tag)
        clock[0] += engine_client.UI_TIMEOUT_S
        raise httpx.ReadTimeout("timed out")

    monkeypatch.setattr(engine_client, "spark_jobs", slow)
    monkeypatch.setattr(engine_client.time, "monotonic", lambda: clock[0])
    assert engine_client._listed_jobs("http://ui", "t") is None and len(calls) == 1

    calls.clear()
    slept = []
    monkeypatch.setattr(engine_client.time, "sleep", slept.append)

    def down(ui, tag):  # quick failures each time: asked twice, a second apart, no pause after the last
        calls.append(tag)
        raise httpx.ConnectError("[Errno 111] Connection refused")

    monkeypatch.setattr(engine_client, "spark_jobs", down)
    assert engine_client._listed_jobs("http://ui", "t") is None and len(calls) == 2 and slept == [1]


def test_the_own_engine_is_the_packages_entry_point_and_its_absence_is_one_line(tmp_path, monkeypatch):
    """Without spark_remote a run uses the engine the installed package names (``wavepipe.engines``:
    ``local``); an install that names none is refused in a line saying what to set."""
    from wavepipe import engine_client
    from wavepipe.engine_client import EngineUnavailableError, own_engine
    from wavepipe.local.engine_server import LocalEngine

    settings = load_settings(home=tmp_path)
    engine_client._own_engine.cache_clear()
    assert isinstance(own_engine(settings), LocalEngine)
    monkeypatch.setattr(engine_client.metadata, "entry_points", lambda **_: [])
    engine_client._own_engine.cache_clear()
    try:
        with pytest.raises(EngineUnavailableError, match="set spark_remote") as refused:
            own_engine(settings)
        assert "\n" not in str(refused.value)
    finally:
        monkeypatch.undo()
        engine_client._own_engine.cache_clear()
