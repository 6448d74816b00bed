"""What an operator types, on the real broker and Airflow: a bad flag, setting, group, topic or
trigger conf is refused before anything is read or committed, in one line without Python class
names; secrets never show; a crashed planner or an abandoned run leaves nothing behind; offsets
moved by someone else are honoured and said out loud; idle runs keep one line of history."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.helpers import produce_in_order, waveform_records
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.contracts.config import PROJECT_ROOT
from wavepipe.run_store import RunStore
from wavepipe.spark_launch import settings_env

pytestmark = pytest.mark.integration

#: what a user must never see in a refusal
NOT_FOR_USERS = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception)\b")


def cli(settings, *args, env: dict | None = None, drop: tuple = (), failpoints: str | None = None):
    """``wavepipe <args>`` in a child process with exactly ``settings`` (plus ``env``, less ``drop``)."""
    full = {**os.environ, **settings_env(settings), **(env or {})}
    for name in (*drop, "WAVEPIPE_FAILPOINTS"):
        full.pop(name, None)
    if failpoints:
        full["WAVEPIPE_FAILPOINTS"] = failpoints
    proc = subprocess.run(
        [sys.executable, "-m", "wavepipe.cli", *args],
        env=full,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def refused(result, *fragments: str) -> str:
    """Assert ``result`` is a usage refusal (exit 2) whose one-line message has ``fragments``."""
    code, out, err = result
    assert code == 2, (code, out, err)
    assert not NOT_FOR_USERS.search(err), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def commit_as_another_client(settings, offsets: dict[int, int], metadata: str = "") -> None:
    """Move the group like ``kafka-consumer-groups --reset-offsets`` (or another client) would."""
    consumer = Consumer(settings.kafka_config(**{"group.id": settings.group, "enable.auto.commit": False}))
    try:
        consumer.commit(
            offsets=[TopicPartition(settings.topic, p, o, metadata=metadata) for p, o in offsets.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()


def test_bad_input_from_operators_never_reads_or_commits(settings, tmp_path):
    ensure_topic(settings)
    settings = settings.replace(new_group_start="")  # the default: a new group must be started on purpose
    records, _ = waveform_records("early", 2, seed=1)
    produce_in_order(settings, records, partition=0)

    # a new group starts only where it is told to; at latest nothing is read and its offsets are created
    code, out, err = cli(settings, "run", "--new-group-start", "latest")
    assert code == 0, (out, err)
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 2, 1: 0}
    assert "started at latest" in out

    # negative caps: as a flag (argparse), in the environment and in the TOML file, each named
    err = cli(settings, "run", "--max-records", "-5")[2]
    assert "--max-records: -5 is negative" in err
    refused(
        cli(settings, "run", env={"WAVEPIPE_MAX_RECORDS_PER_PARTITION": "-5"}),
        "WAVEPIPE_MAX_RECORDS_PER_PARTITION: max_records_per_partition must be 0 (no cap) or a positive",
    )
    toml = tmp_path / "wavepipe.toml"
    toml.write_text("[wavepipe]\nmax_records_per_partition = -5\n")
    refused(
        cli(settings, "run", env={"WAVEPIPE_CONFIG": str(toml)}, drop=("WAVEPIPE_MAX_RECORDS_PER_PARTITION",)),
        f"{toml}, key max_records_per_partition: max_records_per_partition must be 0",
    )
    refused(cli(settings, "run", "--new-group-start", "yesterday"), "must be earliest, latest or an ISO-8601")

    # a typo'd group reads nothing, commits nothing, and names the group that has offsets
    produce_in_order(settings, waveform_records("later", 2, seed=2)[0], partition=0)
    # one character off (never the group itself: a swap of two equal characters would be)
    typo = settings.group[:-1] + ("x" if settings.group[-1] != "x" else "y")
    assert typo != settings.group
    err = refused(
        cli(settings, "run", "--group", typo),
        f"group {typo!r} has no committed offsets",
        f"Did you mean {settings.group!r}?",
        "--new-group-start",
    )
    assert settings.group in err.split("Groups with offsets on")[1]
    refused(cli(settings, "status", "--group", typo), f"group {typo!r} has no committed offsets")
    assert committed_offsets(settings, typo, settings.topic, [0, 1]) == {0: None, 1: None}
    assert RunStore(settings).active_run(typo) is None

    # a wrong topic suggests the closest existing ones
    refused(cli(settings, "run", "--topic", settings.topic + "s"), f"did you mean {settings.topic!r}")
    refused(cli(settings, "run", "--window", "garbage", "2026-11-20T00:15"), "--window: datetime 'garbage' is not ISO")
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 2, 1: 0}


def test_secrets_are_masked_and_crashed_or_abandoned_runs_leave_nothing_behind(settings):
    ensure_topic(settings)
    secret = f"hunter2-{uuid.uuid4().hex}"
    settings = settings.replace(kafka_client_config={"sasl.password": secret})
    code, out, err = cli(settings, "config")
    assert code == 0 and secret not in out + err and '"sasl.password": "*****"' in out

    # a planner killed after it claimed the group (e.g. waiting on a broker that is down): the
    # next run releases the claim on its own, truthfully
    code, out, err = cli(settings, "-v", "run", failpoints="plan.after_claim=kill")
    assert code == -9, (code, out, err)
    store = RunStore(settings)
    crashed = store.active_run(settings.group)
    assert crashed is not None and store.load_plan(crashed) is None
    code, out, err = cli(settings, "run")
    assert code == 0, (out, err)
    assert f"run {crashed} of group {settings.group} claimed the group but never stored a plan" in err
    assert store.active_run(settings.group) is None

    # a run whose reader died mid-range, then abandoned: its staged files go with it
    produce_in_order(settings, waveform_records("staged", 3, seed=3)[0], partition=0)
    code, out, err = cli(settings, "run", failpoints="consume.record@2=kill")  # one partition: read in-process
    assert code == -9, (code, out, err)
    run = store.active_run(settings.group)
    assert run is not None and Path(store.staging_dir(run)).exists()
    code, out, err = cli(settings, "abandon")
    assert code == 0 and "deleted its staged files" in out, (out, err)
    assert not Path(store.staging_dir(run)).exists() and store.active_run(settings.group) is None

    # the secret is nowhere in the state folder (plans, step records, reports, logs)
    for path in settings.home.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_offsets_moved_by_someone_else_are_reported_and_idle_runs_keep_one_line(settings):
    ensure_topic(settings)
    settings = settings.replace(new_group_start="latest")
    store = RunStore(settings)
    assert cli(settings, "run")[0] == 0  # a new group at latest: offsets {0: 0, 1: 0} created
    for _ in range(2):  # idle: no report files, one line of history
        code, out, err = cli(settings, "run")
        assert code == 0 and "no report for an idle run" in out, (out, err)
    assert store.idle_runs(settings.group)["count"] == 2
    reports = sorted(settings.reports_dir.glob("*.json"))
    assert len(reports) == 1, "only the new group's first run (it created the offsets) has a report"
    code, out, err = cli(settings, "status")
    assert code == 0, err
    assert re.search(r"PARTITION\s+CURRENT-OFFSET\s+LOG-END-OFFSET\s+LAG\s+PENDING-CHUNKS\s+MOVED-BY", out), out
    assert "idle runs (nothing new to read) since the last run that read something: 2" in out

    # another client moves partition 0 forward past 3 records, then another wavepipe home moves 1
    produce_in_order(settings, waveform_records("p0", 3, seed=4)[0], partition=0)
    produce_in_order(settings, waveform_records("p1", 2, seed=5)[0], partition=1)
    commit_as_another_client(settings, {0: 3})
    commit_as_another_client(settings, {1: 2}, metadata=json.dumps({"run_id": "run_of_another_home"}))
    code, out, err = cli(settings, "status")
    assert code == 0, err
    assert re.search(r"\n\s+0\s+3\s+3\s+0\s+\S+\s+a commit without wavepipe metadata", out), out
    assert "run run_of_another_home, which this run state" in out
    code, out, err = cli(settings, "run")
    assert code == 0, (out, err)
    assert "[0] was moved by someone else: from 0 to 3 by a commit without wavepipe metadata" in out
    assert "offsets [0, 3) were skipped here" in out and "offsets [0, 2) were skipped here" in out
    report = json.loads(max(settings.reports_dir.glob("*.json"), key=lambda p: p.stat().st_mtime).read_text())
    assert report["moved"]["0"]["skipped"] == [0, 3] and report["moved"]["1"]["by"].startswith(
        "run run_of_another_home"
    )
    assert store.idle_runs(settings.group) is None, "a run that says something resets the idle line"
    code, out, err = cli(settings, "run")  # said once: the next run is idle again
    assert code == 0 and "moved" not in out and "no report for an idle run" in out, out


def test_a_trigger_with_unknown_or_malformed_conf_is_refused_at_its_plan_task_at_once(settings):
    from wavepipe.local.airflow import dags_test

    ensure_topic(settings)
    result = dags_test(settings, "wavepipe_ingest", conf={"topik": settings.topic}, capture=True)
    log = result.stdout + result.stderr
    assert "unknown keys in the run's conf: 'topik'; did you mean" in log, log[-3000:]
    result = dags_test(
        settings,
        "wavepipe_ingest",
        capture=True,
        conf={"window_start": "garbage", "window_end": "2026-11-20T00:15:00Z"},
    )
    log = result.stdout + result.stderr
    assert "param window_start: datetime 'garbage' is not ISO-8601" in log, log[-3000:]
    assert "new_state=skipped" in log and "up_for_retry" not in log.lower(), "a refused trigger is not retried"
    assert "new_state=failed" not in log, log[-3000:]
    reasons = [r["reason"] for r in RunStore(settings).refusals()]  # `wavepipe status` lists them
    assert len(reasons) == 2 and reasons[0].startswith("unknown keys in the run's conf: 'topik'"), reasons
    assert reasons[1].startswith("param window_start: datetime 'garbage' is not ISO-8601"), reasons
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}


def test_a_group_is_tied_to_the_tables_it_committed_with(settings, tmp_path):
    """The README's S3 variant after the local demo, in one home: a run of the same group on other
    tables would skip what the first tables hold. It is refused in one line naming both places
    and the way on; after a rewind that unties the group on purpose, it runs there."""
    ensure_topic(settings, partitions=1)
    first, _ = waveform_records("first", 2, seed=1)
    produce_in_order(settings, first, partition=0)
    code, out, err = cli(settings, "run", "--new-group-start", "earliest")
    assert code == 0, (out, err)
    other = settings.replace(tables_uri=str(tmp_path / "other-tables"))
    second, _ = waveform_records("second", 2, seed=2)
    produce_in_order(settings, second, partition=0)
    err = refused(cli(other, "run"), "last committed", settings.tables_location, other.tables_location, "rewind")
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "other-tables").exists()  # nothing was written there
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: len(first)}
    (noted,) = RunStore(settings).refusals()  # `wavepipe status` lists it
    assert noted["reason"].startswith(f"group {settings.group!r} last committed"), noted
    code, out, err = cli(other, "rewind", "--shift-by", "0", "--execute", "--reason", "tables moved")
    assert code == 0, (out, err)
    code, out, err = cli(other, "run")
    assert code == 0, (out, err)
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: len(first) + len(second)}
    code, out, err = cli(settings, "run")  # and now the first tables are the other ones
    assert code == 2 and other.tables_location in err, (out, err)
