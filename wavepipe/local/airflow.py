"""Airflow on this machine: its home under wavepipe's home, the project's DAGs, low parallelism."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from wavepipe import processes
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import UsageError
from wavepipe.contracts.kafka_callbacks import CALLBACK_KEYS
from wavepipe.contracts.plan import parse_datetime
from wavepipe.local import airflow_service as service
from wavepipe.local.airflow_service import LOOPBACK
from wavepipe.local.kafka import free_port
from wavepipe.spark_launch import settings_env

#: The DAG files ``wavepipe airflow up`` serves: the package's ``wavepipe.dags`` (a checkout's dags/,
#: or the installed wheel's copy of it).
DAGS_FOLDER = Path(next(iter(importlib.util.find_spec("wavepipe.dags").submodule_search_locations)))


def airflow_env(settings: Settings) -> dict[str, str]:
    """Environment for every local Airflow command: sqlite metadata DB in ``<home>/airflow``."""
    home = settings.airflow_home
    return {
        **os.environ,
        **settings_env(settings),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "2",
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__SCHEDULER__PARSING_PROCESSES": "1",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # timeout: a writer waits up to 60 s for sqlite's one write lock (Python's default is 5 s,
        # which a loaded 2-core machine exceeds: `airflow backfill create` failed with "database
        # is locked" while the scheduler wrote); Airflow itself turns on WAL.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}?timeout=60",
        "PYSPARK_PYTHON": sys.executable,
        **callbacks_allowed(settings),
    }


def callbacks_allowed(settings: Settings) -> dict[str, str]:
    """The Kafka callbacks the settings name (dotted paths, the operator's own config), added to
    the apache-kafka provider's ``[apache_kafka] callback_allowlist``: the Connection
    ``sync_kafka_connection`` writes from these settings is then accepted."""
    paths = [settings.kafka_client_config[k] for k in CALLBACK_KEYS if settings.kafka_client_config.get(k)]
    if not paths:
        return {}
    variable = "AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST"
    listed = [p for p in os.environ.get(variable, "").split(",") if p.strip()]
    return {variable: ",".join(dict.fromkeys([*listed, *paths]))}


def _airflow(
    settings: Settings, *args: str, capture: bool = False, dags_folder: Path | None = None
) -> subprocess.CompletedProcess:
    airflow = Path(sys.executable).parent / "airflow"
    env = airflow_env(settings)
    if dags_folder is not None:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    return subprocess.run([str(airflow), *args], env=env, text=True, capture_output=capture, check=False)


def ensure_db(settings: Settings) -> None:
    """Create or upgrade Airflow's metadata database (idempotent; quick when up to date)."""
    settings.airflow_home.mkdir(parents=True, exist_ok=True)
    marker = settings.airflow_home / ".migrated"
    version = importlib.metadata.version("apache-airflow")  # not `import airflow`: it reads ~/airflow
    if marker.exists() and marker.read_text().strip() == version:
        return
    result = _airflow(settings, "db", "migrate", capture=True)
    if result.returncode != 0:
        raise RuntimeError(f"`airflow db migrate` failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    marker.write_text(version + "\n")


def dags_test(
    settings: Settings, dag_id: str, conf: dict | None = None, *, capture: bool = False, dag_file: Path | None = None
) -> subprocess.CompletedProcess:
    """Run one DAG run in this machine's Airflow (``airflow dags test``); raise if it fails, unless
    ``capture`` (then the caller reads the task logs from the result's output). ``dag_file``: the
    DAG's file, when it is not one of the package's (its folder is then the DAG folder)."""
    ensure_db(settings)
    args = ["dags", "test", dag_id, *(["--dagfile-path", str(dag_file)] if dag_file else [])]
    if conf:
        args += ["-c", json.dumps(conf)]
    result = _airflow(settings, *args, capture=capture, dags_folder=dag_file.parent if dag_file else None)
    if capture:
        return result
    if result.returncode != 0:
        raise RuntimeError(f"`airflow dags test {dag_id}` failed (exit {result.returncode}); see the task logs above")
    return result


# --- `wavepipe airflow up|down|status`: the UI and REST API on this machine -----------------------
#
# Four long-running Airflow 3 processes, each started in its own session (so `down` can stop the
# whole process group: the LocalExecutor's workers and task supervisors included) with a pid file
# and a log file in ``<home>/airflow``:
#
#   api-server     UI + REST API + the execution API the tasks report to; one uvicorn worker
#   scheduler      LocalExecutor, at most 2 task instances at once (parallelism 2)
#   dag-processor  parses dags/ and writes the serialized DAGs the UI shows
#   triggerer      deferrable tasks (none today; it keeps the health page green)

PROCESSES = ("api-server", "scheduler", "dag-processor", "triggerer")
#: Set in the services' environment only, so ``down`` finds what they left behind (see service_marker).
SERVICE_MARKER = "WAVEPIPE_AIRFLOW_SERVICES"
ADMIN_USER = "admin"
KAFKA_CONN_ID = "wavepipe_kafka"
#: Tasks running at once in the local Airflow: 2 cores, and each Spark task is ``local[2]`` itself.
LOCAL_PARALLELISM = 2
READY_TIMEOUT_S = 240.0
#: How often the local scheduler looks for tasks a dead scheduler left running (Airflow: 300 s).
ORPHAN_CHECK_S = 30


def _say(message: str) -> None:
    print(message, flush=True)


def airflow_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.airflow_port}"


def passwords_file(settings: Settings) -> Path:
    """Where SimpleAuthManager keeps the admin password (plain text, mode 600): fixed so that
    `up`, the docs and the tests all find it; created by `up` before the API server starts."""
    return settings.airflow_home / "simple_auth_manager_passwords.json.generated"


def _secrets_file(settings: Settings) -> Path:
    return settings.airflow_home / "local_secrets.json"


def _pid_file(settings: Settings, name: str) -> Path:
    return settings.airflow_home / f"{name}.pid"


def log_file(settings: Settings, name: str) -> Path:
    return settings.airflow_home / "logs" / f"{name}.log"


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only, atomically (a crash leaves the old file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _local_secrets(settings: Settings) -> dict[str, str]:
    """The JWT signing secret and the API secret key, made once per home and kept.

    Every process must share them: the scheduler signs the tokens that the tasks present to the
    API server's execution API, and UI log-fetching signs requests the same way. Left unset,
    Airflow generates one per process and the tasks are refused."""
    import secrets

    path = _secrets_file(settings)
    if path.exists():
        return json.loads(path.read_text())
    values = {"jwt_secret": secrets.token_urlsafe(32), "secret_key": secrets.token_urlsafe(32)}
    _write_private(path, json.dumps(values) + "\n")
    return values


def admin_password(settings: Settings) -> str:
    """The admin's password, generated on the first `up` and kept in :func:`passwords_file`."""
    import secrets

    path = passwords_file(settings)
    passwords = json.loads(path.read_text() or "{}") if path.exists() else {}
    if ADMIN_USER not in passwords:
        passwords[ADMIN_USER] = secrets.token_urlsafe(12)
        _write_private(path, json.dumps(passwords) + "\n")
    return passwords[ADMIN_USER]


def log_server_ports(settings: Settings) -> dict[str, int]:
    """The ports of the scheduler's and the triggerer's log servers: free ports chosen on the first
    `up` of this home and kept (Airflow's fixed defaults, 8793 and 8794, would clash between homes)."""
    path = settings.airflow_home / "log_server_ports.json"
    if path.exists():
        return json.loads(path.read_text())
    ports = {"worker": free_port(), "trigger": free_port()}
    _write_private(path, json.dumps(ports) + "\n")
    return ports


def server_env(settings: Settings) -> dict[str, str]:
    """:func:`airflow_env` plus what the long-running services need to work together."""
    secrets = _local_secrets(settings)
    ports = log_server_ports(settings)
    url = airflow_url(settings)
    return {
        **airflow_env(settings),
        # LocalExecutor on sqlite is accepted by Airflow 3.3; parallelism caps the executor's slots.
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(LOCAL_PARALLELISM),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(LOCAL_PARALLELISM),
        # The Test button of Admin > Connections (the UI wants exactly "Enabled")
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        # New DAGs stay paused until a user (or a test, via REST) unpauses them.
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file(settings)),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(settings.airflow_port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets["secret_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets["jwt_secret"],
        "AIRFLOW__TRIGGERER__CAPACITY": "50",
        # A scheduler killed under a running task: `up` stops what it left, the task's supervisor
        # included (_stop_leftovers), so the task cannot report its end; the new scheduler resets
        # it for Airflow's retry at its first check after the dead one's heartbeat is 30 s old
        # (the default check, every 300 s, left the run waiting five minutes).
        "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": str(ORPHAN_CHECK_S),
        # Tasks and the triggerer are found (and their logs fetched while they run) on loopback,
        # where their log servers listen (see run_service).
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{service.__name__}.loopback_hostname",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(ports["worker"]),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(ports["trigger"]),
        SERVICE_MARKER: str(settings.airflow_home),
    }


def _commands(settings: Settings) -> dict[str, list[str]]:
    supervised = [sys.executable, "-c", f"from {service.__name__} import run_service; run_service()"]
    return {
        "api-server": [
            *supervised,
            "api-server",
            "--host",
            LOOPBACK,
            "--port",
            str(settings.airflow_port),
            "--workers",
            "1",
        ],
        "scheduler": [*supervised, "scheduler"],
        "dag-processor": [*supervised, "dag-processor"],
        "triggerer": [*supervised, "triggerer"],
    }


def _read_pid(settings: Settings, name: str) -> int | None:
    try:
        return int(_pid_file(settings, name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live (not zombie) Airflow process: a recycled pid is not ours. Its command
    line reads empty for an instant while setproctitle rewrites it."""
    return processes.alive(pid, "airflow", allow_blank=True)


def running(settings: Settings) -> dict[str, int | None]:
    """Each service's pid if it is running, else None."""
    return {name: (pid if _alive(pid := _read_pid(settings, name)) else None) for name in PROCESSES}


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _http_json(
    url: str, *, method: str = "GET", body: dict | None = None, token: str | None = None, timeout: float = 10.0
) -> tuple[int, dict | str]:
    """One REST call as ``(status, answer)``: the answer's JSON, or its text where it is not JSON.
    Any status is returned; a server that does not answer raises ``httpx.TransportError``."""
    from wavepipe import http_client

    response = http_client.request(method, url, body=body, token=token, timeout_s=timeout)
    text = response.content.decode(errors="replace")
    try:
        return response.status_code, json.loads(text)
    except ValueError:
        return response.status_code, text


def api_token(settings: Settings) -> str:
    """A JWT for the REST API: ``POST /auth/token`` with the admin's user name and password."""
    status, body = _http_json(
        f"{airflow_url(settings)}/auth/token",
        method="POST",
        body={"username": ADMIN_USER, "password": admin_password(settings)},
    )
    if status != 201 or not isinstance(body, dict):
        raise RuntimeError(f"POST /auth/token answered {status}: {body}")
    return body["access_token"]


def health(settings: Settings) -> dict | None:
    """``GET /api/v2/monitor/health`` (no login needed), or None while the API does not answer."""
    import httpx

    try:
        status, body = _http_json(f"{airflow_url(settings)}/api/v2/monitor/health", timeout=5)
    except httpx.TransportError:
        return None
    return body if status == 200 and isinstance(body, dict) else None


def dag_files() -> list[str]:
    """The names of the DAG files ``up`` serves (``DAGS_FOLDER``)."""
    return sorted(p.name for p in DAGS_FOLDER.glob("*.py") if p.name != "__init__.py")


def unparsed_dag_files(settings: Settings) -> list[str]:
    """The DAG files of which the metadata DB holds no DAG yet: the DAG processor has not parsed
    them, and the API answers 404 for their DAGs. All of them while a writer holds the DB's lock;
    none when the DB cannot say (not made, or not Airflow 3's layout): nothing to wait for then."""
    import sqlite3

    try:
        uri = f"file:{settings.airflow_home / 'airflow.db'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            found = {row[0] for row in db.execute("SELECT relative_fileloc FROM dag WHERE NOT is_stale")}
    except sqlite3.OperationalError as exc:
        busy = getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
        return dag_files() if busy else []
    return [name for name in dag_files() if name not in found]


def unhealthy(report: dict) -> list[str]:
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return [p for p in parts if (report.get(p) or {}).get("status") != "healthy"]


def sync_kafka_connection(settings: Settings) -> None:
    """Create or replace the Connection ``wavepipe_kafka`` in the metadata DB from the settings.

    ``airflow connections import --overwrite`` is an upsert, so `up` can run it every time: the
    DAG's tasks (WavepipeHook) then take Kafka from the Connection, which users may edit in the UI
    for other clusters. It is wavepipe's type ``wavepipe_kafka`` (as the apache-kafka provider's
    ``kafka``: its extra is the librdkafka configuration, ``bootstrap.servers`` first), whose Test
    button checks what a run checks. The temporary file can hold SASL secrets: mode 600,
    removed after."""
    conn = {
        KAFKA_CONN_ID: {
            "conn_type": "wavepipe_kafka",
            "description": "Kafka for wavepipe (written by `wavepipe airflow up` from the wavepipe settings)",
            "extra": json.dumps({"bootstrap.servers": settings.bootstrap_servers, **settings.kafka_client_config}),
        }
    }
    path = settings.airflow_home / f".connection-{os.getpid()}.json"
    _write_private(path, json.dumps(conn))
    try:
        result = _airflow(settings, "connections", "import", "--overwrite", str(path), capture=True)
    finally:
        path.unlink(missing_ok=True)
    if result.returncode != 0 or f"Imported connection {KAFKA_CONN_ID}" not in result.stdout:
        raise RuntimeError(
            f"`airflow connections import` failed (exit {result.returncode}):\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log yet)"


def up(settings: Settings, *, timeout_s: float = READY_TIMEOUT_S, out=None) -> int:
    """Start the four services (idempotent), wait until the health endpoint reports all healthy,
    then print the URL and the login. Returns 0 when ready, 1 with the next step otherwise."""
    out = out or _say
    url = airflow_url(settings)
    state = running(settings)
    if all(state.values()):
        out(f"Airflow is already running at {url} (pids: {', '.join(f'{n} {p}' for n, p in state.items())})")
        _print_login(settings, out)
        return 0
    if not state["api-server"] and not _port_free(settings.airflow_port):
        out(
            f"error: port {settings.airflow_port} on 127.0.0.1 is in use by another program. Choose another "
            f"port with the setting `airflow_port` (WAVEPIPE_AIRFLOW_PORT=8081 or airflow_port = 8081 in the "
            f"config file), or stop that program."
        )
        return 1
    began = time.monotonic()
    settings.airflow_home.mkdir(parents=True, exist_ok=True)
    (settings.airflow_home / "logs").mkdir(exist_ok=True)
    admin_password(settings)  # before the API server starts: it keeps an existing password
    out(f"preparing the metadata DB ({settings.airflow_home / 'airflow.db'}) ...")
    ensure_db(settings)
    sync_kafka_connection(settings)
    out(f"Airflow Connection {KAFKA_CONN_ID!r} -> {settings.bootstrap_servers}")
    env = server_env(settings)
    commands = _commands(settings)
    for name in PROCESSES:
        if state[name]:
            out(f"{name} already running (pid {state[name]})")
            continue
        _stop_leftovers(settings, name, out)
        log = log_file(settings, name)
        with open(log, "ab") as sink:
            proc = subprocess.Popen(
                commands[name],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=settings.airflow_home,
                start_new_session=True,
            )
        _pid_file(settings, name).write_text(f"{proc.pid}\n")
        out(f"started {name} (pid {proc.pid}); log: {log}")
    out(f"waiting for {url}/api/v2/monitor/health (up to {timeout_s:.0f}s) ...")
    last_print = 0.0
    while True:
        elapsed = time.monotonic() - began
        dead = [n for n, pid in running(settings).items() if pid is None]
        if dead:
            time.sleep(1)  # confirm: a process that is rewriting its title can look gone for an instant
            dead = [n for n, pid in running(settings).items() if pid is None]
        if dead:
            for name in dead:
                out(
                    f"error: {name} exited. Last lines of {log_file(settings, name)}:\n{_tail(log_file(settings, name))}"
                )
            out("Fix the cause above, then run `wavepipe airflow down` and `wavepipe airflow up` again.")
            return 1
        report = health(settings)
        waiting = unhealthy(report) if report is not None else ["api-server"]
        unparsed = [] if waiting else unparsed_dag_files(settings)  # healthy, its DAGs not there yet: a 404
        if unparsed:
            waiting = [f"the DAG processor to parse {', '.join(unparsed)}"]
        if not waiting:
            break
        if elapsed > timeout_s:
            out(
                f"error: not ready after {elapsed:.0f}s, still waiting for: {', '.join(waiting)}. "
                f"See the logs in {settings.airflow_home / 'logs'}; `wavepipe airflow down` stops what started."
            )
            return 1
        if elapsed - last_print >= 10:
            out(f"  {elapsed:4.0f}s: waiting for {', '.join(waiting)}")
            last_print = elapsed
        time.sleep(1)
    out(f"Airflow is ready at {url} ({time.monotonic() - began:.0f}s)")
    _print_login(settings, out)
    return 0


def _stop_leftovers(settings: Settings, name: str, out) -> None:
    """Stop what a killed service left in its process group (the triggerer's and the scheduler's
    log server outlive a SIGKILL of their service and keep its port). Linux gives no new process
    the id of a group that still has members, so they are the dead service's."""
    pid = _read_pid(settings, name)
    left = processes.in_group(pid) if pid is not None else []
    if left:
        _stop_group(pid, grace_s=10)
        out(f"stopped what the last {name} (pid {pid}) left running: pids {', '.join(map(str, left))}")


def _print_login(settings: Settings, out) -> None:
    out(f"  UI and REST API: {airflow_url(settings)}   (REST: {airflow_url(settings)}/api/v2, token: POST /auth/token)")
    out(f"  user: {ADMIN_USER}   password: {admin_password(settings)}")
    out(f"  the password is stored in {passwords_file(settings)}")
    out(f"  logs: {settings.airflow_home / 'logs'}")
    out(
        "  new DAGs start paused, and runs of a paused DAG (also REST triggers) wait in 'queued' for ever: unpause "
        'wavepipe_ingest with its toggle in the UI, or PATCH /api/v2/dags/wavepipe_ingest {"is_paused": false}, or '
        f"AIRFLOW_HOME={settings.airflow_home} airflow dags unpause wavepipe_ingest"
    )


def _stop_group(pid: int, grace_s: float) -> bool:
    """SIGTERM the process group of ``pid`` (the service and its workers), SIGKILL after
    ``grace_s``; True if it had to be killed."""
    import signal

    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not processes.in_group(pid):
            return False
        time.sleep(0.3)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def service_marker(settings: Settings) -> str:
    """The environment entry (``NAME=value``) only ``up``'s services (and what they start) carry:
    never a user's shell, ``airflow dags test`` or the demo, which share AIRFLOW_HOME but not this."""
    return f"{SERVICE_MARKER}={settings.airflow_home}"


def _strays(settings: Settings) -> list[int]:
    """Live processes outside the services' groups that still carry the services' marker in their
    environment: what a task launched in a session of its own (spark-submit's JVM) and outlived it."""
    return processes.with_environment(service_marker(settings))


def down(settings: Settings, *, grace_s: float = 30.0, out=None) -> int:
    """Stop the four services (SIGTERM to each process group, SIGKILL after ``grace_s``), then
    anything their tasks left running, and remove the pid files."""
    import signal

    out = out or _say
    stopped = []
    # the scheduler first, so that it does not start new tasks while the API server goes away
    for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
        pid = _read_pid(settings, name)
        if pid is not None and (_alive(pid) or processes.in_group(pid)):
            killed = _stop_group(pid, grace_s)
            stopped.append(f"{name} (pid {pid}{', killed after ' + str(int(grace_s)) + 's' if killed else ''})")
        _pid_file(settings, name).unlink(missing_ok=True)
    strays = _strays(settings)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        processes.send(strays, sig)
        deadline = time.monotonic() + 10
        while (strays := _strays(settings)) and time.monotonic() < deadline:
            time.sleep(0.3)
        if not strays:
            break
    if stopped:
        out(f"stopped {', '.join(stopped)}")
    else:
        out("Airflow was not running")
    if strays:
        out(f"warning: processes {strays} of {settings.airflow_home} survived SIGKILL; check them with ps")
        return 1
    return 0


def status(settings: Settings, *, out=None) -> int:
    """Each service's state, the URL and the health report; 0 only if all four are running."""
    out = out or _say
    state = running(settings)
    for name, pid in state.items():
        out(f"{name:14s} {'running, pid ' + str(pid) if pid else 'stopped'}   log: {log_file(settings, name)}")
    report = health(settings) if state["api-server"] else None
    if report is not None:
        bad = unhealthy(report)
        out(f"{airflow_url(settings)}: {'healthy' if not bad else 'unhealthy: ' + ', '.join(bad)}")
        out(f"  user: {ADMIN_USER}; password in {passwords_file(settings)}")
    else:
        out(f"{airflow_url(settings)}: not answering")
    stopped = [name for name, pid in state.items() if not pid]
    if stopped:
        rest = " (what runs goes on)" if len(stopped) < len(state) else ""
        out(f"stopped: {', '.join(stopped)}; `wavepipe airflow up` starts {'them' if stopped[1:] else 'it'}{rest}")
    return 0 if not stopped else 1


#: ``wavepipe airflow backfill --reprocess``: the UI dialog's choices, as Airflow names them.
REPROCESS = {"missing": "none", "failed": "failed", "all": "completed"}


#: A backfill's REST call that meets SQLite's lock (503) is tried this often, a second apart.
LOCKED_TRIES = 30


def _api(settings: Settings, token: str, path: str, body: dict | None = None, method: str | None = None):
    """One REST call as ``(status, answer)``; on SQLite (this machine's metadata DB) a write that
    meets the scheduler's lock answers 503 and is tried again for up to half a minute."""
    return _api_tried(settings, token, path, body, method)[:2]


def _api_tried(settings: Settings, token: str, path: str, body: dict | None = None, method: str | None = None):
    """``_api``'s call (a POST with ``body``, else a GET, unless ``method`` says), and whether any
    try of it met the lock (a refused write may have left something behind)."""
    url, method = f"{airflow_url(settings)}/api/v2{path}", method or ("POST" if body else "GET")
    status, answer = _http_json(url, method=method, body=body, token=token)
    locked = _locked(status, answer)
    for _ in range(LOCKED_TRIES):
        if not _locked(status, answer):
            break
        time.sleep(1)
        status, answer = _http_json(url, method=method, body=body, token=token)
    return status, answer, locked


def _locked(status: int, answer) -> bool:
    """Whether an answer is SQLite's lock met by a write: 503, or a 500 "Database error" (the API
    server's answer when the lock surfaces in another statement of the same request)."""
    detail = answer.get("detail") if isinstance(answer, dict) else None
    return status == 503 or (status == 500 and isinstance(detail, dict) and detail.get("reason") == "Database error")


#: How long after a locked try its backfill is looked for. Seen on SQLite: the try answered 503,
#: the next was refused (409) and the backfill was listed with its runs, and a tenth of a second
#: later Airflow's clean-up had deleted it, and with it a run it had cleared to reprocess.
SETTLE_S = 5.0

#: How long a backfill left open by our own refused try is waited for (the scheduler closes one
#: without runs on its next check of backfills, every 30 s of its loop).
ORPHAN_WAIT_S = 150.0


def create_backfill(settings: Settings, token: str, body: dict, *, wait_s: float = ORPHAN_WAIT_S):
    """``POST /backfills`` as ``(status, answer)``. On SQLite a try that meets the scheduler's lock
    answers 503, yet it may have made the backfill: Airflow commits the backfill first, then its
    runs, and a lock met after that still answers 503. The next try is then refused with 409
    "already a running backfill". Only then, for a refusal our own try may have caused: an open
    backfill of exactly this request that has runs is ours (it is returned, never made twice);
    one without runs is what a failed try left (Airflow's clean-up is best effort), so once the
    scheduler has closed it the request is tried again (``_tried_again``)."""
    status, answer, locked = _api_tried(settings, token, "/backfills", body)
    if status != 409 or not locked:
        return status, answer
    time.sleep(SETTLE_S)  # Airflow's clean-up of the locked try may still be deleting what it made
    mine = _open_backfill_like(settings, token, body)
    if mine is not None and _has_runs(settings, token, body, mine):
        return 200, mine  # made by the try that was answered "database is locked"
    began = time.monotonic()
    while mine is not None and time.monotonic() - began < wait_s:
        time.sleep(2)
        mine = _open_backfill_like(settings, token, body)
    return _tried_again(settings, token, body) if mine is None else (status, answer)


#: How often a backfill refused while no open backfill of its DAG is listed is tried again, and
#: the pause between tries (the refusal saw a failed try's backfill before Airflow deleted it).
REFUSED_TRIES, REFUSED_PAUSE_S = 5, 3.0


def _tried_again(settings: Settings, token: str, body: dict):
    """``POST /backfills`` once more after our own try's leftover is gone. Airflow deletes a failed
    try's backfill in its own clean-up, so a 409 met while no backfill of the DAG is listed open
    saw that one before it went: the request is tried again, a few seconds apart. A 409 while
    another backfill is open is the user's to resolve, and is returned."""
    status, answer = _api(settings, token, "/backfills", body)
    for _ in range(REFUSED_TRIES):
        if status != 409 or open_backfills(settings, token, body["dag_id"]):
            break
        time.sleep(REFUSED_PAUSE_S)
        status, answer = _api(settings, token, "/backfills", body)
    return status, answer


def open_backfills(settings: Settings, token: str, dag_id: str) -> list[dict]:
    """The backfills of ``dag_id`` not completed, as the REST API lists them."""
    listed = _api(settings, token, f"/backfills?dag_id={quote(dag_id)}&limit=1000")[1]
    backfills = listed.get("backfills", []) if isinstance(listed, dict) else []
    return [backfill for backfill in backfills if not backfill.get("completed_at")]


def _open_backfill_like(settings: Settings, token: str, body: dict) -> dict | None:
    """The open backfill of ``body``'s DAG made for exactly ``body``'s request, if there is one."""
    for backfill in open_backfills(settings, token, body["dag_id"]):
        same = (_instant(backfill["from_date"]), _instant(backfill["to_date"])) == (
            _instant(body["from_date"]),
            _instant(body["to_date"]),
        )
        same = same and (backfill.get("dag_run_conf") or {}) == (body.get("dag_run_conf") or {})
        same = same and backfill.get("reprocess_behavior") == body.get("reprocess_behavior", "none")
        if same:
            return backfill
    return None


def _has_runs(settings: Settings, token: str, body: dict, backfill: dict) -> bool:
    """Whether DAG runs of ``backfill``'s windows were queued since it was made (its own runs)."""
    return bool(runs_made_by(backfill, runs_in(settings, token, body)))


def runs_in(settings: Settings, token: str, body: dict) -> list[dict]:
    """The DAG runs of ``body``'s DAG whose logical dates are in its range, as the REST API lists them."""
    path = (
        f"/dags/{quote(body['dag_id'])}/dagRuns?limit=1000&logical_date_gte={quote(body['from_date'])}"
        f"&logical_date_lte={quote(body['to_date'])}"
    )
    status, runs = _api(settings, token, path)
    return runs.get("dag_runs", []) if status == 200 and isinstance(runs, dict) else []


def runs_made_by(backfill: dict, runs: list[dict]) -> dict[str, dict]:
    """Of ``runs``, ``backfill``'s own by logical date: the backfill runs queued since it was made
    (those it created, and those it cleared to run again)."""
    made = _instant(backfill["created_at"])
    return {
        _iso(r["logical_date"]): r
        for r in runs
        if r.get("run_type") == "backfill" and r.get("queued_at") and _instant(r["queued_at"]) >= made
    }


#: How often a backfill made short of its dry run's windows is made again before the user is told.
REMAKE_TRIES = 3


def made_whole(settings: Settings, token: str, body: dict, created: dict, chosen: list[str], out):
    """``created``, a backfill just made of ``body``, once it has a run for each window of ``chosen``
    (its dry run's), as ``(status, backfill, missing windows)``. On SQLite a creation that met the
    lock part-way may keep only some of its runs (Airflow's clean-up of it is best effort): a short
    one is cancelled before any more of its runs start, and made again, up to ``REMAKE_TRIES`` times."""
    missing, ran = _missing(settings, token, body, created, chosen), set()
    for _ in range(REMAKE_TRIES):
        if not missing:
            break
        out(
            f"backfill {created['id']} of {body['dag_id']} was made with {len(chosen) - len(missing)} of "
            f"{len(chosen)} window runs (no run for {', '.join(missing)}): cancelling it and making it again"
        )
        ran |= _cancel(settings, token, body, created)
        status, created = create_backfill(settings, token, body)
        if status != 200:
            return status, created, missing
        missing = [when for when in _missing(settings, token, body, created, chosen) if when not in ran]
    return 200, created, missing


def _missing(settings: Settings, token: str, body: dict, backfill: dict, chosen: list[str]) -> list[str]:
    """The windows of ``chosen`` that ``backfill`` has no run for."""
    return sorted(set(chosen) - set(runs_made_by(backfill, runs_in(settings, token, body))))


def _cancel(settings: Settings, token: str, body: dict, backfill: dict) -> set[str]:
    """Cancel ``backfill``: paused first, so none of its queued runs starts; cancelling fails them.
    A "missing runs" backfill made again would skip those failed runs, which never ran, so they
    are deleted. The windows whose runs had started (they go on) are returned."""
    where = f"/backfills/{backfill['id']}"
    _api(settings, token, f"{where}/pause", method="PUT")
    own = runs_made_by(backfill, runs_in(settings, token, body))
    _api(settings, token, f"{where}/cancel", method="PUT")
    never_ran = [run["dag_run_id"] for run in own.values() if run["state"] == "queued"]
    for run_id in never_ran if body.get("reprocess_behavior", "none") == "none" else []:
        _api(settings, token, f"/dags/{quote(body['dag_id'])}/dagRuns/{quote(run_id)}", method="DELETE")
    return {when for when, run in own.items() if run["state"] != "queued"}


def _detail(body) -> str:
    """An API error's message (FastAPI's ``detail``: text, or a list of validation errors)."""
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
    return str(detail)


def skipped_windows(every: list[str], chosen: list[str], runs: dict[str, dict], reprocess: str) -> list[str]:
    """One line per window not in ``chosen``: of ``every`` (the windows a backfill may run) and
    those whose run is in flight (a backfill never takes them): the run it has and why it is
    skipped (``runs``: the DAG runs by logical date, as the REST API lists them)."""
    in_flight = {when for when, run in runs.items() if run.get("state") in ("queued", "running")}
    lines = []
    for when in sorted((set(every) | in_flight) - set(chosen)):
        run = runs.get(when, {})
        state = run.get("state", "?")
        why = "it is running now" if when in in_flight else f"--reprocess {reprocess} skips a {state} run"
        lines.append(f"{when}: {run.get('dag_run_id', 'a run')} ({state}): {why}")
    return lines


def _refused(dag_id: str, status: int, answer, out) -> int:
    """Say why the API refused the backfill; 2 for what was typed (dates, conf, DAG), else 1."""
    if status == 409:
        out(
            f"backfill of {dag_id} refused: {_detail(answer)}. Airflow runs one backfill of a DAG at a time: "
            "wait until the last one is complete (its page in the UI, Browse > Backfills), or cancel it there"
        )
        return 1
    out(f"backfill of {dag_id} refused: {_detail(answer)}")
    return 2 if status in (400, 404, 422) else 1


def backfill(
    settings: Settings,
    start: str,
    end: str,
    *,
    dag_id: str = "wavepipe_ingest",
    conf: dict | None = None,
    max_active_runs: int | None = None,
    reprocess: str = "all",
    out=None,
) -> int:
    """A backfill through this machine's Airflow (its REST API, as the UI's dialog makes one):
    the scheduler runs one window run per window whose logical date is in ``[start, end]``.
    ``reprocess``: which windows that already had a window run are reprocessed again (``all``,
    ``failed`` or ``missing``: none), as the dialog's choice. Says how many runs it created and
    why any window was skipped; 1 when none was created. Dates that are not ISO-8601 are a
    ``UsageError`` before any service is asked."""
    out = out or _say
    body = {
        "dag_id": dag_id,
        "from_date": parse_datetime(start).isoformat(),
        "to_date": parse_datetime(end).isoformat(),
        "dag_run_conf": conf or {},
        "reprocess_behavior": REPROCESS[reprocess],
        **({"max_active_runs": max_active_runs} if max_active_runs else {}),
    }
    if not running(settings).get("scheduler"):
        out("Airflow's scheduler is not running, so the backfill's runs would wait: `wavepipe airflow up` first")
        return 1
    token = api_token(settings)
    found = {}
    for behavior in {"completed", REPROCESS[reprocess]}:  # every window a backfill may run; the chosen ones
        status, answer = _api(settings, token, "/backfills/dry_run", {**body, "reprocess_behavior": behavior})
        if status != 200:
            return _refused(dag_id, status, answer, out)
        found[behavior] = [_iso(b["logical_date"]) for b in answer["backfills"]]
    chosen = found[REPROCESS[reprocess]]
    runs = {_iso(r["logical_date"]): r for r in runs_in(settings, token, body)}
    skipped = skipped_windows(found["completed"], chosen, runs, reprocess)
    if not chosen:
        out(
            f"no run created: none of the windows of {dag_id} in [{body['from_date']}, {body['to_date']}] is to be "
            + ("reprocessed (the range holds no window that has ended)" if not skipped else "reprocessed:")
        )
        for line in skipped:
            out(f"  {line}")
        if skipped and reprocess != "all":
            out("  `--reprocess all` reprocesses windows whatever runs they had")
        return 1
    status, created = create_backfill(settings, token, body)
    if status == 200:
        status, created, missing = made_whole(settings, token, body, created, chosen, out)
    if status != 200:
        return _refused(dag_id, status, created, out)
    if missing:
        out(
            f"backfill {created['id']} of {dag_id} has no run for {len(missing)} window(s) after {REMAKE_TRIES} "
            f"tries: {', '.join(missing)}. Once it is complete, `wavepipe airflow backfill --from-date {missing[0]} "
            f"--to-date {missing[-1]} --reprocess missing` makes them"
        )
        return 1
    out(f"backfill {created['id']} of {dag_id}: {len(chosen)} window run(s) created, from {chosen[0]} to {chosen[-1]}")
    if skipped:
        out(f"{len(skipped)} window(s) skipped:")
        for line in skipped:
            out(f"  {line}")
    out(f"follow it in {airflow_url(settings)}/dags/{dag_id} or with `wavepipe status`")
    return 0


def _iso(when: str) -> str:
    """A logical date as the dry run writes it (the API's ``Z`` and ``+00:00`` alike)."""
    return _instant(when).isoformat()


def _instant(when: str):
    """An instant the REST API wrote (``Z`` or ``+00:00``), as an aware datetime."""
    return parse_datetime(when.replace("Z", "+00:00"))


def run_cli(settings: Settings, args) -> int:
    """``wavepipe airflow up|down|status|backfill``."""
    if args.action == "backfill":
        try:
            conf = json.loads(args.conf) if args.conf else None
        except ValueError as exc:
            conf = exc
        if conf is not None and not isinstance(conf, dict):
            _say(f'wavepipe airflow backfill: --conf must be a JSON object, e.g. \'{{"topic": "t"}}\' ({conf})')
            return 2
        try:
            return backfill(
                settings,
                args.from_date,
                args.to_date,
                dag_id=args.dag_id,
                conf=conf,
                max_active_runs=args.max_active_runs,
                reprocess=args.reprocess,
            )
        except UsageError as exc:  # a date that is not ISO-8601
            _say(f"wavepipe airflow backfill: {exc}")
            return 2
    return {"up": up, "down": down, "status": status}[args.action](settings)
