"""wavepipe as a release: its sdist and wheel, built and checked as a team would receive them, and
the wheel installed (not editable) into fresh virtualenvs outside the checkout with each dependency
set of its tested ranges (tests/compat.py: the oldest the ranges allow, the newest released). In
each: pip check, the unit tier, the CLI, Spark apps that a Spark Connect server's Python workers
import from the installed package, and DAG factories a user's DAG folder calls to run two
pipelines side by side through ``airflow dags test``."""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from packaging.specifiers import SpecifierSet

from tests.compat import OLDEST_AIRFLOW_PINS, SETS, lowest_pins, newest_python
from tests.helpers import assert_delta_rs_reads_as_spark, output_rows, progress
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.config import PROJECT_ROOT, load_settings
from wavepipe.local.engine_server import LocalEngine
from wavepipe.local.kafka import free_port
from wavepipe.offline_docs import LOCAL_COPIES

pytestmark = pytest.mark.integration

PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
VERSION = PYPROJECT["version"]

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


@dataclass(frozen=True)
class Release:
    root: Path
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Installed:
    name: str
    venv: Path
    release: Release
    versions: dict[str, str]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Release:
    """The sdist, and the wheel built from that sdist (so the sdist is complete), made with
    ``python -m build`` from a copy of the sources (setuptools builds in the tree: a stale build/
    of the checkout would end up in them), both passing ``twine check --strict``."""
    root = tmp_path_factory.mktemp("release")
    assert not root.is_relative_to(PROJECT_ROOT)
    src = root / "src"
    ignore = (".git", ".venv", ".cache", ".wavepipe", ".pytest_cache", "build", "dist", "*.egg-info", "__pycache__")
    shutil.copytree(PROJECT_ROOT, src, ignore=shutil.ignore_patterns(*ignore, "tests"))
    dist = root / "dist"
    progress("building the sdist and the wheel (python -m build)")
    _run([sys.executable, "-m", "build", "--outdir", dist, src], cwd=root, env=dict(os.environ))
    (sdist,), (wheel,) = sorted(dist.glob("wavepipe-*.tar.gz")), sorted(dist.glob("wavepipe-*.whl"))
    _run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel], cwd=root, env=dict(os.environ))
    return Release(root, sdist, wheel)


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read(f"wavepipe-{VERSION}.dist-info/METADATA"))
    return meta.get_all("Requires-Dist") or []


@pytest.fixture(scope="module", params=SETS)
def installed(request, release) -> Installed:
    """The wheel with its test extra installed into a new virtualenv with one dependency set: the
    oldest (every lower bound of wavepipe's requirements pinned, on this Python) or the newest
    (pip's newest releases within the ranges, on the newest Python found); pip's cache makes a
    second install quick. ``pip check`` passes."""
    name = request.param
    python = sys.executable if name == "oldest" else newest_python()
    venv = release.root / f"venv-{name}"
    _run([python, "-m", "venv", venv], cwd=release.root, env=dict(os.environ))
    env = _venv_env(venv)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--quiet", "--upgrade", "pip"], cwd=release.root, env=env)
    constraints = []
    if name == "oldest":
        pins = release.root / "oldest.txt"
        pins.write_text("\n".join([*lowest_pins(_requires(release.wheel)), *OLDEST_AIRFLOW_PINS]) + "\n")
        constraints = ["-c", pins]
    progress(f"installing the wheel with the {name} dependency set ({Path(python).name}; a few minutes when cold)")
    _run([*pip, "install", "--quiet", *constraints, f"{release.wheel}[test]"], cwd=release.root, env=env, timeout=1800)
    _run([*pip, "check"], cwd=release.root, env=env)
    names = ("apache-airflow", "pyspark", "pyspark-client", "numpy", "pandas", "pyarrow", "great-expectations")
    listed = _run([*pip, "list", "--format", "json"], cwd=release.root, env=env).stdout
    versions = {p["name"].lower(): p["version"] for p in json.loads(listed) if p["name"].lower() in names}
    versions["python"] = _run(
        [venv / "bin" / "python", "-c", "import platform; print(platform.python_version())"], cwd=release.root, env=env
    ).stdout.strip()
    progress(f"{name} set: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    return Installed(name, venv, release, versions)


def test_the_release_files_are_complete(release):
    """What a team's pip, index and scanners read: the license, the Python versions, the tested
    ranges (every requirement with a floor), the version of pyproject.toml, and only the package."""
    with zipfile.ZipFile(release.wheel) as z:
        names = z.namelist()
        meta = email.message_from_bytes(z.read(f"wavepipe-{VERSION}.dist-info/METADATA"))
    assert {n.split("/")[0] for n in names} == {"wavepipe", f"wavepipe-{VERSION}.dist-info"}, sorted(names)
    assert f"wavepipe-{VERSION}.dist-info/licenses/LICENSE" in names
    assert meta["Version"] == VERSION and meta["License-Expression"] == "Apache-2.0"
    assert SpecifierSet(meta["Requires-Python"]) == SpecifierSet(PYPROJECT["requires-python"])
    pythons = {c.rsplit(" :: ", 1)[-1] for c in meta.get_all("Classifier") if c.startswith("Programming Language")}
    assert {"3.11", "3.12", "3.13"} <= pythons, pythons
    assert len(lowest_pins(meta.get_all("Requires-Dist"))) == len(PYPROJECT["dependencies"])
    core = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert not [r for r in core if "==" in r], "a requirement of the package is pinned to one release"
    with tarfile.open(release.sdist) as sdist:
        members = {m.name.split("/", 1)[-1] for m in sdist.getmembers()}
    for needed in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "consumers/planner.py",
        "spark_apps/reassemble.py",
        "wavepipe/resources/logstore/pom.xml",
        "dags/wavepipe_ingest.py",
    ):
        assert needed in members, needed
    for needed in (
        "wavepipe/spark_apps/reassemble.py",
        "wavepipe/plugins/airflow_dags.py",
        "wavepipe/contracts/runfiles.py",
        "wavepipe/processes.py",
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


def test_the_installed_package_runs_without_the_source_tree(installed):
    root, venv = installed.release.root, installed.venv
    env = _venv_env(venv)
    where = _run(
        [
            venv / "bin" / "python",
            "-c",
            "import json, wavepipe, wavepipe.spark_apps.reassemble as r, wavepipe.contracts.config as c, "
            "wavepipe.pipeline as p, wavepipe.local.airflow as l, wavepipe.jars as j\n"
            "print(json.dumps({'package': wavepipe.__file__, 'app': r.__file__, 'checkout': str(c.source_checkout()), "
            "'home': str(c.load_settings().home), 'jars': str(c.load_settings().jars_dir), "
            "'engine_app': str(p.ENGINE_APP), 'dags': str(l.DAGS_FOLDER), "
            "'pom': str(j.RESOURCES / 'kafka-pom.xml'), 'pom_exists': (j.RESOURCES / 'kafka-pom.xml').is_file(), "
            "'delta': j.delta_build(j.installed_pyspark())}))",
        ],
        cwd=root,
        env={**env, "HOME": str(root / "user")},
    )
    found = json.loads(where.stdout)
    site = venv / "lib"
    for key in ("package", "app", "engine_app", "dags", "pom"):
        assert Path(found[key]).is_relative_to(site), (key, found)
    assert found["checkout"] == "None" and found["pom_exists"]
    # an installed wavepipe keeps its state in the user's folders, never beside its code
    assert found["home"] == str(root / "user" / ".local" / "share" / "wavepipe"), found
    assert found["jars"] == str(root / "user" / ".cache" / "wavepipe" / "jars"), found
    assert Path(found["engine_app"]).is_file() and (Path(found["dags"]) / "wavepipe_ingest.py").is_file()
    # the Delta build resolved for this set's Spark
    assert found["delta"]["spark.binary"] == ".".join(installed.versions["pyspark"].split(".")[:2]), found
    assert _run([venv / "bin" / "wavepipe", "--version"], cwd=root, env=env).stdout.strip() == f"wavepipe {VERSION}"
    cli = _run([venv / "bin" / "wavepipe", "--help"], cwd=root, env=env)
    assert "wavepipe" in cli.stdout and "run" in cli.stdout


def test_the_unit_tier_passes(installed, tmp_path):
    """The checkout's unit tests, on a copy outside it, import the installed package; the tests of
    the repository's own files (its docs, docker/, layout) are the checkout's, not the package's."""
    shutil.copytree(PROJECT_ROOT / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    ini = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = "".join(f"\n    {m}" for m in ini["markers"])
    (tmp_path / "pytest.ini").write_text(f"[pytest]\npythonpath = .\naddopts = -ra\nmarkers ={markers}\n")
    env = _venv_env(installed.venv, HOME=str(tmp_path / "user"))
    progress(f"the unit tier on the {installed.name} set")
    result = _run(
        [
            installed.venv / "bin" / "python",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not repository",
            "tests/unit",
        ],
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, result.stdout[-3000:]


def test_a_users_dag_folder_runs_two_pipelines_side_by_side(installed, kafka, spark, tmp_path):
    venv = installed.venv
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
    # the table this set's Spark and Delta wrote, read by the checkout's delta-rs as by its Spark
    assert assert_delta_rs_reads_as_spark(spark, seismic.output_table) == len(sent)
    reports = list(seismic.reports_dir.glob("*.json"))
    assert len(reports) == 1 and json.loads(reports[0].read_text())["waveforms"] == {"output_new": 4}
    ends = {int(p): part["end"] for p, part in json.loads(reports[0].read_text())["partitions"].items()}
    assert committed_offsets(seismic, seismic.group, seismic.topic, list(ends)) == ends
    assert not (home / "wards").exists()  # the other pipeline's home: untouched
