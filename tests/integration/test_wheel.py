"""wavepipe as a package: its wheel, installed (not editable) into a fresh virtualenv outside the
checkout, gives the CLI, Spark apps that a Spark Connect server's Python workers import from the
installed package, and DAG factories a user's DAG folder calls to run two pipelines side by side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psutil
import pytest

from tests.helpers import output_rows
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.config import PROJECT_ROOT, load_settings
from wavepipe.local.engine import LocalEngine
from wavepipe.local.kafka import free_port
from wavepipe.offline_docs import LOCAL_COPIES

pytestmark = pytest.mark.integration

USER_DAGS = """\
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag, wavepipe_rewind_dag

    seismic = wavepipe_ingest_dag(dag_id="seismic_ingest", topic="{topic}", group="{group}",
                                  settings={{"home": "{home}/seismic"}})
    seismic_rewind = wavepipe_rewind_dag(dag_id="seismic_rewind", topic="{topic}", group="{group}",
                                         settings={{"home": "{home}/seismic"}})
    wards = wavepipe_ingest_dag(dag_id="wards_ingest", topic="wards", group="wards-ingest", schedule=None,
                                settings={{"home": "{home}/wards", "max_records_per_partition": 1000}})
"""
#: A DAG file with a typo in a setting's name: an import error that names it, never a run.
TYPO_DAG = """\
    from wavepipe.plugins.airflow_dags import wavepipe_ingest_dag

    dag = wavepipe_ingest_dag(dag_id="typo_ingest", settings={"hme": "/tmp/x"})
"""
DAGBAG = """\
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
bag = DagBag(dag_folder=sys.argv[1])
# as the scheduler reads a DAG: its timetable found through the installed package's plugin
read = {d: DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[d])) for d in bag.dags}
print(json.dumps({"dags": {d: {"tasks": [t.task_id for t in bag.dags[d].topological_sort()],
                               "topic": bag.dags[d].params["topic"], "schedule": str(bag.dags[d].timetable),
                               "read_as": type(getattr(read[d].timetable, "timetable", read[d].timetable)).__name__}
                           for d in sorted(bag.dags)},
                  "errors": {k.rsplit("/", 1)[-1]: v for k, v in bag.import_errors.items()}}))
"""


def _venv_env(venv: Path, **extra: str) -> dict[str, str]:
    """The environment of a process of the installed wavepipe: nothing of the checkout's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WAVEPIPE_", "AIRFLOW", "PYTHON", "VIRTUAL_ENV", "PYSPARK", "XDG_"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "VIRTUAL_ENV": str(venv), **extra}


def _run(args: list, *, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{args} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """wavepipe's wheel built from this checkout and installed, with the pinned dependencies, into
    a new virtualenv in a temporary folder (pip's cache makes the second install quick)."""
    root = tmp_path_factory.mktemp("wheel")
    assert not root.is_relative_to(PROJECT_ROOT)
    dist = root / "dist"
    # from a copy of the sources (setuptools builds in the tree: a stale build/ of the checkout would
    # end up in the wheel); pip fetches the build backend pyproject.toml names, as `make setup` did
    src = root / "src"
    shutil.copytree(
        PROJECT_ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".cache",
            ".wavepipe",
            ".pytest_cache",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            "tests",
        ),
    )
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, src], cwd=root, env=dict(os.environ)
    )
    wheels = sorted(dist.glob("wavepipe-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=root, env=dict(os.environ))
    env = _venv_env(venv)
    _run(
        [
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            PROJECT_ROOT / "requirements.lock",
            wheels[0],
        ],
        cwd=root,
        env=env,
        timeout=1200,
    )
    _run([venv / "bin" / "python", "-m", "pip", "check"], cwd=root, env=env)
    return root, venv, wheels[0]


def test_the_wheel_holds_the_package_and_no_source_tree_paths(installed):
    root, venv, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"wavepipe", "wavepipe-0.1.0.dist-info"}, sorted(names)
    for needed in (
        "wavepipe/spark_apps/reassemble.py",
        "wavepipe/plugins/airflow_dags.py",
        "wavepipe/contracts/runfiles.py",
        "wavepipe/local/processes.py",
        "wavepipe/resources/report.html.j2",
        "wavepipe/dags/wavepipe_ingest.py",
        "wavepipe/resources/kafka-pom.xml",
        "wavepipe/resources/spark-log4j2.properties",
        "wavepipe/bench/spark-kafka-pom.xml",
        # what Data Docs load instead of CDNs (wavepipe.offline_docs), each one named there
        *(f"wavepipe/resources/data_docs/{f}" for f in set(LOCAL_COPIES.values()) - {None}),
        "wavepipe/resources/data_docs/webfonts/fa-solid-900.woff2",
    ):
        assert needed in names, needed
    env = _venv_env(venv)
    where = _run(
        [
            venv / "bin" / "python",
            "-c",
            "import json, wavepipe, wavepipe.spark_apps.reassemble as r, wavepipe.contracts.config as c, "
            "wavepipe.pipeline as p, wavepipe.local.airflow as l, wavepipe.local.jars as j\n"
            "print(json.dumps({'package': wavepipe.__file__, 'app': r.__file__, 'checkout': str(c.source_checkout()), "
            "'home': str(c.load_settings().home), 'jars': str(c.load_settings().jars_dir), "
            "'reassemble_app': str(p.REASSEMBLE_APP), 'dags': str(l.DAGS_FOLDER), "
            "'pom': str(j.RESOURCES / 'kafka-pom.xml'), 'pom_exists': (j.RESOURCES / 'kafka-pom.xml').is_file()}))",
        ],
        cwd=root,
        env={**env, "HOME": str(root / "user")},
    )
    found = json.loads(where.stdout)
    site = venv / "lib"
    for key in ("package", "app", "reassemble_app", "dags", "pom"):
        assert Path(found[key]).is_relative_to(site), (key, found)
    assert found["checkout"] == "None" and found["pom_exists"]
    # an installed wavepipe keeps its state in the user's folders, never beside its code
    assert found["home"] == str(root / "user" / ".local" / "share" / "wavepipe"), found
    assert found["jars"] == str(root / "user" / ".cache" / "wavepipe" / "jars"), found
    assert Path(found["reassemble_app"]).is_file() and (Path(found["dags"]) / "wavepipe_ingest.py").is_file()
    cli = _run([venv / "bin" / "wavepipe", "--help"], cwd=root, env=env)
    assert "wavepipe" in cli.stdout and "run" in cli.stdout


def test_a_users_dag_folder_runs_two_pipelines_side_by_side(installed, kafka, spark, tmp_path):
    _, venv, _ = installed
    home = tmp_path / "homes"
    base = load_settings(
        bootstrap_servers=kafka.bootstrap,
        partitions=2,
        kafka_client_config={},
        new_group_start="earliest",
        home=home / "seismic",
    )
    tag = os.urandom(4).hex()
    seismic = base.replace(topic=f"seismic-{tag}", group=f"seismic-{tag}")
    dags = tmp_path / "user-dags"
    dags.mkdir()
    (dags / "pipelines.py").write_text(
        textwrap.dedent(USER_DAGS.format(topic=seismic.topic, group=seismic.group, home=home))
    )
    (dags / "typo.py").write_text(textwrap.dedent(TYPO_DAG))
    airflow_home = tmp_path / "airflow"
    env = _venv_env(
        venv,
        AIRFLOW_HOME=str(airflow_home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{airflow_home / 'airflow.db'}",
        WAVEPIPE_BOOTSTRAP_SERVERS=kafka.bootstrap,
        WAVEPIPE_PARTITIONS="2",
        WAVEPIPE_NEW_GROUP_START="earliest",
        WAVEPIPE_SPARK_CONNECT_PORT=str(free_port()),
        WAVEPIPE_SPARK_MASTER="local[2]",
        WAVEPIPE_JARS=str(base.jars_dir),
        HOME=str(tmp_path / "user"),
    )

    bag = json.loads(
        _run([venv / "bin" / "python", "-c", DAGBAG, dags], cwd=tmp_path, env=env).stdout.strip().splitlines()[-1]
    )
    assert sorted(bag["dags"]) == ["seismic_ingest", "seismic_rewind", "wards_ingest"], bag
    assert bag["dags"]["seismic_ingest"]["tasks"] == ["plan", "consume", "reassemble", "validate", "commit"]
    assert bag["dags"]["seismic_ingest"]["topic"] == seismic.topic and bag["dags"]["wards_ingest"]["topic"] == "wards"
    assert "x-wavepipe://clock/seismic_ingest" in bag["dags"]["seismic_ingest"]["schedule"]
    assert bag["dags"]["seismic_ingest"]["read_as"] == "BackfillWindows"
    assert "NullTimetable" in bag["dags"]["wards_ingest"]["schedule"]
    assert (
        list(bag["errors"]) == ["typo.py"]
        and "'hme' is not a wavepipe setting" in bag["errors"]["typo.py"]
        and "home" in bag["errors"]["typo.py"]
    ), bag["errors"]

    # a bounded run of one pipeline, through real Airflow task execution in the installed package;
    # its Spark engine (the pipeline home's, started on demand) runs the installed Python
    ensure_topic(seismic)
    sent = produce_demo(seismic, count=4, target_bytes=16 * 1024)
    _run([venv / "bin" / "airflow", "db", "migrate"], cwd=tmp_path, env=env)
    (tmp_path / "typo.py").write_bytes((dags / "typo.py").read_bytes())
    (dags / "typo.py").unlink()  # `dags test` parses the whole folder
    engine_env = {**env, "WAVEPIPE_HOME": str(seismic.home)}
    try:
        run = subprocess.run(
            [str(venv / "bin" / "airflow"), "dags", "test", "seismic_ingest"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-6000:]
        pid = LocalEngine(seismic).pid()
        assert pid, "the pipeline home's engine is not running after its run"
        # the server's Python workers (they ran the reassembly's Arrow functions): the venv's Python
        pythons = {c.cmdline()[0] for c in psutil.Process(pid).children(recursive=True) if "python" in c.name()}
        assert pythons and all(Path(exe).is_relative_to(venv) for exe in pythons), pythons
    finally:
        subprocess.run(
            [str(venv / "bin" / "wavepipe"), "spark", "down", "--force"],
            cwd=tmp_path,
            env=engine_env,
            capture_output=True,
            timeout=120,
            check=False,
        )
    rows = output_rows(spark, seismic)
    assert sorted((r[0], r[1]) for r in rows) == sorted((s.waveform_id, s.checksum) for s in sent)
    reports = list(seismic.reports_dir.glob("*.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["waveforms"] == {"output_new": 4}
    ends = {int(p): part["end"] for p, part in json.loads(reports[0].read_text())["partitions"].items()}
    assert committed_offsets(seismic, seismic.group, seismic.topic, list(ends)) == ends
    assert not (home / "wards").exists()  # the other pipeline's home: untouched
