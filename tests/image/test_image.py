"""The wavepipe image (docker/Dockerfile), built on this machine with buildah (docker/build-local:
a Debian base made with debootstrap, no image registry) and run: the CLI, the jars resolved at
build time (a second ``wavepipe setup`` needs no network), the Airflow services' DAG folder parsed
without import errors, a bounded run end to end inside the image (its own Kafka broker, demo
waveforms, its own Spark engine in local mode), and the same through Airflow
(``airflow dags test wavepipe_ingest``, by ``wavepipe demo``).

Every command runs in a working container of the image (``buildah run``, chroot isolation) inside
a network namespace of the test's own that has only a loopback (tests/image/boxes.py): the image's
servers bind there, out of the way of anything on this machine, and nothing in the image can reach
a registry.

The last step of ``make test`` (``make test-image``); alone: ``WAVEPIPE_IMAGE_TEST=1
.venv/bin/python -m pytest tests/image`` (root; buildah and debootstrap are installed with apt-get
when missing). The first build takes minutes; with the base and the image's layers in
.cache/buildah/ (WAVEPIPE_BUILDAH_CACHE moves it) and the build's inputs unchanged, the build is
reused in seconds.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest

from tests.image.boxes import Box, build_local, ok, say, why_not

#: the DAG files the Dockerfile copies into the Airflow services' DAG folder, by their DAG ids
DAG_IDS = {
    "wavepipe_ingest",
    "wavepipe_maintenance",
    "wavepipe_quality_alert",
    "wavepipe_rewind",
    "wavepipe_waveforms_summary",
}
#: what `wavepipe setup` resolves: one folder per pom (with its .complete marker) and the LogStore
JAR_FOLDERS = ("kafka-pom-", "spark-pom-", "s3-pom-", "gcs-pom-", "spark-kafka-pom-", "logstore-")

REASON = why_not()
pytestmark = [pytest.mark.image, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.fixture(scope="module")
def built():
    """The image, built by docker/build-local (reused when it and its base are up to date)."""
    return build_local()


@pytest.fixture(scope="module")
def box(built):
    b = Box(built.image, stop="wavepipe spark down --force; wavepipe kafka down")
    try:
        yield b
    finally:
        b.close()


def _json_line(out: str):
    """The JSON document among a command's lines (Airflow's CLI logs to stdout as well)."""
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith(("[", "{"))))


def test_the_cli_runs(box):
    out = ok(box.run("wavepipe --help && wavepipe --version"))
    assert "usage: wavepipe" in out
    assert re.search(r"\d+\.\d+\.\d+", out.splitlines()[-1]), out


def test_setup_was_done_at_build_and_needs_no_network_again(box):
    listing = ok(box.run("ls -a /opt/wavepipe/jars/*/ && ls /opt/wavepipe/jars"))
    folders = ok(box.run("ls /opt/wavepipe/jars")).split()
    for prefix in JAR_FOLDERS:
        assert [f for f in folders if f.startswith(prefix)], f"no {prefix}* in /opt/wavepipe/jars: {folders}"
    assert listing.count(".complete") == len(JAR_FOLDERS) - 1, listing  # every pom folder; the LogStore has its jar
    assert "wavepipe-logstore.jar" in listing
    # a JRE stays; the JDK and Maven that built the LogStore and resolved the jars are gone
    tools = box.run("java -version 2>&1; command -v javac mvn || true")
    assert 'version "17' in ok(tools) and "javac" not in tools.stdout and "mvn" not in tools.stdout, tools.stdout
    # no route leaves this namespace: /proc/net/route has its header line only
    routes = ok(box.run("cat /proc/net/route")).strip().splitlines()
    assert len(routes) == 1, routes
    began = time.monotonic()
    setup = box.run("wavepipe setup")
    seconds = time.monotonic() - began
    ok(setup)
    assert "resolving" not in setup.stderr and "building" not in setup.stderr, setup.stderr
    assert seconds < 60, f"a second wavepipe setup took {seconds:.0f}s"


def test_the_airflow_dag_folder_parses(box):
    env = {
        "AIRFLOW_HOME": "/tmp/airflow",
        "AIRFLOW__CORE__DAGS_FOLDER": "/opt/airflow/dags",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    ok(box.run("airflow db migrate >/tmp/airflow-migrate.log 2>&1 || { cat /tmp/airflow-migrate.log; exit 1; }", env))
    dags = _json_line(ok(box.run("airflow dags list --local -o json", env)))
    assert {d["dag_id"] for d in dags} == DAG_IDS
    assert {Path(d["fileloc"]).parent for d in dags} == {Path("/opt/airflow/dags")}
    assert _json_line(ok(box.run("airflow dags list-import-errors --local -o json", env))) == []


#: Kafka's own consumer group tool, from the jars in the image
DESCRIBE = (
    'java -cp "$(echo /opt/wavepipe/jars/kafka-pom-*)/*" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand '
    "--bootstrap-server 127.0.0.1:9092 --describe --group {group} 2>/dev/null"
)
#: the waveform ids of the produced manifests found in the output table (delta-rs, not Spark)
READ_BACK = """
import json, os, pathlib
from wavepipe import storage
from wavepipe.contracts.config import load_settings
sent = [json.loads(l)["waveform_id"] for m in pathlib.Path("/data/produced").glob("*.jsonl") for l in m.read_text().splitlines()]
rows = storage.delta_table(load_settings().output_table).to_pyarrow_table(columns=["waveform_id"]).column("waveform_id").to_pylist()
print(json.dumps({"sent": sorted(sent), "rows": sorted(r for r in rows if r in set(sent))}), flush=True)
os._exit(0)  # not the interpreter's teardown: once in 4 runs it aborted there ("terminate called ...")
"""


def _committed(box: Box, group: str) -> dict[int, tuple[int, int]]:
    """partition -> (committed offset, log end offset), as Kafka's own tool describes the group."""
    table = ok(box.run(DESCRIBE.format(group=shlex.quote(group)), timeout=120))
    found = {}
    for line in table.splitlines():
        words = line.split()
        if len(words) >= 5 and words[0] == group and words[2].isdigit():
            found[int(words[2])] = tuple(int(w) if w.isdigit() else -1 for w in words[3:5])
    return found


def test_a_bounded_run_inside_the_image(box):
    env = {"WAVEPIPE_TOPIC": "image-run", "WAVEPIPE_GROUP": "image-run"}
    ok(box.run("wavepipe kafka up", env, timeout=180))
    produced = ok(box.run("wavepipe produce --demo --count 6", env, timeout=180))
    assert "produced 6 waveforms" in produced, produced
    run = box.run("wavepipe run --new-group-start earliest --json", env, timeout=900)
    report = json.loads(ok(run))
    say(f"run {report['run_id']}: {report['outcome']}, totals {report['totals']}")
    assert report["status"] == "committed", report
    assert report["outcome"]["new"] == 6 and report["outcome"]["quarantined"] == 0, report["outcome"]
    assert report["balance_errors"] == [] and report["validation"]["success"], report
    published = json.loads(ok(box.run(f"python -c {shlex.quote(READ_BACK)}", env, timeout=180)))
    assert len(published["sent"]) == 6 and published["rows"] == published["sent"], published
    committed = _committed(box, "image-run")
    planned = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert {p: c for p, (c, _) in committed.items()} == planned, (committed, planned)
    assert all(c == end for c, end in committed.values()), committed
    assert sum(planned.values()) == report["totals"]["records_read"] > 0


def test_the_ingest_dag_through_airflow_inside_the_image(box):
    env = {"WAVEPIPE_TOPIC": "image-dag", "WAVEPIPE_GROUP": "image-dag"}
    demo = box.run("wavepipe demo --count 6", env, timeout=1200)
    out = ok(demo)
    assert "OK: all 6 produced waveforms are in the output once and bit-exact" in out, out[-4000:]
    lines = re.findall(r"partition (\d+): \[(\d+), (\d+)\) .*; committed (\d+)", out)
    assert lines and all(int(end) == int(c) for _, _, end, c in lines), lines
    committed = _committed(box, "image-dag")
    assert {int(p): int(c) for p, _, _, c in lines} == {p: c for p, (c, _) in committed.items()}, committed


#: the newest run report of a topic, from the image's home
NEWEST_REPORT = """
import json, pathlib, sys
found = [json.loads(p.read_text()) for p in pathlib.Path("/data/reports").glob("*.json")]
found = sorted((r for r in found if r.get("topic") == sys.argv[1]), key=lambda r: r["reported_at"])
print(json.dumps(found[-1] if found else None))
"""


def test_the_services_dag_file_through_airflow_dags_test(box):
    """The DAG file the Airflow services run (/opt/airflow/dags), not the package's copy."""
    env = {
        "WAVEPIPE_TOPIC": "image-services",
        "WAVEPIPE_GROUP": "image-services",
        "AIRFLOW_HOME": "/tmp/airflow-services",
        "AIRFLOW__CORE__DAGS_FOLDER": "/opt/airflow/dags",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    ok(box.run("wavepipe kafka up && wavepipe produce --demo --count 6", env, timeout=180))
    conf = json.dumps({"new_group_start": "earliest"})
    script = f"airflow db migrate >/dev/null && airflow dags test wavepipe_ingest -c {shlex.quote(conf)}"
    ok(box.run(script, env, timeout=1200))
    report = json.loads(ok(box.run(f"python -c {shlex.quote(NEWEST_REPORT)} image-services", env)))
    assert report is not None, "the DAG run wrote no report for topic image-services"
    assert report["status"] == "committed" and report["outcome"]["new"] == 6, report
    assert report["balance_errors"] == [], report["balance_errors"]
    committed = _committed(box, "image-services")
    planned = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert {p: c for p, (c, _) in committed.items()} == planned, (committed, planned)
