"""Jars resolved from Maven Central by Maven, from the poms in wavepipe/resources/.

Resolution runs once per pom content: the jars land in ``<jars_dir>/<name>-<pom hash>/`` with a
``.complete`` marker, so a second call is instant and a changed pom resolves afresh.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

RESOURCES = Path(__file__).resolve().parents[1] / "resources"


class SetupError(RuntimeError):
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
) -> Path:
    """Copy the dependencies of ``pom_name`` (a file name in resources/, or a path) into a cache
    folder and return it."""
    pom = RESOURCES / pom_name if isinstance(pom_name, str) else pom_name
    filters = (include_group_ids or "") + (f"|{include_artifact_ids}" if include_artifact_ids else "")
    digest = hashlib.sha256(pom.read_bytes() + filters.encode()).hexdigest()[:12]
    target = jars_dir.resolve() / f"{pom.stem}-{digest}"
    if (target / ".complete").exists():
        return target
    mvn = require_tool("mvn", "Install Maven (apt-get install maven); it resolves the jars from Maven Central.")
    require_tool("java", "Install Java 17 (apt-get install openjdk-17-jre-headless).")
    print(f"resolving jars of {pom_name} from Maven Central into {target} ...", file=sys.stderr, flush=True)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={target}"]
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
    """Hadoop's S3A connector and the AWS SDK modules it uses (about 16 MB), for ``s3a://``."""
    return sorted(resolve_jars("s3-pom.xml", jars_dir, include_group_ids=S3_GROUPS).glob("*.jar"))


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
    """Delta Lake jars for the pinned Spark (only io.delta artifacts: Spark ships the rest)."""
    folder = resolve_jars("spark-pom.xml", jars_dir, include_group_ids="io.delta")
    return sorted(folder.glob("*.jar"))
