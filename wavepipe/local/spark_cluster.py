"""A real Spark standalone cluster on this machine: one master and its workers on loopback.

It runs from the installed pyspark (its ``spark-class``), so the cluster's Spark, Python and
Python packages are exactly the driver's. For trying the cluster path of wavepipe on one machine
(``wavepipe spark up``, then ``WAVEPIPE_SPARK_MASTER=spark://127.0.0.1:<port>``) and for tests;
a real deployment runs its own cluster (docker/compose.yaml has one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from wavepipe import processes
from wavepipe.contracts.runfiles import read_json_or
from wavepipe.jars import SetupError, require_tool
from wavepipe.local.kafka import free_port, port_is_free
from wavepipe.spark_launch import pyspark_bin

READY_TIMEOUT_S = 90.0
HOST = "127.0.0.1"


@dataclass
class LocalSparkCluster:
    """A standalone master on ``port`` and ``workers`` workers, state and logs under ``folder``."""

    folder: Path
    port: int = 7077
    workers: int = 1
    worker_cores: int = 2
    worker_memory: str = "2g"
    daemon_heap: str = "256m"

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self._state().get('port', self.port)}"

    @property
    def state_file(self) -> Path:
        """Pids and the master's web UI port of the running cluster."""
        return self.folder / "cluster.json"

    def _state(self) -> dict:
        return read_json_or(self.state_file, {})

    def pids(self) -> list[int]:
        """The cluster's live daemon processes (master first)."""
        return [pid for pid in self._state().get("pids", []) if processes.alive(pid, "org.apache.spark.deploy")]

    def _daemon(self, name: str, main_class: str, *args: str) -> subprocess.Popen:
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": self.daemon_heap,
            "SPARK_LOG_DIR": str(self.folder / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
        }
        with (self.folder / "logs" / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                [str(pyspark_bin("spark-class")), main_class, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _save_state(self, procs: list[subprocess.Popen], ui_port: int) -> None:
        self.state_file.write_text(json.dumps({"pids": [p.pid for p in procs], "ui_port": ui_port, "port": self.port}))

    def up(self) -> str:
        """Start the master and its workers; return once every worker has registered."""
        if self.pids():
            self.wait_ready()
            return f"Spark standalone already running at {self.master_url} (pids {self.pids()})"
        self.state_file.unlink(missing_ok=True)  # left by a cluster that did not stop through down()
        require_tool("java", "Install Java 17 (apt-get install openjdk-17-jre-headless).")
        if not port_is_free(HOST, self.port):
            raise SetupError(
                f"port {self.port} on {HOST} is in use: set another port for the Spark master "
                "(wavepipe spark up --port <free port>)"
            )
        (self.folder / "logs").mkdir(parents=True, exist_ok=True)
        ui_port = free_port()
        master = self._daemon(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(ui_port),
        )
        procs = [master]
        self._save_state(procs, ui_port)  # from here on, down() stops what was started
        for i in range(self.workers):
            work_dir = self.folder / f"worker-{i + 1}"
            work_dir.mkdir(parents=True, exist_ok=True)
            procs.append(
                self._daemon(
                    f"worker-{i + 1}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    HOST,
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(work_dir),
                    f"spark://{HOST}:{self.port}",
                )
            )
            self._save_state(procs, ui_port)
        try:
            self.wait_ready(procs)
        except BaseException:
            self.down()
            raise
        return (
            f"Spark standalone master {self.master_url} with {self.workers} worker(s) of "
            f"{self.worker_cores} cores / {self.worker_memory} started (web UI http://{HOST}:{ui_port}, "
            f"logs in {self.folder / 'logs'})"
        )

    def alive_workers(self) -> int:
        """Workers registered and alive, from the master's JSON status page."""
        from wavepipe import http_client

        ui_port = self._state().get("ui_port")
        return int(http_client.get_json(f"http://{HOST}:{ui_port}/json/", timeout_s=2).get("aliveworkers", 0))

    def wait_ready(self, procs: list[subprocess.Popen] | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        from wavepipe import http_client

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in procs or []:
                if proc.poll() is not None:
                    raise SetupError(
                        f"a Spark daemon exited with code {proc.returncode}; see the logs in {self.folder / 'logs'}"
                    )
            try:
                if self.alive_workers() >= self.workers:
                    return
            except http_client.FAILED:
                pass  # the master's web UI is not up yet (or answered half a page)
            time.sleep(0.5)
        raise SetupError(
            f"the Spark standalone cluster was not ready in {timeout:.0f}s; see the logs in {self.folder / 'logs'}"
        )

    def down(self, timeout: float = 20.0) -> str:
        pids = self.pids()
        for pid in reversed(pids):  # workers first, then the master
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pids():
            time.sleep(0.2)
        for pid in self.pids():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.state_file.unlink(missing_ok=True)
        return f"Spark standalone stopped ({len(pids)} processes)" if pids else "Spark standalone is not running"

    def status(self) -> str:
        pids = self.pids()
        if not pids:
            return "Spark standalone is not running"
        return f"Spark standalone running at {self.master_url}: {self.alive_workers()} worker(s) alive (pids {pids})"
