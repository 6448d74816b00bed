"""Jars resolved from Maven Central by Maven, from the poms in wavepipe/resources/.

Resolution runs once per pom content: the jars land in ``<jars_dir>/<name>-<pom hash>/`` with a
``.complete`` marker, so a second call is instant and a changed pom resolves afresh.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from wavepipe.contracts.errors import StepFailedError

RESOURCES = Path(__file__).resolve().parent / "resources"

#: The Delta Lake release resolved for each Spark minor version wavepipe supports: the newest with
#: a Maven Central build for that Spark (``io.delta:delta-spark_<minor>_2.13``). Spark 4.3 has none
#: yet, and Airflow's Spark provider has no pyspark-client 4.3 (see ``pyspark_problem``).
DELTA_FOR_SPARK = {"4.1": "4.4.0", "4.2": "4.4.0"}


class SetupError(StepFailedError):
    """Something the machine must provide is missing; the message says what to do."""


def require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SetupError(f"`{name}` was not found on PATH. {hint}")
    return path


def resolve_jars(
    pom_name: str | Path,
    jars_dir: Path,
    *,
    include_group_ids: str | None = None,
    include_artifact_ids: str | None = None,
    properties: dict[str, str] | None = None,
) -> Path:
    """Copy the dependencies of ``pom_name`` (a file name in resources/, or a path), with its
    ``properties`` set (Maven's ``-Dname=value``), into a cache folder and return it."""
    pom = RESOURCES / pom_name if isinstance(pom_name, str) else pom_name
    defines = [f"-D{name}={value}" for name, value in sorted((properties or {}).items())]
    filters = (include_group_ids or "") + (f"|{include_artifact_ids}" if include_artifact_ids else "")
    filters += "".join(f"|{d}" for d in defines)
    digest = hashlib.sha256(pom.read_bytes() + filters.encode()).hexdigest()[:12]
    target = jars_dir.resolve() / f"{pom.stem}-{digest}"
    if (target / ".complete").exists():
        return target
    mvn = require_tool("mvn", "Install Maven (apt-get install maven); it resolves the jars from Maven Central.")
    require_tool("java", "Install Java 17 (apt-get install openjdk-17-jdk-headless).")
    print(f"resolving jars of {pom_name} from Maven Central into {target} ...", file=sys.stderr, flush=True)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={target}", *defines]
    if include_group_ids:
        cmd.append(f"-DincludeGroupIds={include_group_ids}")
    if include_artifact_ids:
        cmd.append(f"-DincludeArtifactIds={include_artifact_ids}")
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SetupError(
            f"Maven could not resolve {pom}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}\n"
            "Check that Maven Central is reachable (or a mirror in ~/.m2/settings.xml), then retry."
        )
    (target / ".complete").write_text("ok\n")
    return target


def kafka_jars(jars_dir: Path) -> Path:
    return resolve_jars("kafka-pom.xml", jars_dir)


#: What ``s3_jars`` keeps of resources/s3-pom.xml's dependencies: S3A and the AWS SDK.
S3_GROUPS = ",".join(
    (
        "org.apache.hadoop",
        "software.amazon.awssdk",
        "software.amazon.eventstream",
        "software.amazon.s3.analyticsaccelerator",
        "org.reactivestreams",
    )
)


def s3_jars(jars_dir: Path) -> list[Path]:
    """Hadoop's S3A connector, at the Hadoop release the installed pyspark ships, and the AWS SDK
    modules it uses (about 16 MB), for ``s3a://``."""
    hadoop = {"hadoop.version": hadoop_version()}
    return sorted(resolve_jars("s3-pom.xml", jars_dir, include_group_ids=S3_GROUPS, properties=hadoop).glob("*.jar"))


def gcs_jars(jars_dir: Path) -> list[Path]:
    """Google's Hadoop connector for ``gs://`` (shaded: one jar, about 37 MB)."""
    return sorted(resolve_jars("gcs-pom.xml", jars_dir, include_artifact_ids="gcs-connector").glob("*.jar"))


def logstore_jar(jars_dir: Path) -> Path:
    """wavepipe's Delta LogStore for object stores (resources/logstore/), built once by Maven."""
    source = RESOURCES / "logstore"
    files = sorted(p for p in source.rglob("*") if p.is_file())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:12]
    target = jars_dir.resolve() / f"logstore-{digest}"
    jar = target / "wavepipe-logstore.jar"
    if jar.exists():
        return jar
    mvn = require_tool("mvn", "Install Maven (apt-get install maven); it builds wavepipe's Delta LogStore.")
    print(f"building wavepipe's Delta LogStore with Maven into {target} ...", file=sys.stderr, flush=True)
    build = target / "build"
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(source, build)  # the package's own folder stays as it is (no target/ in it)
    cmd = [mvn, "-q", "-B", "-f", str(build / "pom.xml"), "package"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SetupError(f"Maven could not build {source}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    shutil.copy(build / "target" / "wavepipe-logstore-1.jar", jar.with_suffix(".part"))
    jar.with_suffix(".part").replace(jar)
    shutil.rmtree(build, ignore_errors=True)
    return jar


def spark_jars(jars_dir: Path) -> list[Path]:
    """Delta Lake jars for the installed Spark (only io.delta artifacts: Spark ships the rest)."""
    build = delta_build(installed_pyspark())
    folder = resolve_jars("spark-pom.xml", jars_dir, include_group_ids="io.delta", properties=build)
    return sorted(folder.glob("*.jar"))


def installed_pyspark() -> str:
    """The installed pyspark's release, after checking that nothing else overwrote its files."""
    version = metadata.version("pyspark")
    try:
        client = metadata.version("pyspark-client")
    except metadata.PackageNotFoundError:
        client = None
    problem = pyspark_problem(version, client)
    if problem:
        raise SetupError(problem)
    return version


def pyspark_problem(pyspark: str, client: str | None) -> str | None:
    """Why this pyspark (and the pyspark-client installed beside it, if any) cannot run wavepipe's
    Spark work, or None. Both install into the same ``pyspark/`` folder, so a different release of
    one overwrites files of the other."""
    if client is not None and client != pyspark:
        return (
            f"pyspark {pyspark} and pyspark-client {client} are both installed and share the pyspark/ folder, so "
            f"each overwrote files of the other: install the same release of both "
            f"(pip install pyspark=={client} or pyspark-client=={pyspark}, whichever exists)"
        )
    try:
        delta_build(pyspark)
    except SetupError as err:
        return str(err)
    return None


def delta_build(pyspark: str) -> dict[str, str]:
    """The Maven properties of resources/spark-pom.xml for Spark ``pyspark``: its minor version and
    the Delta Lake release built for it."""
    minor = ".".join(pyspark.split(".")[:2])
    if minor not in DELTA_FOR_SPARK:
        supported = ", ".join(DELTA_FOR_SPARK)
        raise SetupError(
            f"pyspark {pyspark} is not supported: wavepipe resolves Delta Lake for Spark {supported} "
            f"(install {_required('pyspark')} with the same release of pyspark-client)"
        )
    return {"spark.binary": minor, "delta.version": DELTA_FOR_SPARK[minor]}


def _required(name: str) -> str:
    """The requirement on ``name`` that wavepipe's installed metadata declares."""
    from packaging.requirements import Requirement

    try:
        found = [Requirement(r) for r in metadata.requires("wavepipe") or ()]
    except metadata.PackageNotFoundError:
        found = []
    return next((f"{name}{r.specifier}" for r in found if r.name == name and not r.marker), name)


def hadoop_version() -> str:
    """The Hadoop release whose client jars the installed pyspark ships."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise SetupError("pyspark's jars have no hadoop-client-api: reinstall pyspark (not pyspark-client alone)")
    return jars[-1].stem.removeprefix("hadoop-client-api-")
