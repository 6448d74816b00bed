"""This home's Spark Connect server: the warm Spark engine runs attach to on this machine.

``LocalEngine`` starts it from the installed pyspark (``spark-submit --class ...SparkConnectServer``),
bound to loopback, its pid, port and log under ``<home>/spark-connect/``; ``wavepipe spark
up|down|status|restart`` drive it and a run starts it on demand (``wavepipe.engine_client``). It is
restarted (between steps, when no step uses it) once its processes hold more than
``spark_engine_max_rss_mb``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from wavepipe import processes, storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.runfiles import read_json_or, write_json_atomic
from wavepipe.engine_client import EngineUnavailableError, accepts
from wavepipe.jars import SetupError, require_tool
from wavepipe.local.kafka import free_port, port_is_free
from wavepipe.spark_launch import _local_env, pyspark_bin, spark_conf, with_task_retries, without_connect_mode

log = logging.getLogger("wavepipe.local.engine_server")

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
HOST = "127.0.0.1"
#: Seconds a fresh server gets to answer; it starts in 6-9 s on 2 cores when the machine is quiet.
READY_TIMEOUT_S = 180.0
#: A server's log is moved aside (one older copy kept) when a start finds it larger than this.
LOG_ROTATE_BYTES = 50 * 1024 * 1024
#: Marks every process of a server started here (its JVM, its Python workers): a ``kill-app``
#: failpoint stops exactly those.
APP_MARKER = "WAVEPIPE_SPARK_APP"


@dataclass
class EngineMemory:
    """Resident memory of a server's processes, in MB."""

    jvm_mb: float
    python_mb: float
    python_processes: int

    @property
    def total_mb(self) -> float:
        return self.jvm_mb + self.python_mb


class LocalEngine:
    """This home's Spark Connect server, in local mode (or on ``spark_master``'s cluster)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.folder = settings.home / "spark-connect"

    # --- state -------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.folder / "engine.json"

    @property
    def log_file(self) -> Path:
        return self.folder / "server.log"

    def state(self) -> dict:
        return read_json_or(self.state_file, {})

    def pid(self) -> int | None:
        """The server's pid if it is running."""
        pid = self.state().get("pid")
        if not pid:
            return None
        return pid if processes.alive(pid, SERVER_CLASS) else None  # else gone, a zombie or a recycled pid

    def url(self) -> str:
        """``sc://127.0.0.1:<port>/;session_id=<the home's shared session>``."""
        state = self.state()
        return f"sc://{HOST}:{state['port']}/;session_id={state['session_id']}"

    def memory(self) -> EngineMemory | None:
        """What the server's processes hold (None when it is not running)."""
        import psutil

        pid = self.pid()
        if pid is None:
            return None
        try:
            server = psutil.Process(pid)
            jvm = server.memory_info().rss
            children = server.children(recursive=True)
        except psutil.Error:
            return None
        python, count = 0, 0
        for child in children:
            try:
                python += child.memory_info().rss
                count += 1
            except psutil.Error:
                pass
        return EngineMemory(jvm / 1e6, python / 1e6, count)

    # --- start and stop ----------------------------------------------------------------------
    def ui_url(self) -> str | None:
        """The server's web UI and REST API (``/api/v1``: its job list), on loopback; None when
        it is not running or was started without one."""
        port = self.state().get("ui_port")
        return f"http://{HOST}:{port}" if port and self.pid() else None

    def command(self, port: int, host: str = HOST, ui_port: int | None = None) -> list[str]:

        conf = spark_conf(self.settings)
        if ui_port:  # the job list runs report (``engine.spark_jobs``); few jobs kept, so little memory
            conf.update(
                {
                    "spark.ui.enabled": "true",
                    "spark.ui.port": str(ui_port),
                    "spark.ui.retainedJobs": "500",
                    "spark.ui.retainedStages": "1000",
                    "spark.ui.retainedTasks": "20000",
                    "spark.sql.ui.retainedExecutions": "100",
                }
            )
        conf.update(
            {
                "spark.connect.grpc.binding.address": host,
                "spark.connect.grpc.binding.port": str(port),
                # sessions idle this long are closed; runs share one session, renewed if it was closed
                "spark.connect.session.manager.defaultSessionTimeout": "7d",
                "spark.app.name": "wavepipe-engine",
            }
        )
        conf.pop("spark.pyspark.driver.python", None)
        cmd = [str(pyspark_bin("spark-submit")), "--master", with_task_retries(self.settings.spark_master)]
        cmd += ["--class", SERVER_CLASS]
        for key, value in conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd

    def up(self) -> str:
        """Start the server (if it is not running) and return once it answers."""
        with self._lifecycle_lock():
            pid = self.pid()
            if pid is not None:
                self.wait_ready()
                return f"Spark engine already running at {self.address()} (pid {pid})"
            return self._start()

    def _start(self) -> str:

        require_tool("java", "Install Java 17 (apt-get install openjdk-17-jre-headless).")
        port = self.settings.spark_connect_port or free_port()
        if not port_is_free(HOST, port):
            raise SetupError(
                f"port {port} on {HOST} is in use by another process: stop it, or set "
                "spark_connect_port (WAVEPIPE_SPARK_CONNECT_PORT) to a free port, or 0 for any"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**self._env(), "SPARK_LOCAL_IP": HOST}
        began = time.monotonic()
        if self.log_file.exists() and self.log_file.stat().st_size > LOG_ROTATE_BYTES:
            self.log_file.replace(self.log_file.with_suffix(".log.1"))  # one older log is kept
        ui_port = free_port()
        with self.log_file.open("ab") as out:
            log_offset = out.tell()
            proc = subprocess.Popen(
                self.command(port, ui_port=ui_port),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.folder,
            )
        session_id = str(uuid.uuid4())
        write_json_atomic(
            self.state_file,
            {
                "pid": proc.pid,
                "port": port,
                "ui_port": ui_port,
                "session_id": session_id,
                "started_at": time.time(),
                "master": self.settings.spark_master,
                "log_offset": log_offset,
                "settings": self.fingerprint(),
                "reaches_s3": self._s3_reach(),
            },
        )
        try:
            self.wait_ready(proc)
        except BaseException:
            self._stop(proc.pid)
            raise
        return (
            f"Spark engine started at {self.address()} in {time.monotonic() - began:.1f}s "
            f"(pid {proc.pid}, master {self.settings.spark_master}, log {self.log_file})"
        )

    def serve(self, host: str, port: int) -> None:
        """Run the server in the foreground, in place of this process (a container's command):
        bound to ``host``, not only to loopback; stopped by stopping the container."""
        cmd = self.command(port, host)
        os.execve(cmd[0], cmd, self._env())

    def _env(self) -> dict[str, str]:
        """The server's environment: this one without what belongs to a run or a client (failpoints
        travel with a run's work; Connect mode would turn spark-submit into a client; an engine
        started by an Airflow task is this home's, like one from `wavepipe spark up`, and outlives
        `wavepipe airflow down`)."""
        env = {
            **without_connect_mode(os.environ),
            **_local_env(self.settings),
            "PYSPARK_PYTHON": sys.executable,
            "ARROW_DEFAULT_MEMORY_POOL": "system",
            APP_MARKER: "engine",
        }
        for name in ("WAVEPIPE_FAILPOINTS", "WAVEPIPE_AIRFLOW_SERVICES"):
            env.pop(name, None)
        return env

    def fingerprint(self) -> str:
        """What the server is started with (its command line but the port): a running server
        whose fingerprint differs was started with other settings."""
        cmd = self.command(0)
        return hashlib.sha256(
            "\0".join(c for c in cmd if not c.startswith("spark.connect.grpc.binding.port=")).encode()
        ).hexdigest()[:16]

    def address(self) -> str:
        return f"sc://{HOST}:{self.state().get('port')}"

    def wait_ready(self, proc: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once the server's own process listens on its port and accepts a connection (not
        another process that took the port meanwhile)."""
        deadline = time.monotonic() + timeout
        port = self.state().get("port")
        sid = proc.pid if proc is not None else self.pid()
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise SetupError(
                    f"the Spark engine exited with code {proc.returncode} while starting; its log: "
                    f"{self.log_file} (last lines: {_tail(self.log_file)})"
                )
            if proc is None and self.pid() is None:
                raise SetupError(f"the Spark engine is not running; its log: {self.log_file}")
            if port and sid and _listens(sid, port) and accepts(HOST, port, 1.0):
                return
            time.sleep(0.25)
        raise SetupError(f"the Spark engine did not answer within {timeout:.0f}s; its log: {self.log_file}")

    def down(self, timeout: float = 30.0, force: bool = False) -> str:
        """Stop the server, once no step uses it (``force``: at once, failing the steps on it)."""
        with self._no_step_attached(force), self._lifecycle_lock():
            pid = self.pid()
            if pid is None:
                self.state_file.unlink(missing_ok=True)
                return "Spark engine is not running"
            self._stop(pid, timeout)
            return f"Spark engine stopped (pid {pid})"

    def _stop(self, pid: int, timeout: float = 30.0) -> None:
        """Stop the server's whole session: the JVM and its Python workers (whose daemon makes a
        process group of its own, so the group alone would leave it behind); wait until they are
        gone and the port is free."""
        port = self.state().get("port")
        processes.send(processes.in_session(pid), signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and processes.in_session(pid):
            time.sleep(0.2)
        processes.send(processes.in_session(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (processes.in_session(pid) or (port and accepts(HOST, port, 0.2))):
            time.sleep(0.1)
        self.state_file.unlink(missing_ok=True)

    def restart(self, force: bool = False) -> str:
        """Stop and start the server, once no step uses it (``force``: at once)."""
        with self._no_step_attached(force), self._lifecycle_lock():
            pid = self.pid()
            if pid is not None:
                self._stop(pid)
            return self._start()

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "Spark engine is not running (`wavepipe spark up` starts it; runs start it on demand)"
        mem = self.memory()
        up_s = time.time() - self.state().get("started_at", time.time())
        held = (
            f"; memory: JVM {mem.jvm_mb:.0f} MB, {mem.python_processes} Python worker process(es) "
            f"{mem.python_mb:.0f} MB, restarted between runs above {self.settings.spark_engine_max_rss_mb} MB"
            if mem
            else ""
        )
        stale = (
            "; started with other settings than today's: `wavepipe spark restart` applies them"
            if self.state().get("settings") != self.fingerprint()
            else ""
        )
        return (
            f"Spark engine running at {self.address()} (pid {pid}, master {self.state().get('master')}, "
            f"up {up_s / 60:.0f} min){held}{stale}; log {self.log_file}"
        )

    # --- sharing it between runs ---------------------------------------------------------------
    def _flock(self, name: str, mode: int, waiting: str | None = None, wait: bool = True):
        """``<folder>/<name>`` locked (``processes.file_lock``)."""
        return processes.file_lock(self.folder / name, mode, waiting, wait)

    def _lifecycle_lock(self):
        """One process at a time starts, stops or restarts the server."""
        return self._flock("lifecycle.lock", fcntl.LOCK_EX)

    @contextlib.contextmanager
    def _no_step_attached(self, force: bool) -> Iterator[None]:
        """Hold the in-use lock exclusively (no step attached, none attaching) until the block
        ends; wait for the steps attached now, saying so, unless ``force``."""
        if force:
            yield
            return
        with self._flock(
            "in-use.lock",
            fcntl.LOCK_EX,
            waiting="a step is using the Spark engine: waiting until "
            "it ends (Ctrl-C to cancel; --force stops the engine under it)",
        ):
            yield

    def running(self, pid: int) -> bool:
        """Whether ``pid`` is still a Spark Connect server (the one this home started)."""
        return processes.alive(pid, SERVER_CLASS)

    def renew_session(self, session_id: str) -> None:
        """Attach every later step to ``session_id`` (the server closed the one it had)."""
        with self._lifecycle_lock():
            state = self.state()
            if state:
                state["session_id"] = session_id
                write_json_atomic(self.state_file, state)

    def in_use(self):
        """Held (shared) while a step works on the server: no automatic restart happens under it,
        and ``down`` and ``restart`` wait for it (unless forced)."""
        return self._flock("in-use.lock", fcntl.LOCK_SH)

    def ensure_up(self, restart: bool = True) -> str:
        """Start the server if it is down; ``restart``: restart it if it holds more than its limit
        or lost its executor heartbeat and no step is using it. Returns the URL to attach to."""
        with self._lifecycle_lock():
            pid = self._answering_pid()
            if pid is None:
                log.info("%s", self._start())
            elif restart:  # (a step's second look, under its in-use lock, only needs it running)
                mem = self.memory()
                limit = self.settings.spark_engine_max_rss_mb
                why = None
                if mem is not None and limit and mem.total_mb > limit:
                    why = f"holds {mem.total_mb:.0f} MB (limit {limit} MB)"
                elif self.heartbeat_lost():
                    why = (
                        "lost its executor heartbeat (Spark's race SPARK-59451; the executor would be "
                        "declared dead after spark.network.timeout)"
                    )
                elif self._s3_reach() and self.state().get("reaches_s3") != self._s3_reach():
                    self._restart_for_s3(pid)
                    return self.url()
                if why:
                    with self._exclusive_if_idle() as idle:
                        if idle:
                            log.info("the Spark engine %s: restarting it", why)
                            self._stop(pid)
                            log.info("%s", self._start())
                        else:
                            log.info("the Spark engine %s; a step is using it: restarting it later", why)
                elif self.state().get("settings") != self.fingerprint():
                    log.warning(
                        "the Spark engine was started with other settings than this run's (e.g. "
                        "spark_master, spark_conf): it keeps them until `wavepipe spark restart`"
                    )
            return self.url()

    def _s3_reach(self) -> str:

        return storage.engine_reach(self.settings)

    def _restart_for_s3(self, pid: int) -> None:
        """The run's tables or staging are in an object store, and the engine was started
        without S3A (before they were), or for another store (endpoint, region or keys): restarted
        for this one when no step uses it, else refused in a line (every step of this run would
        fail on its first read of the store)."""
        with self._exclusive_if_idle() as idle:
            if not idle:
                raise EngineUnavailableError(
                    "this home's Spark engine was started without S3 access or for another object store, and "
                    "this run's tables or staging are in an object store; a step of another run is using the "
                    "engine now: run this one again when it is done (the engine is then restarted for this "
                    "store), or `wavepipe spark restart`"
                )
            log.info("the Spark engine was started without S3 access or for another object store: restarting it")
            self._stop(pid)
            log.info("%s", self._start())

    def _answering_pid(self, wait_s: float = 20.0) -> int | None:
        """The server's pid if it accepts connections; None once it is gone. A server that is
        alive but does not accept (being killed, or hung) is waited for up to ``wait_s``, then
        stopped (called under the lifecycle lock: nobody is starting it meanwhile)."""
        deadline = time.monotonic() + wait_s
        while True:
            pid, port = self.pid(), self.state().get("port")
            if pid is None or (port and accepts(HOST, port, 1.0)):
                return pid
            if time.monotonic() >= deadline:
                log.warning("the Spark engine (pid %d) does not accept connections: stopping it", pid)
                self._stop(pid)
                return None
            time.sleep(0.25)

    def heartbeat_lost(self) -> bool:
        """Whether the server's executor heartbeat thread died since it started: Spark 4.2 lets an
        exception there (SPARK-59451) end the thread, and the executor then looks dead to the
        driver. Read from the server's log (only what it wrote since this server started)."""
        start = self.state().get("log_offset", 0)
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(start)
                return b"Uncaught exception in thread executor-heartbeater" in fh.read()
        except OSError:
            return False

    def idle(self) -> bool:
        """No step is attached to the engine at this moment (a glance: one may attach next)."""
        with self._exclusive_if_idle() as idle:
            return idle

    def _exclusive_if_idle(self):
        """Yields whether no step was attached; if so, none can attach until the block ends."""
        return self._flock("in-use.lock", fcntl.LOCK_EX, wait=False)


def _listens(sid: int, port: int) -> bool:
    """Whether a process of session ``sid`` listens on TCP ``port``."""
    import psutil

    for pid in processes.in_session(sid):
        try:
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                for c in psutil.Process(pid).net_connections(kind="tcp")
            ):
                return True
        except psutil.Error:
            continue
    return False


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
