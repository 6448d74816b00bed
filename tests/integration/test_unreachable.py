"""A broker that is not there is one clear line in seconds; a broker that is there is silent.

Real CLI subprocesses: against a closed port on loopback with a fresh home, and against the
session's broker. No Spark: an unreachable cluster stops a run before anything is read.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.helpers import run_cli, run_cli_json
from wavepipe.contracts.config import load_settings
from wavepipe.local.kafka import free_port
from wavepipe.spark_launch import settings_env

pytestmark = pytest.mark.integration

#: librdkafka's own log lines on a terminal look like ``%3|1795424570.154|FAIL|rdkafka#producer-1| ...``.
LIBRDKAFKA_LINE = re.compile(r"^%\d\|\d+\.\d+\||rdkafka#|BGQUEUE|Purging", re.M)


@pytest.mark.parametrize("args", [["status"], ["run", "--new-group-start", "earliest"]], ids=["status", "run"])
def test_an_unreachable_broker_is_one_line_within_seconds(tmp_path, args):
    servers = f"127.0.0.1:{free_port()}"  # nothing listens there once free_port has closed it
    settings = load_settings(home=tmp_path / "home", bootstrap_servers=servers, kafka_client_config={})
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "wavepipe.cli", *args],
        env={**os.environ, **settings_env(settings)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    seconds = time.monotonic() - began
    err = result.stderr
    assert result.returncode != 0, err
    assert seconds < 12, f"{seconds:.1f}s to say the broker is unreachable:\n{err[-3000:]}"  # ~5 s of it is the wait
    assert len(err.strip().splitlines()) <= 3, err[-3000:]
    assert servers in err and "wavepipe kafka up" in err and "WAVEPIPE_BOOTSTRAP_SERVERS" in err, err
    assert "Traceback" not in err and not LIBRDKAFKA_LINE.search(err), err[-3000:]
    assert not re.search(r"\b[A-Z]\w*(?:Error|Exception)\b", err), err  # no Python class names


def test_commands_against_a_running_broker_print_no_librdkafka_lines(settings):
    for args in (["produce", "--demo", "--count", "2"], ["status"], ["config"]):
        code, out = run_cli(settings, *args, timeout=120)
        assert code in (0, 2), out[-3000:]  # status of a group without offsets is a usage answer (2)
        assert not LIBRDKAFKA_LINE.search(out), out[-3000:]


def test_check_tries_every_service_and_says_what_to_fix(settings, tmp_path):
    """``wavepipe check``: the session's broker and engine answer, the home's folders take a
    write; a dead broker and an object store that does not answer are one FAIL line each, exit 1."""
    code, checks, err = run_cli_json(settings, "check")
    assert code == 0, (checks, err)
    by = {c["service"]: c for c in checks}
    assert list(by) == ["kafka", "spark", "tables", "staging", "state", "airflow"]
    assert by["kafka"]["ok"] and "1 broker(s)" in by["kafka"]["line"], by["kafka"]
    assert by["spark"]["ok"] and re.search(r"Spark 4\.\d+\.\d+ at sc://", by["spark"]["line"]), by["spark"]
    assert all(
        by[n]["ok"] and "written, read back and deleted" in by[n]["line"] for n in ("tables", "staging", "state")
    )
    assert by["airflow"]["ok"] is None and "wavepipe airflow up" in by["airflow"]["line"]

    broken = settings.replace(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        tables_uri="s3://lake/tables",
        s3_endpoint=f"http://127.0.0.1:{free_port()}",
        s3_access_key="k",
        s3_secret_key="s",
    )
    began = time.monotonic()
    code, out = run_cli(broken, "check", timeout=180)
    lines = {line.split()[1]: line for line in out.splitlines() if line[:4] in ("ok  ", "FAIL", "idle")}
    assert code == 1 and lines["kafka"].startswith("FAIL") and "wavepipe kafka up" in lines["kafka"], out
    assert lines["tables"].startswith("FAIL") and "s3_* settings" in lines["tables"], out
    assert lines["spark"].startswith("ok") and "2 of 6 failed (kafka, tables)" in out, out
    assert time.monotonic() - began < 120 and "Traceback" not in out
