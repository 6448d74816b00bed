"""docker/compose.yaml stays in step with wavepipe: its settings, its Kafka jars, its hook.

Each check is a function of the parsed stack that returns the problems it finds (empty: fine).
The tests run every check on docker/compose.yaml, and on edited copies of it, so that each check
is shown to catch the mistake it is there for. Pure Python (PyYAML comes with Airflow); one test
also runs ``docker compose config`` when the Compose CLI is there (docker/check builds it).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from wavepipe.contracts.config import PROJECT_ROOT, Settings, load_settings

pytestmark = pytest.mark.repository  # the repository's own files, not the installed package

COMPOSE_FILE = PROJECT_ROOT / "docker" / "compose.yaml"
KAFKA_POM = PROJECT_ROOT / "wavepipe" / "resources" / "kafka-pom.xml"
#: Where docker/check builds the Compose CLI plugin when `docker compose` is missing.
COMPOSE_VERSION = "v2.40.3"
CACHED_COMPOSE = PROJECT_ROOT / ".cache" / "docker-compose" / COMPOSE_VERSION / "docker-compose"
#: The profiles whose services `up` leaves out; the checks cover them too.
PROFILES = ("cli",)

Stack = dict[str, Any]


# --- reading the stack as Compose does ------------------------------------------------------------

_DOLLAR = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.S)


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``${VAR:+other}`` (and their forms without the colon)."""

    def substitute(match: re.Match) -> str:
        if match["escaped"]:
            return "$"
        if match["named"]:
            return env.get(match["named"], "")
        braced = _BRACED.fullmatch(match["braced"])
        if braced is None:
            raise ValueError(f"cannot interpolate ${{{match['braced']}}}")
        name, op, arg = braced["name"], braced["op"], braced["arg"]
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op is None:
            return value or ""
        if op.endswith("-"):
            return arg if unset else value
        if op.endswith("?"):
            if unset:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return value
        return "" if unset else arg  # "+"

    return _DOLLAR.sub(substitute, text)


def _interpolate_all(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_all(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _interpolate_all(v, env) for k, v in node.items()}
    return node


def load_stack(path: Path = COMPOSE_FILE, env: dict[str, str] | None = None) -> Stack:
    """The compose file with its anchors and merge keys resolved and its variables interpolated
    (with ``env``, default: none set, so every ``${VAR:-default}`` takes its default)."""
    return _interpolate_all(yaml.safe_load(path.read_text()), env or {})


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in env.items()}


def _words(value: Any) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def runs(service: dict) -> str:
    """What the container runs: its entrypoint and command, as one string."""
    return " ".join(_words(service.get("entrypoint")) + _words(service.get("command")))


def volume_mounts(service: dict) -> dict[str, str]:
    """target path -> source (a named volume or a host path) of the service's mounts."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            parts = volume.split(":")
            if len(parts) >= 2:
                mounts[parts[1]] = parts[0]
        else:
            mounts[volume["target"]] = volume.get("source", "")
    return mounts


def replicas(service: dict) -> int:
    return int(((service.get("deploy") or {}).get("replicas")) or 1)


def services(stack: Stack) -> dict[str, dict]:
    return stack.get("services") or {}


def kafka_services(stack: Stack) -> dict[str, dict]:
    return {n: s for n, s in services(stack).items() if str(s.get("image", "")).startswith("apache/kafka:")}


def airflow_services(stack: Stack) -> dict[str, dict]:
    return {n: s for n, s in services(stack).items() if re.search(r"\bairflow\b", runs(s))}


def task_runners(stack: Stack) -> dict[str, dict]:
    """The Airflow services that run task instances: Celery workers (or, with a local executor, the
    scheduler)."""
    found = {n: s for n, s in airflow_services(stack).items() if "celery worker" in runs(s)}
    for name, service in airflow_services(stack).items():
        executor = environment(service).get("AIRFLOW__CORE__EXECUTOR", "")
        if executor in ("LocalExecutor", "SequentialExecutor") and re.search(r"\bscheduler\b", runs(service)):
            found[name] = service
    return found


def spark_masters(stack: Stack) -> dict[str, dict]:
    return {n: s for n, s in services(stack).items() if "org.apache.spark.deploy.master.Master" in runs(s)}


def spark_workers(stack: Stack) -> dict[str, dict]:
    return {n: s for n, s in services(stack).items() if "org.apache.spark.deploy.worker.Worker" in runs(s)}


def spark_engines(stack: Stack) -> dict[str, dict]:
    """The services that run a Spark Connect server for the runs (``wavepipe spark serve``)."""
    return {n: s for n, s in services(stack).items() if re.search(r"\bspark serve\b", runs(s))}


def wavepipe_env(stack: Stack) -> dict[str, str]:
    """The WAVEPIPE_* settings of the stack: those of its task runners (checked to be one set)."""
    for service in list(task_runners(stack).values()) + list(services(stack).values()):
        env = {k: v for k, v in environment(service).items() if k.startswith("WAVEPIPE_")}
        if env:
            return env
    return {}


@contextmanager
def only_these_wavepipe_variables(env: dict[str, str]):
    """``os.environ`` with exactly ``env`` as its WAVEPIPE_* variables, and an empty config file
    (so no wavepipe.toml of this machine takes part)."""
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.toml"
        empty.write_text("")
        kept = {k: v for k, v in os.environ.items() if not k.startswith("WAVEPIPE_")}
        with mock.patch.dict(os.environ, {**kept, **env, "WAVEPIPE_CONFIG": str(empty)}, clear=True):
            yield


def settings_of(env: dict[str, str]) -> Settings:
    with only_these_wavepipe_variables(env):
        return load_settings()


def kafka_jars_version() -> str:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    return ET.parse(KAFKA_POM).getroot().find("m:properties/m:kafka.version", ns).text.strip()


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` -> {NAME: (host, port)}."""
    found = {}
    for item in filter(None, (v.strip() for v in value.split(","))):
        name, address = item.split("://", 1)
        host, port = address.rsplit(":", 1)
        found[name] = (host, int(port))
    return found


def _hostnames(name: str, service: dict) -> set[str]:
    """Names other containers reach the service by."""
    return {name, service.get("hostname") or name, service.get("container_name") or name}


# --- the checks ------------------------------------------------------------------------------------


def check_wavepipe_settings(stack: Stack) -> list[str]:
    """Every WAVEPIPE_* variable names a wavepipe setting, takes a valid value for it, and every
    container that has any has the same set (the shared x-wavepipe-env)."""
    problems = []
    fields = set(Settings.model_fields)
    sets = {}
    for name, service in services(stack).items():
        env = {k: v for k, v in environment(service).items() if k.startswith("WAVEPIPE_")}
        for key in env:
            if key[len("WAVEPIPE_") :].lower() not in fields:
                problems.append(f"{name}: {key} is not a wavepipe setting (wavepipe/contracts/config.py)")
        if env:
            sets[name] = env
    for needs in (task_runners(stack), spark_workers(stack)):
        for name in needs:
            if name not in sets:
                problems.append(f"{name}: has no WAVEPIPE_* settings")
    distinct = {json.dumps(env, sort_keys=True) for env in sets.values()}
    if len(distinct) > 1:
        problems.append(f"the WAVEPIPE_* settings differ between services {sorted(sets)}: use the one x-wavepipe-env")
    env = wavepipe_env(stack)
    if not env:
        return problems + ["no WAVEPIPE_* settings at all"]
    try:
        settings = settings_of(env)
    except (ValueError, TypeError) as exc:
        return problems + [f"the WAVEPIPE_* settings are not valid: {exc}"]
    if not str(env.get("WAVEPIPE_HOME", "")).startswith("/"):
        problems.append(f"WAVEPIPE_HOME must be an absolute path in the containers: {env.get('WAVEPIPE_HOME')!r}")
    if settings.partitions < 1:
        problems.append(f"WAVEPIPE_PARTITIONS must be at least 1: {settings.partitions}")
    if settings.consume_tasks < 0:
        problems.append(f"WAVEPIPE_CONSUME_TASKS must be 0 (a task per partition) or more: {settings.consume_tasks}")
    if settings.consume_parallelism < 1:
        problems.append(f"WAVEPIPE_CONSUME_PARALLELISM must be at least 1: {settings.consume_parallelism}")
    return problems


def check_bootstrap_servers(stack: Stack) -> list[str]:
    """The bootstrap servers are exactly the brokers' advertised CLIENT listeners."""
    problems = []
    advertised = []
    for name, service in kafka_services(stack).items():
        env = environment(service)
        listeners = _listeners(env.get("KAFKA_ADVERTISED_LISTENERS", ""))
        if "CLIENT" not in listeners:
            problems.append(f"{name}: advertises no CLIENT listener")
            continue
        host, port = listeners["CLIENT"]
        if host not in _hostnames(name, service):
            problems.append(f"{name}: its CLIENT listener advertises {host}, not a name of this container")
        bound = _listeners(env.get("KAFKA_LISTENERS", "")).get("CLIENT")
        if bound is None or bound[1] != port:
            problems.append(f"{name}: advertises CLIENT port {port} but listens on {bound}")
        advertised.append(f"{host}:{port}")
    configured = [s.strip() for s in wavepipe_env(stack).get("WAVEPIPE_BOOTSTRAP_SERVERS", "").split(",") if s.strip()]
    if sorted(configured) != sorted(advertised) or len(configured) != len(set(configured)):
        problems.append(
            f"WAVEPIPE_BOOTSTRAP_SERVERS is {','.join(configured)}; the brokers advertise {','.join(advertised)}"
        )
    return problems


def check_kafka_cluster(stack: Stack) -> list[str]:
    """Three combined broker+controller nodes in one KRaft quorum; internal topics RF 3, min ISR 2."""
    problems = []
    brokers = kafka_services(stack)
    if len(brokers) != 3:
        return [f"expected 3 Kafka nodes, found {sorted(brokers)}"]
    envs = {name: environment(s) for name, s in brokers.items()}
    voters = set()
    for name, env in envs.items():
        controller = _listeners(env.get("KAFKA_LISTENERS", "")).get(env.get("KAFKA_CONTROLLER_LISTENER_NAMES", ""))
        if controller is None:
            problems.append(f"{name}: no controller listener")
            continue
        voters.add(f"{env.get('KAFKA_NODE_ID')}@{brokers[name].get('hostname') or name}:{controller[1]}")
    for name, env in envs.items():
        if set(env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "").split(",")) != voters:
            problems.append(
                f"{name}: quorum voters {env.get('KAFKA_CONTROLLER_QUORUM_VOTERS')} are not the "
                f"three nodes ({','.join(sorted(voters))})"
            )
        if set(env.get("KAFKA_PROCESS_ROLES", "").split(",")) != {"broker", "controller"}:
            problems.append(f"{name}: process roles {env.get('KAFKA_PROCESS_ROLES')}, not broker,controller")
        expected = {
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "3",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "3",
            "KAFKA_DEFAULT_REPLICATION_FACTOR": "3",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "2",
            "KAFKA_MIN_INSYNC_REPLICAS": "2",
        }
        for key, value in expected.items():
            if env.get(key) != value:
                problems.append(f"{name}: {key} is {env.get(key)!r}, expected {value}")
        if "healthcheck" not in brokers[name]:
            problems.append(f"{name}: no healthcheck")
    if len({env.get("KAFKA_NODE_ID") for env in envs.values()}) != 3:
        problems.append("the Kafka node ids are not distinct")
    if len({env.get("CLUSTER_ID") for env in envs.values()}) != 1:
        problems.append("the Kafka nodes do not share one CLUSTER_ID")
    return problems


def check_kafka_image_version(stack: Stack) -> list[str]:
    """The brokers run the Apache Kafka release whose jars wavepipe resolves (kafka-pom.xml)."""
    version = kafka_jars_version()
    brokers = kafka_services(stack)
    if not brokers:
        return ["no apache/kafka service"]
    return [
        f"{name}: image {s['image']}, but wavepipe resolves Kafka {version} (wavepipe/resources/kafka-pom.xml)"
        for name, s in brokers.items()
        if s["image"] != f"apache/kafka:{version}"
    ]


def check_spark_cluster(stack: Stack) -> list[str]:
    """WAVEPIPE_SPARK_MASTER points at the spark-master service's port; the workers register with it;
    master and workers run from the same image as the Airflow workers."""
    problems = []
    url = wavepipe_env(stack).get("WAVEPIPE_SPARK_MASTER", "")
    match = re.fullmatch(r"spark://([^:/]+):(\d+)", url)
    masters = spark_masters(stack)
    if match is None:
        return [f"WAVEPIPE_SPARK_MASTER is {url!r}, not spark://<host>:<port>"]
    if len(masters) != 1:
        return [f"expected one Spark master service, found {sorted(masters)}"]
    ((name, master),) = masters.items()
    words = runs(master).split()
    option = lambda flag, default=None: words[words.index(flag) + 1] if flag in words else default  # noqa: E731
    if match[1] not in _hostnames(name, master):
        problems.append(f"WAVEPIPE_SPARK_MASTER names host {match[1]}, not the service {name}")
    if option("--host") not in _hostnames(name, master):
        problems.append(f"{name} binds --host {option('--host')}, which other containers do not know it by")
    if option("--port", "7077") != match[2]:
        problems.append(f"WAVEPIPE_SPARK_MASTER has port {match[2]}, but {name} listens on {option('--port', '7077')}")
    workers = spark_workers(stack)
    if sum(replicas(s) for s in workers.values()) < 2:
        problems.append(f"expected at least two Spark workers, found {sum(replicas(s) for s in workers.values())}")
    for worker_name, worker in workers.items():
        if url not in runs(worker).split():
            problems.append(f"{worker_name} does not register with {url}: {runs(worker)}")
    images = {s.get("image") for s in [*masters.values(), *workers.values(), *task_runners(stack).values()]}
    if len(images) != 1:
        problems.append(
            f"Spark and the Airflow workers must run one image (the driver's packages): {sorted(map(str, images))}"
        )
    return problems


def check_spark_engine(stack: Stack) -> list[str]:
    """WAVEPIPE_SPARK_REMOTE points at the Spark Connect service's name and port; it runs from the
    one image, on the standalone master (WAVEPIPE_SPARK_MASTER), and mounts the shared home unless
    the staging is in the object store (it is the driver of every run's Spark work)."""
    problems = []
    url = wavepipe_env(stack).get("WAVEPIPE_SPARK_REMOTE", "")
    match = re.fullmatch(r"sc://([^:/;]+):(\d+)/?", url)
    if match is None:
        return [f"WAVEPIPE_SPARK_REMOTE is {url!r}, not sc://<host>:<port>"]
    engines = spark_engines(stack)
    if len(engines) != 1:
        return [f"expected one service running `wavepipe spark serve`, found {sorted(engines)}"]
    ((name, engine),) = engines.items()
    words = runs(engine).split()
    option = lambda flag, default=None: words[words.index(flag) + 1] if flag in words else default  # noqa: E731
    if match[1] not in _hostnames(name, engine):
        problems.append(f"WAVEPIPE_SPARK_REMOTE names host {match[1]}, not the service {name}")
    if option("--port", "15002") != match[2]:
        problems.append(f"WAVEPIPE_SPARK_REMOTE has port {match[2]}, but {name} listens on {option('--port', '15002')}")
    if option("--host", "0.0.0.0") in ("127.0.0.1", "localhost"):
        problems.append(f"{name} binds {option('--host')}: other containers cannot reach it")
    if environment(engine).get("WAVEPIPE_SPARK_MASTER") != wavepipe_env(stack).get("WAVEPIPE_SPARK_MASTER"):
        problems.append(f"{name} does not run on WAVEPIPE_SPARK_MASTER")
    home = wavepipe_env(stack).get("WAVEPIPE_HOME", "")
    if not staged_in_store(stack) and home not in volume_mounts(engine):
        problems.append(f"{name} does not mount the shared home {home}: it reads what the consume tasks staged")
    images = {s.get("image") for s in [engine, *task_runners(stack).values()]}
    if len(images) != 1:
        problems.append(f"the Spark engine and the Airflow workers must run one image: {sorted(map(str, images))}")
    return problems


def check_shared_home(stack: Stack) -> list[str]:
    """WAVEPIPE_HOME is one shared named volume, mounted at that path in every Airflow service that
    runs tasks (the run state), and in every Spark worker unless the staging is in the object store
    (else the Spark apps read what the consume tasks staged there)."""
    problems = []
    home = wavepipe_env(stack).get("WAVEPIPE_HOME", "")
    runners, workers = task_runners(stack), spark_workers(stack)
    if not runners:
        problems.append("no Airflow service runs tasks (no Celery worker)")
    if not workers:
        problems.append("no Spark worker")
    if staged_in_store(stack):
        workers = {}
    sources = set()
    for name, service in {**runners, **workers}.items():
        if environment(service).get("WAVEPIPE_HOME") != home:
            problems.append(f"{name}: WAVEPIPE_HOME is {environment(service).get('WAVEPIPE_HOME')!r}, not {home!r}")
        source = volume_mounts(service).get(home)
        if source is None:
            problems.append(f"{name}: nothing is mounted at WAVEPIPE_HOME ({home})")
            continue
        if source not in (stack.get("volumes") or {}):
            problems.append(f"{name}: {home} is mounted from {source!r}, not a named volume of the stack")
        sources.add(source)
    if len(sources) > 1:
        problems.append(f"WAVEPIPE_HOME comes from different volumes: {sorted(sources)}")
    return problems


def staged_in_store(stack: Stack) -> bool:
    return wavepipe_env(stack).get("WAVEPIPE_STAGING_URI", "").startswith("s3://")


def object_stores(stack: Stack) -> dict[str, dict]:
    return {n: s for n, s in services(stack).items() if str(s.get("image", "")).startswith("chrislusf/seaweedfs:")}


def check_object_store(stack: Stack) -> list[str]:
    """The tables, the staging and the run state are in the object store service's bucket (the
    Airflow workers share no state but it): WAVEPIPE_S3_ENDPOINT
    names it and its S3 port; it runs the SeaweedFS release wavepipe builds for its local store;
    its identity holds the keys wavepipe is given; the engine and the Airflow workers wait until
    it is healthy."""
    from wavepipe.local.objectstore import WEED_RELEASE

    env = wavepipe_env(stack)
    problems = [
        f"{key} is {env.get(key)!r}, not an s3:// location"
        for key in ("WAVEPIPE_TABLES_URI", "WAVEPIPE_STAGING_URI", "WAVEPIPE_STATE_URI")
        if not env.get(key, "").startswith("s3://")
    ]
    stores = object_stores(stack)
    if len(stores) != 1:
        return [*problems, f"expected one chrislusf/seaweedfs service, found {sorted(stores)}"]
    ((name, store),) = stores.items()
    if store["image"] != f"chrislusf/seaweedfs:{WEED_RELEASE}":
        problems.append(f"{name}: image {store['image']}, but wavepipe builds SeaweedFS {WEED_RELEASE}")
    endpoint = re.fullmatch(r"http://([^:/]+):(\d+)/?", env.get("WAVEPIPE_S3_ENDPOINT", ""))
    words = runs(store).split()
    if endpoint is None:
        problems.append(f"WAVEPIPE_S3_ENDPOINT is {env.get('WAVEPIPE_S3_ENDPOINT')!r}, not http://<host>:<port>")
    elif endpoint[1] not in _hostnames(name, store) or f"-s3.port={endpoint[2]}" not in words:
        problems.append(f"WAVEPIPE_S3_ENDPOINT {endpoint[0]} is not {name}'s S3 port ({' '.join(words)})")
    identities = json.loads(stack["configs"]["s3-identities"]["content"])["identities"]
    keys = {(c["accessKey"], c["secretKey"]) for i in identities for c in i["credentials"]}
    if (env.get("WAVEPIPE_S3_ACCESS_KEY"), env.get("WAVEPIPE_S3_SECRET_KEY")) not in keys:
        problems.append(f"{name}'s identities do not hold WAVEPIPE_S3_ACCESS_KEY and WAVEPIPE_S3_SECRET_KEY")
    for waiting, service in {**spark_engines(stack), **task_runners(stack)}.items():
        if (service.get("depends_on") or {}).get(name, {}).get("condition") != "service_healthy":
            problems.append(f"{waiting} does not wait for {name} to be healthy")
    return problems


#: What the API server needs to read the run pages from the run state in the object store.
STATE_SETTINGS = (
    "WAVEPIPE_STATE_URI",
    "WAVEPIPE_S3_ENDPOINT",
    "WAVEPIPE_S3_REGION",
    "WAVEPIPE_S3_ACCESS_KEY",
    "WAVEPIPE_S3_SECRET_KEY",
)


def check_pages_from_state(stack: Stack) -> list[str]:
    """The API server serves the run pages and Data Docs from the run state (wavepipe's plugin,
    wavepipe.plugins.report_app), so it needs no home of the workers': the state is in the object
    store, and the API server has the task runners' location of it and S3 settings."""
    env = wavepipe_env(stack)
    servers = {n: s for n, s in airflow_services(stack).items() if re.search(r"\bapi-server\b", runs(s))}
    problems = [] if servers else ["no Airflow API server"]
    if not env.get("WAVEPIPE_STATE_URI", "").startswith("s3://"):
        problems.append(
            f"WAVEPIPE_STATE_URI is {env.get('WAVEPIPE_STATE_URI')!r}: the run pages need it in the object store"
        )
    for name, service in servers.items():
        own = environment(service)
        problems += [
            f"{name}: {key} differs from the task runners' (it reads the run pages from the run state)"
            for key in STATE_SETTINGS
            if own.get(key) != env.get(key)
        ]
    return problems


def check_celery_on_postgres(stack: Stack) -> list[str]:
    """Every Airflow service: the Celery executor, Postgres as metadata DB and result backend, Redis
    as broker; at least two Celery workers with a few slots each."""
    problems = []
    names = set(services(stack))
    postgres = {n for n, s in services(stack).items() if str(s.get("image", "")).startswith("postgres:")}
    redis = {n for n, s in services(stack).items() if str(s.get("image", "")).startswith(("redis:", "valkey/valkey:"))}
    if not postgres or not redis:
        problems.append(f"expected a postgres and a redis service, found {sorted(names)}")
    for name, service in airflow_services(stack).items():
        env = environment(service)
        if env.get("AIRFLOW__CORE__EXECUTOR") != "CeleryExecutor":
            problems.append(f"{name}: executor {env.get('AIRFLOW__CORE__EXECUTOR')!r}, not CeleryExecutor")
        db_url = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        db = re.fullmatch(r"postgresql(\+psycopg2)?://[^@]+@([^:/]+)(:\d+)?/\w+", db_url)
        if db is None or db[2] not in postgres:
            problems.append(f"{name}: metadata DB {db_url!r} is not the postgres service")
        backend_url = env.get("AIRFLOW__CELERY__RESULT_BACKEND", "")
        backend = re.fullmatch(r"db\+postgresql(\+psycopg2)?://[^@]+@([^:/]+)(:\d+)?/\w+", backend_url)
        if backend is None or backend[2] not in postgres:
            problems.append(f"{name}: Celery result backend {backend_url!r} is not the postgres service")
        broker_url = env.get("AIRFLOW__CELERY__BROKER_URL", "")
        broker = re.fullmatch(r"redis://(:[^@]*@)?([^:/]+)(:\d+)?(/\d+)?", broker_url)
        if broker is None or broker[2] not in redis:
            problems.append(f"{name}: Celery broker {broker_url!r} is not the redis service")
    workers = {n: s for n, s in airflow_services(stack).items() if "celery worker" in runs(s)}
    if sum(replicas(s) for s in workers.values()) < 2:
        problems.append(f"expected at least two Celery workers, found {sum(replicas(s) for s in workers.values())}")
    for name, service in workers.items():
        slots = environment(service).get("AIRFLOW__CELERY__WORKER_CONCURRENCY", "16")
        if not slots.isdigit() or not 1 <= int(slots) <= 4:
            problems.append(f"{name}: AIRFLOW__CELERY__WORKER_CONCURRENCY {slots}: keep 1-4 slots a worker")
    commands = " | ".join(runs(s) for s in airflow_services(stack).values())
    for part in ("api-server", "scheduler", "dag-processor", "triggerer", "celery worker", "db migrate"):
        if part not in commands:
            problems.append(f"no Airflow service runs `airflow {part}`")
    return problems


def _connection(env: dict[str, str], conn_id: str):
    from airflow.sdk import Connection

    return Connection.from_json(env[f"AIRFLOW_CONN_{conn_id.upper()}"], conn_id=conn_id)


def check_connections(stack: Stack) -> list[str]:
    """AIRFLOW_CONN_WAVEPIPE_KAFKA and AIRFLOW_CONN_WAVEPIPE_SPARK parse, are the same in every
    Airflow service, and give wavepipe's hook exactly the settings WAVEPIPE_* give the CLI."""
    from airflow.exceptions import AirflowNotFoundException

    from wavepipe.plugins.hooks import WavepipeHook

    problems = []
    ids = ("wavepipe_kafka", "wavepipe_spark")
    values = {}
    for name, service in airflow_services(stack).items():
        env = environment(service)
        for conn_id in ids:
            key = f"AIRFLOW_CONN_{conn_id.upper()}"
            if key not in env:
                problems.append(f"{name}: no {key}")
            else:
                values.setdefault(key, set()).add(env[key])
    for key, seen in values.items():
        if len(seen) > 1:
            problems.append(f"{key} differs between the Airflow services")
    if problems:
        return problems
    env = {key: next(iter(seen)) for key, seen in values.items()}
    try:
        conns = {conn_id: _connection(env, conn_id) for conn_id in ids}
        for conn in conns.values():
            conn.extra_dejson
            json.loads(conn.extra or "{}")
    except (ValueError, TypeError) as exc:
        return [f"an AIRFLOW_CONN_* value does not parse as a JSON connection: {exc}"]
    for conn_id, conn_type in zip(ids, ("wavepipe_kafka", "wavepipe_spark_connect"), strict=True):
        if conns[conn_id].conn_type != conn_type:
            problems.append(f"{conn_id}: conn_type {conns[conn_id].conn_type!r}, expected {conn_type!r}")

    def get_connection(conn_id: str):
        if conn_id not in conns:
            raise AirflowNotFoundException(conn_id)
        return conns[conn_id]

    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    wp_env = wavepipe_env(stack)
    try:
        with (
            mock.patch.object(WavepipeHook, "get_connection", side_effect=get_connection),
            mock.patch.object(SparkConnectHook, "get_connection", side_effect=get_connection),
            only_these_wavepipe_variables(wp_env),
        ):
            through_hook = WavepipeHook().get_settings()
        direct = settings_of(wp_env)
    except (ValueError, TypeError) as exc:
        return problems + [f"wavepipe's hook rejects the connections: {exc}"]
    same = lambda field, v: v.rstrip("/") if field == "spark_remote" else v  # noqa: E731 - sc://h:p/ is sc://h:p
    for field in (
        "bootstrap_servers",
        "kafka_client_config",
        "spark_engine",
        "spark_remote",
        "spark_master",
        "spark_conf",
    ):
        if same(field, getattr(through_hook, field)) != same(field, getattr(direct, field)):
            problems.append(
                f"{field}: the Airflow Connections give {getattr(through_hook, field)!r}, "
                f"WAVEPIPE_{field.upper()} gives {getattr(direct, field)!r}"
            )
    return problems


def _shell_snippets(stack: Stack) -> list[tuple[str, str, str]]:
    """(where, shell, script) of every shell script the stack embeds: ``bash -c`` entrypoints and
    commands, and CMD-SHELL healthchecks."""
    found = []
    for name, service in services(stack).items():
        words = _words(service.get("entrypoint")) + _words(service.get("command"))
        if words and Path(words[0]).name in ("bash", "sh") and "-c" in words:
            # bash [-euo pipefail] -c SCRIPT [ARG0 ARGS...] (with options bundled as one word or not)
            script = words[words.index("-c") + 1]
            found.append((f"{name} entrypoint/command", Path(words[0]).name, script))
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test and test[0] == "CMD-SHELL":
            found.append((f"{name} healthcheck", "sh", test[1]))
        elif isinstance(test, str):
            found.append((f"{name} healthcheck", "sh", test))
        elif isinstance(test, list) and test[:2] == ["CMD", "python"] and "-c" in test:
            try:
                compile(test[test.index("-c") + 1], f"{name} healthcheck", "exec")
            except SyntaxError as exc:
                found.append((f"{name} healthcheck", "python-error", str(exc)))
    return found


def check_shell_snippets(stack: Stack) -> list[str]:
    """Every embedded shell script parses (``bash -n`` / ``sh -n``), after Compose's ``$$``."""
    problems = []
    snippets = _shell_snippets(stack)
    if not any(shell == "bash" for _, shell, _ in snippets):
        problems.append("no embedded bash script found (airflow-init and airflow-worker have one)")
    for where, shell, script in snippets:
        if shell == "python-error":
            problems.append(f"{where}: {script}")
            continue
        result = subprocess.run(
            [shutil.which(shell) or shell, "-n", "-c", script], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            problems.append(f"{where}: {shell} -n says {result.stderr.strip()}")
    return problems


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def check_image(dockerfile: str, deploy_lock: str, project_lock: str, pyproject: str, dags_folder: str) -> list[str]:
    """The Dockerfile copies every folder pyproject.toml installs a package from (to build the
    wheel), installs that wheel (not an editable checkout) with the deployment's providers from
    docker/requirements-deploy.lock on top of requirements.lock, which that lock neither re-pins
    nor undoes (no Spark provider of its own: its pyspark-client would replace pyspark unless
    pinned to exactly pyspark's version, as requirements.lock does), and puts every DAG file of
    dags/ into ``dags_folder``, the Airflow services' DAG folder."""
    import tomllib

    problems = []
    copies = [line.split() for line in dockerfile.splitlines() if line.upper().startswith("COPY ")]
    copied = {words[1] for words in copies}
    package_dirs = tomllib.loads(pyproject)["tool"]["setuptools"]["package-dir"].values()
    for folder in sorted({d.split("/")[0] for d in package_dirs}):
        if folder not in copied:
            problems.append(f"docker/Dockerfile does not COPY {folder}/, which pyproject.toml installs a package from")
    install = next((line for line in dockerfile.splitlines() if "pip install" in line), "")
    for needed in ("-c requirements.lock", "-r docker/requirements-deploy.lock"):
        if needed not in install:
            problems.append(f"docker/Dockerfile's pip install lacks `{needed}`: {install.strip()}")
    if " -e " in f"{install} " or "wavepipe-*.whl" not in install:
        problems.append(f"docker/Dockerfile does not install wavepipe's built wheel: {install.strip()}")
    into_dags = {
        source for words in copies if words[-1].rstrip("/") == dags_folder.rstrip("/") for source in words[1:-1]
    }
    for dag_file in sorted(p.name for p in (PROJECT_ROOT / "dags").glob("*.py") if p.name != "__init__.py"):
        if f"dags/{dag_file}" not in into_dags:
            problems.append(
                f"docker/Dockerfile does not COPY dags/{dag_file} into the Airflow services' DAG folder {dags_folder}"
            )
    if "pip check" not in dockerfile:
        problems.append("docker/Dockerfile does not run pip check")
    deploy, project = _pins(deploy_lock), _pins(project_lock)
    for name, version in deploy.items():
        if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version):
            problems.append(f"docker/requirements-deploy.lock: {name} is not pinned exactly ({version!r})")
        if name in project:
            problems.append(f"docker/requirements-deploy.lock re-pins {name}, which requirements.lock pins")
    for name in ("apache-airflow-providers-celery", "apache-airflow-providers-postgres", "psycopg2-binary", "redis"):
        if name not in deploy:
            problems.append(f"docker/requirements-deploy.lock lacks {name}")
    for name in ("apache-airflow-providers-apache-spark", "pyspark-client"):
        if name in deploy and name not in project:
            problems.append(f"docker/requirements-deploy.lock has {name}, which replaces pyspark")
    if "apache-airflow-providers-apache-spark" in project and project.get("pyspark-client") != project.get("pyspark"):
        problems.append(
            f"requirements.lock lacks pyspark-client=={project.get('pyspark')} (exactly pyspark's "
            f"version, so the Spark provider's pyspark-client does not replace pyspark's files)"
        )
    return problems


def _image_inputs() -> dict[str, str]:
    return {
        "dockerfile": (PROJECT_ROOT / "docker" / "Dockerfile").read_text(),
        "deploy_lock": (PROJECT_ROOT / "docker" / "requirements-deploy.lock").read_text(),
        "project_lock": (PROJECT_ROOT / "requirements.lock").read_text(),
        "pyproject": (PROJECT_ROOT / "pyproject.toml").read_text(),
        "dags_folder": environment(services(load_stack())["airflow-scheduler"])["AIRFLOW__CORE__DAGS_FOLDER"],
    }


CHECKS: list[Callable[[Stack], list[str]]] = [
    check_wavepipe_settings,
    check_bootstrap_servers,
    check_kafka_cluster,
    check_kafka_image_version,
    check_spark_cluster,
    check_spark_engine,
    check_shared_home,
    check_object_store,
    check_pages_from_state,
    check_celery_on_postgres,
    check_connections,
    check_shell_snippets,
]


# --- the tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack() -> Stack:
    return load_stack()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_the_stack_passes(stack, check):
    assert check(copy.deepcopy(stack)) == []


def _set_everywhere(stack: Stack, key: str, value: str | None) -> None:
    """Edit a variable in every service that has it (as editing the shared anchor would)."""
    for service in services(stack).values():
        env = service.get("environment")
        if isinstance(env, dict) and key in env:
            if value is None:
                del env[key]
            else:
                env[key] = value


def _set_in(stack: Stack, service: str, key: str, value: str) -> None:
    services(stack)[service]["environment"] = {**environment(services(stack)[service]), key: value}


def _replace_word(stack: Stack, service: str, old: str, new: str) -> None:
    svc = services(stack)[service]
    for field in ("entrypoint", "command"):
        if isinstance(svc.get(field), list):
            svc[field] = [new if w == old else w for w in svc[field]]


def _drop_mount(stack: Stack, service: str, target: str) -> None:
    svc = services(stack)[service]
    svc["volumes"] = [v for v in svc["volumes"] if not (isinstance(v, str) and v.split(":")[1] == target)]


SPARK_CONN, KAFKA_CONN = "AIRFLOW_CONN_WAVEPIPE_SPARK", "AIRFLOW_CONN_WAVEPIPE_KAFKA"


def _edit_conn(stack: Stack, variable: str, **changes) -> None:
    """Change fields of the Connection JSON in ``variable`` in every Airflow service."""
    for name in airflow_services(stack):
        conn = json.loads(environment(services(stack)[name])[variable])
        conn.update(changes)
        _set_in(stack, name, variable, json.dumps(conn))


def _kafka_extra(stack: Stack, **changes) -> dict:
    """The Kafka Connection's extra (its librdkafka configuration) with ``changes``."""
    conn = json.loads(environment(services(stack)["airflow-worker"])[KAFKA_CONN])
    return {**conn["extra"], **changes}


def _break_script(stack: Stack) -> None:
    svc = services(stack)["airflow-init"]
    svc["command"] = [svc["command"][0] + '\nif [ -n "$x" ]; then\n  echo unterminated\n']


#: (the check, an edit of the stack that breaks what it checks, a phrase of the problem it reports)
MUTATIONS = [
    (check_wavepipe_settings, lambda s: _set_everywhere(s, "WAVEPIPE_PARTITIONS", "twelve"), "not valid"),
    (check_wavepipe_settings, lambda s: _set_everywhere(s, "WAVEPIPE_CONSUME_TASKS", "-1"), "WAVEPIPE_CONSUME_TASKS"),
    (check_wavepipe_settings, lambda s: _set_everywhere(s, "WAVEPIPE_CONSUME_TASKS", "four"), "not valid"),
    (check_wavepipe_settings, lambda s: _set_everywhere(s, "WAVEPIPE_SPARK_CONF", "[1]"), "not valid"),
    (
        check_wavepipe_settings,
        lambda s: _set_in(s, "airflow-worker", "WAVEPIPE_PARTITON", "12"),
        "not a wavepipe setting",
    ),
    (check_wavepipe_settings, lambda s: _set_in(s, "spark-worker", "WAVEPIPE_TOPIC", "other"), "differ"),
    (check_wavepipe_settings, lambda s: _set_everywhere(s, "WAVEPIPE_HOME", "data"), "absolute"),
    (
        check_bootstrap_servers,
        lambda s: _set_everywhere(s, "WAVEPIPE_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092"),
        "WAVEPIPE_BOOTSTRAP_SERVERS",
    ),
    (
        check_bootstrap_servers,
        lambda s: _set_everywhere(s, "WAVEPIPE_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092,kafka-3:9091"),
        "advertise",
    ),
    (
        check_bootstrap_servers,
        lambda s: _set_in(s, "kafka-2", "KAFKA_ADVERTISED_LISTENERS", "CLIENT://kafka-2:9095,INTERNAL://kafka-2:9091"),
        "listens on",
    ),
    (
        check_bootstrap_servers,
        lambda s: _set_in(
            s, "kafka-3", "KAFKA_ADVERTISED_LISTENERS", "CLIENT://localhost:9092,INTERNAL://kafka-3:9091"
        ),
        "not a name",
    ),
    (check_kafka_cluster, lambda s: _set_in(s, "kafka-2", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1"), "MIN_ISR"),
    (
        check_kafka_cluster,
        lambda s: _set_in(s, "kafka-1", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),
        "REPLICATION",
    ),
    (
        check_kafka_cluster,
        lambda s: _set_in(s, "kafka-3", "KAFKA_CONTROLLER_QUORUM_VOTERS", "1@kafka-1:9093,2@kafka-2:9093"),
        "quorum voters",
    ),
    (check_kafka_cluster, lambda s: services(s).pop("kafka-3"), "expected 3"),
    (check_kafka_image_version, lambda s: services(s)["kafka-2"].update(image="apache/kafka:4.1.0"), "resolves Kafka"),
    (check_spark_cluster, lambda s: _replace_word(s, "spark-master", "7077", "7078"), "listens on"),
    (check_spark_cluster, lambda s: _set_everywhere(s, "WAVEPIPE_SPARK_MASTER", "spark://spark:7077"), "names host"),
    (check_spark_cluster, lambda s: _set_everywhere(s, "WAVEPIPE_SPARK_MASTER", "local[2]"), "not spark://"),
    (check_spark_cluster, lambda s: services(s)["spark-worker"].update(deploy={"replicas": 1}), "two Spark workers"),
    (check_spark_cluster, lambda s: services(s)["spark-master"].update(image="apache/spark:4.2.0"), "one image"),
    (check_shared_home, lambda s: _drop_mount(s, "airflow-worker", "/data"), "nothing is mounted"),
    (check_shared_home, lambda s: _set_everywhere(s, "WAVEPIPE_STAGING_URI", ""), "spark-worker: nothing is mounted"),
    (check_shared_home, lambda s: _set_everywhere(s, "WAVEPIPE_HOME", "/srv/wavepipe"), "nothing is mounted"),
    (
        check_shared_home,
        lambda s: services(s)["airflow-worker"].update(volumes=["/tmp/data:/data"]),
        "not a named volume",
    ),
    (
        check_celery_on_postgres,
        lambda s: _set_in(s, "airflow-scheduler", "AIRFLOW__CORE__EXECUTOR", "LocalExecutor"),
        "not CeleryExecutor",
    ),
    (
        check_celery_on_postgres,
        lambda s: _set_everywhere(s, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite:////opt/airflow/airflow.db"),
        "metadata DB",
    ),
    (
        check_celery_on_postgres,
        lambda s: _set_everywhere(s, "AIRFLOW__CELERY__BROKER_URL", "redis://cache:6379/0"),
        "broker",
    ),
    (check_celery_on_postgres, lambda s: services(s)["airflow-worker"].update(deploy={"replicas": 1}), "two Celery"),
    (check_celery_on_postgres, lambda s: _set_everywhere(s, "AIRFLOW__CELERY__WORKER_CONCURRENCY", "16"), "slots"),
    (check_celery_on_postgres, lambda s: services(s).pop("airflow-triggerer"), "triggerer"),
    (check_spark_engine, lambda s: _replace_word(s, "spark-connect", "15002", "15003"), "listens on"),
    (check_spark_engine, lambda s: _set_everywhere(s, "WAVEPIPE_SPARK_REMOTE", "sc://spark:15002"), "names host"),
    (check_spark_engine, lambda s: _set_everywhere(s, "WAVEPIPE_SPARK_REMOTE", "spark-connect:15002"), "not sc://"),
    (check_spark_engine, lambda s: _replace_word(s, "spark-connect", "0.0.0.0", "127.0.0.1"), "cannot reach"),
    (check_spark_engine, lambda s: _set_everywhere(s, "WAVEPIPE_STAGING_URI", ""), "shared home"),
    (check_object_store, lambda s: _set_everywhere(s, "WAVEPIPE_TABLES_URI", "/data/tables"), "not an s3://"),
    (check_object_store, lambda s: _set_everywhere(s, "WAVEPIPE_STATE_URI", ""), "WAVEPIPE_STATE_URI is '', not"),
    (check_object_store, lambda s: _set_everywhere(s, "WAVEPIPE_S3_ENDPOINT", "http://objectstore:9000"), "S3 port"),
    (check_object_store, lambda s: _set_everywhere(s, "WAVEPIPE_S3_ENDPOINT", "http://s3:8333"), "S3 port"),
    (check_object_store, lambda s: _set_everywhere(s, "WAVEPIPE_S3_SECRET_KEY", "other"), "identities"),
    (check_object_store, lambda s: services(s)["objectstore"].update(image="chrislusf/seaweedfs:3.80"), "builds"),
    (check_object_store, lambda s: services(s)["spark-connect"]["depends_on"].pop("objectstore"), "healthy"),
    (
        check_pages_from_state,
        lambda s: _set_in(s, "airflow-api-server", "WAVEPIPE_STATE_URI", ""),
        "airflow-api-server: WAVEPIPE_STATE_URI differs",
    ),
    (check_pages_from_state, lambda s: _set_in(s, "airflow-api-server", "WAVEPIPE_S3_SECRET_KEY", "x"), "S3_SECRET"),
    (check_pages_from_state, lambda s: _set_everywhere(s, "WAVEPIPE_STATE_URI", "/data/state"), "object store"),
    (check_spark_engine, lambda s: services(s)["spark-connect"].update(image="apache/spark:4.2.0"), "one image"),
    (check_connections, lambda s: _edit_conn(s, SPARK_CONN, port=15003), "spark_remote"),
    (check_connections, lambda s: _edit_conn(s, SPARK_CONN, host="spark-master"), "spark_remote"),
    (
        check_connections,
        lambda s: _edit_conn(s, SPARK_CONN, conn_type="spark", host="spark://spark-master", port=7077),
        "conn_type",
    ),
    (
        check_connections,
        lambda s: _edit_conn(s, KAFKA_CONN, extra=_kafka_extra(s, **{"bootstrap.servers": "kafka-1:9092"})),
        "bootstrap_servers",
    ),
    (
        check_connections,
        lambda s: _edit_conn(s, KAFKA_CONN, extra=_kafka_extra(s, **{"security.protocol": "SSL"})),
        "kafka_client_config",
    ),
    # the servers where the apache-kafka provider's type does not read them
    (check_connections, lambda s: _edit_conn(s, KAFKA_CONN, host="kafka-1:9092", extra={}), "no bootstrap.servers"),
    (check_connections, lambda s: _edit_conn(s, KAFKA_CONN, conn_type="http"), "conn_type"),
    (check_connections, lambda s: _set_in(s, "airflow-worker", "AIRFLOW_CONN_WAVEPIPE_KAFKA", "{not json"), "differs"),
    (check_connections, lambda s: _set_everywhere(s, "AIRFLOW_CONN_WAVEPIPE_SPARK", "{not json"), "does not parse"),
    (check_connections, lambda s: _set_everywhere(s, "AIRFLOW_CONN_WAVEPIPE_SPARK", None), "no AIRFLOW_CONN"),
    (check_shell_snippets, _break_script, "bash -n"),
]


@pytest.mark.parametrize(
    "check, edit, phrase", MUTATIONS, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(MUTATIONS)]
)
def test_each_check_catches_its_mistake(stack, check, edit, phrase):
    broken = copy.deepcopy(stack)
    edit(broken)
    problems = check(broken)
    assert problems, f"{check.__name__} did not notice the edit"
    assert any(phrase in p for p in problems), problems


def test_the_image_installs_the_project_and_the_deployment_pins():
    assert check_image(**_image_inputs()) == []


@pytest.mark.parametrize(
    "part, edit, phrase",
    [
        ("dockerfile", lambda t: t.replace("COPY bench bench\n", ""), "COPY bench/"),
        ("dockerfile", lambda t: t.replace("-r docker/requirements-deploy.lock ", ""), "lacks `-r"),
        ("dockerfile", lambda t: t.replace("pip check", "true"), "pip check"),
        ("dockerfile", lambda t: t.replace("/opt/wavepipe/dist/wavepipe-*.whl", "-e ."), "built wheel"),
        ("dockerfile", lambda t: t.replace("dags/wavepipe_rewind.py ", ""), "dags/wavepipe_rewind.py"),
        ("dags_folder", lambda t: "/opt/wavepipe/src/dags", "DAG folder /opt/wavepipe/src/dags"),
        ("deploy_lock", lambda t: t + "pyspark==4.2.0\n", "re-pins pyspark"),
        (
            "deploy_lock",
            lambda t: t + "apache-airflow-providers-apache-spark==5.0.0\n",
            "re-pins apache-airflow-providers-apache-spark",
        ),
        ("project_lock", lambda t: t.replace("pyspark-client==4.2.0\n", ""), "lacks pyspark-client"),
        ("deploy_lock", lambda t: t.replace("redis==", "redis>="), "not pinned exactly"),
        ("deploy_lock", lambda t: t.replace("psycopg2-binary==", "# psycopg2-binary=="), "lacks psycopg2-binary"),
    ],
)
def test_the_image_check_catches_its_mistakes(part, edit, phrase):
    inputs = _image_inputs()
    inputs[part] = edit(inputs[part])
    assert any(phrase in p for p in check_image(**inputs)), check_image(**inputs)


def test_interpolation_follows_compose():
    env = {"SET": "v", "EMPTY": ""}
    assert (
        interpolate("a$$b ${SET} $SET ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${SET:+alt} ${UNSET:+alt}", env)
        == "a$b v v d d  alt "
    )
    with pytest.raises(ValueError, match="required"):
        interpolate("${UNSET:?give it}", env)


def test_the_checks_see_every_part_of_the_stack(stack):
    """Guards the checks from passing on nothing: each finds what it is about."""
    assert len(kafka_services(stack)) == 3
    assert set(task_runners(stack)) == {"airflow-worker"}
    assert set(spark_workers(stack)) == {"spark-worker"} and set(spark_masters(stack)) == {"spark-master"}
    assert set(spark_engines(stack)) == {"spark-connect"}
    assert {
        "airflow-init",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "airflow-worker",
    } <= set(airflow_services(stack))
    assert wavepipe_env(stack)["WAVEPIPE_CONSUME_TASKS"].isdigit()
    assert kafka_jars_version().count(".") == 2


# --- the real Compose CLI, where it is installed -------------------------------------------------------


def compose_command() -> list[str] | None:
    """``docker compose`` if the plugin works, else the one docker/check built into .cache/."""
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    if os.access(CACHED_COMPOSE, os.X_OK):
        return [str(CACHED_COMPOSE)]
    return None


def test_docker_compose_config_accepts_the_stack_and_reads_it_as_these_tests_do(stack):
    command = compose_command()
    if command is None:
        pytest.skip(
            "no Docker Compose CLI (`docker compose` or .cache/docker-compose/): run docker/check, "
            "which builds it with Go, to include this test"
        )
    # the same variables as load_stack: none set, so the defaults apply
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("POSTGRES_PASSWORD", "AIRFLOW_ADMIN_PASSWORD", "WAVEPIPE_IMAGE") and not k.startswith("COMPOSE_")
    }
    base = [*command, "-f", str(COMPOSE_FILE), *(a for p in PROFILES for a in ("--profile", p))]
    quiet = subprocess.run([*base, "config", "--quiet"], capture_output=True, text=True, env=env, check=False)
    assert quiet.returncode == 0, quiet.stderr
    rendered = subprocess.run(
        [*base, "config", "--format", "json"], capture_output=True, text=True, env=env, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    model = json.loads(rendered.stdout)
    assert set(model["services"]) == set(services(stack))
    for name, service in model["services"].items():
        assert {k: v or "" for k, v in (service.get("environment") or {}).items()} == environment(
            services(stack)[name]
        ), name
