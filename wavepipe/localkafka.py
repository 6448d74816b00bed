"""A real Apache Kafka broker on this machine: one KRaft node (broker + controller).

The jars come from Maven Central (resources/kafka-pom.xml); data, config, logs and the pid file
live under one folder. ``up`` returns only once the broker answers metadata requests.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from wavepipe.jars import RESOURCES, SetupError, kafka_jars, require_tool

READY_TIMEOUT_S = 90.0


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_hostport(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise SetupError(f"bootstrap servers {bootstrap!r} are not host:port")
    return host, int(port)


@dataclass
class LocalKafka:
    """One local KRaft broker keeping its state in ``folder``."""

    folder: Path
    host: str
    port: int
    jars_dir: Path
    default_partitions: int = 4
    heap: str = "768m"

    @classmethod
    def from_settings(cls, settings) -> "LocalKafka":
        host, port = parse_hostport(settings.bootstrap_servers)
        if host not in ("127.0.0.1", "localhost"):
            raise SetupError(
                f"the local broker only binds to loopback; bootstrap servers are {settings.bootstrap_servers}. "
                "Point WAVEPIPE_BOOTSTRAP_SERVERS at 127.0.0.1:<port> or run your own cluster."
            )
        return cls(settings.kafka_dir, "127.0.0.1", port, settings.jars_dir, settings.partitions)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.folder / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / "broker.log"

    @property
    def config_file(self) -> Path:
        return self.folder / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    def pid(self) -> int | None:
        """The broker's pid if it is running."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        cmdline = Path(f"/proc/{pid}/cmdline")
        if cmdline.exists() and b"kafka.Kafka" not in cmdline.read_bytes():
            return None  # pid reused by something else
        return pid

    def _write_config(self, controller_port: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "controller.quorum.voters": f"1@{self.host}:{controller_port}",
            "log.dirs": str(self.data_dir),
            "num.partitions": str(self.default_partitions),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            # Allow payload-sized batches: a producer batch of many 64 KiB chunks.
            "message.max.bytes": str(16 * 1024 * 1024),
            "replica.fetch.max.bytes": str(16 * 1024 * 1024),
            "log.retention.hours": "168",
            # Abort transactions of producers that died within ~1 s of their timeout (default 10 s),
            # so a crashed transactional producer holds the last stable offset back briefly.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        }
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _java(self, main_class: str, *args: str, log_config: str = "kafka-log4j2.properties") -> list[str]:
        java = require_tool("java", "Install Java 17 (apt-get install openjdk-17-jre-headless).")
        jars = kafka_jars(self.jars_dir)
        return [
            java, f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={RESOURCES / log_config}",
            "-cp", f"{jars}/*", main_class, *args,
        ]

    def up(self) -> str:
        """Start the broker (formatting its storage the first time) and wait until it is ready."""
        if self.pid() is not None:
            self.wait_ready()
            return f"Kafka already running at {self.bootstrap} (pid {self.pid()})"
        if not port_is_free(self.host, self.port):
            if self._answers():
                return f"a Kafka broker not started from {self.folder} already answers at {self.bootstrap}; using it"
            raise SetupError(
                f"port {self.port} on {self.host} is in use by another process. Stop it, or set "
                f"WAVEPIPE_BOOTSTRAP_SERVERS=127.0.0.1:<free port> to run the local broker elsewhere."
            )
        controller_port = self.port + 1 if port_is_free(self.host, self.port + 1) else free_port()
        self._write_config(controller_port)
        if not (self.data_dir / "meta.properties").exists():
            cid = "-"
            while cid.startswith("-"):  # like Kafka's own Uuid.randomUuid: a leading '-' reads as an option
                cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            result = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", cid, "-c", str(self.config_file)),
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                raise SetupError(f"formatting Kafka storage failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        log = self.log_file.open("ab")
        proc = subprocess.Popen(
            self._java("kafka.Kafka", str(self.config_file)),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.pid_file.write_text(f"{proc.pid}\n")
        try:
            self.wait_ready(proc)
        except BaseException:
            self.down()
            raise
        return f"Kafka {self.bootstrap} started (pid {proc.pid}, data in {self.data_dir})"

    def _answers(self) -> bool:
        try:
            self.wait_ready(timeout=5)
            return True
        except SetupError:
            return False

    def wait_ready(self, proc: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, "logger": _quiet_logger()})
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise SetupError(f"the Kafka broker exited with code {proc.returncode}; see {self.log_file}")
            try:
                meta = admin.list_topics(timeout=2)
                if meta.brokers:
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.5)
        raise SetupError(f"the Kafka broker did not become ready in {timeout:.0f}s; see {self.log_file}")

    def down(self, timeout: float = 30.0) -> str:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return "Kafka is not running"
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid() is not None:
            time.sleep(0.2)
        if self.pid() is not None:
            os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return f"Kafka (pid {pid}) stopped"

    def status(self) -> str:
        pid = self.pid()
        return f"Kafka running at {self.bootstrap} (pid {pid})" if pid else "Kafka is not running"

    def tool(self, main_class: str, *args: str) -> subprocess.CompletedProcess:
        """Run one of Kafka's own command-line tools (e.g. the consumer-groups command)."""
        cmd = self._java(main_class, *args, log_config="kafka-tools-log4j2.properties")
        return subprocess.run(cmd, capture_output=True, text=True)


def _quiet_logger():
    import logging

    logger = logging.getLogger("wavepipe.localkafka.probe")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


CONSUMER_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
