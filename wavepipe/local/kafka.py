"""Real Apache Kafka on this machine: KRaft nodes, each a broker and a controller in one JVM.

``LocalKafka`` is one node; alone it is the single-node cluster ``wavepipe kafka up`` starts.
``LocalKafkaCluster`` runs several of them as one cluster on loopback (the same cluster id, every
node a voter of the controller quorum, internal topics replicated), optionally with SASL/PLAIN
on the client listener, to exercise replication, leader failover and client security for real.
A node may also have more client listeners (``Listener``: TLS, mutual TLS, SASL_SSL with SCRAM or
OAUTHBEARER; certificates from ``wavepipe.local.tls``), as managed clusters offer them.

The jars come from Maven Central (resources/kafka-pom.xml); data, config, logs and the pid file
of a node live under one folder. ``up`` returns only once the node answers metadata requests.
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wavepipe import processes
from wavepipe.jars import RESOURCES, SetupError, kafka_jars, require_tool
from wavepipe.waiting import wait_until

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


def new_cluster_id() -> str:
    """A random cluster id as Kafka's own ``Uuid.randomUuid`` makes them (base64, no leading '-',
    which the storage tool would read as an option)."""
    cid = "-"
    while cid.startswith("-"):
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cid


def sasl_client_config(username: str, password: str) -> dict[str, str]:
    """librdkafka properties of a client of a SASL/PLAIN listener (without TLS)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": password,
    }


#: The broker's login module of each SASL mechanism (users of PLAIN are in its JAAS line; SCRAM
#: users are stored in the cluster's metadata, ``LocalKafka.scram_users``; OAUTHBEARER with these
#: defaults validates unsecured JWS tokens: Kafka's OAuthBearerUnsecuredValidatorCallbackHandler).
SASL_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}


@dataclass(frozen=True)
class Listener:
    """A client listener of a node beside its main one: its name, port, security protocol
    (``SSL``, ``SASL_SSL``, ``SASL_PLAINTEXT``, ``PLAINTEXT``) and its own properties, written
    as ``listener.name.<name>.<property>`` (SASL mechanisms, ``ssl.client.auth``, ...)."""

    name: str
    port: int
    protocol: str
    properties: Mapping[str, str] = field(default_factory=dict)


def sasl_listener(name: str, port: int, mechanism: str, protocol: str = "SASL_SSL") -> Listener:
    """A listener taking one SASL mechanism (its users: ``scram_users`` for SCRAM; any unsecured
    token for OAUTHBEARER). Its TLS, if any, uses the node's ``ssl.*`` properties."""
    module = SASL_LOGIN_MODULES[mechanism]
    return Listener(
        name,
        port,
        protocol,
        {"sasl.enabled.mechanisms": mechanism, f"{mechanism.lower()}.sasl.jaas.config": f"{module} required;"},
    )


def _jaas_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class LocalKafka:
    """One local KRaft node (broker + controller) keeping its state in ``folder``.

    With the defaults it is a cluster of its own: one PLAINTEXT listener for clients and for
    itself, internal topics without replicas. ``LocalKafkaCluster`` sets the other fields.
    """

    folder: Path
    host: str
    port: int
    jars_dir: Path
    default_partitions: int = 4
    heap: str = "768m"
    node_id: int = 1
    #: Controller listener port; None: ``port + 1`` if free, else any free port (a lone node).
    controller_port: int | None = None
    #: A separate PLAINTEXT listener for traffic between brokers (replication); None: the client
    #: listener serves it too, unless ``sasl_users`` needs one (then a free port is taken).
    internal_port: int | None = None
    #: ``controller.quorum.voters``; None: this node alone.
    quorum_voters: str | None = None
    #: Id the storage is formatted with the first time; None: a new random one.
    cluster_id: str | None = None
    #: Replication factor of the internal topics (offsets, transaction state) and of topics created
    #: without one; above 1, their min ISR (and the brokers' default ``min.insync.replicas``) is 2.
    replication: int = 1
    #: Non-empty: the client listener is SASL_PLAINTEXT with mechanism PLAIN and these users
    #: (name -> password); the controller and inter-broker listeners stay PLAINTEXT.
    sasl_users: Mapping[str, str] = field(default_factory=dict)
    #: More client listeners (TLS, other SASL mechanisms) beside the main one, which stays the one
    #: ``client_config`` and the readiness check use. TLS listeners need the node's ``ssl.*``
    #: properties in ``server_config`` (``wavepipe.local.tls.broker_ssl_properties``).
    listeners: tuple[Listener, ...] = ()
    #: SCRAM-SHA-512 users (name -> password) stored when the storage is formatted.
    scram_users: Mapping[str, str] = field(default_factory=dict)
    #: Extra server.properties, applied last.
    server_config: Mapping[str, Any] = field(default_factory=dict)
    #: Extra JVM options of the node (e.g. ``-XX:TieredStopAtLevel=1``: less CPU, lower peak speed;
    #: a ``-XX:+Use...GC`` option replaces the default G1).
    jvm_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._proc: subprocess.Popen | None = None

    @classmethod
    def from_settings(cls, settings) -> LocalKafka:
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

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """librdkafka properties of a client of this node's client listener: bootstrap servers,
        and with SASL the credentials of ``user`` (default: the first user)."""
        return {"bootstrap.servers": self.bootstrap, **_security(self.sasl_users, user)}

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
        """The node's pid if it is running."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if processes.alive(pid, "kafka.Kafka") else None  # else gone, a zombie or a recycled pid

    def formatted_cluster_id(self) -> str | None:
        """The cluster id this node's storage was formatted with (None: not formatted yet)."""
        try:
            lines = (self.data_dir / "meta.properties").read_text().splitlines()
        except FileNotFoundError:
            return None
        return next((line.split("=", 1)[1].strip() for line in lines if line.startswith("cluster.id=")), None)

    def _ports(self) -> list[int]:
        ports = (self.port, self.controller_port, self.internal_port, *(lst.port for lst in self.listeners))
        return [p for p in ports if p is not None]

    def _server_properties(self, controller_port: int, internal_port: int | None) -> dict[str, str]:
        client = "CLIENT" if internal_port else "PLAINTEXT"
        inter = "INTERNAL" if internal_port else client
        client_protocol = "SASL_PLAINTEXT" if self.sasl_users else "PLAINTEXT"
        advertised = [f"{client}://{self.host}:{self.port}"]
        if internal_port:
            advertised.append(f"INTERNAL://{self.host}:{internal_port}")
        advertised += [f"{lst.name}://{self.host}:{lst.port}" for lst in self.listeners]
        protocols = {"CONTROLLER": "PLAINTEXT", client: client_protocol, inter: "PLAINTEXT"}
        protocols |= {lst.name: lst.protocol for lst in self.listeners}
        rf, min_isr = self.replication, min(2, self.replication)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": ",".join(advertised + [f"CONTROLLER://{self.host}:{controller_port}"]),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": inter,
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "controller.quorum.voters": self.quorum_voters or f"{self.node_id}@{self.host}:{controller_port}",
            "log.dirs": str(self.data_dir),
            "num.partitions": str(self.default_partitions),
            "offsets.topic.replication.factor": str(rf),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(rf),
            "transaction.state.log.min.isr": str(min_isr),
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(rf),
            "share.coordinator.state.topic.min.isr": str(min_isr),
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
        if rf > 1:  # the offsets topic takes its min ISR from the brokers' default
            props |= {"default.replication.factor": str(rf), "min.insync.replicas": str(min_isr)}
        if self.sasl_users:
            users = " ".join(f"user_{name}={_jaas_quote(pw)}" for name, pw in self.sasl_users.items())
            prefix = f"listener.name.{client.lower()}"
            props |= {
                f"{prefix}.sasl.enabled.mechanisms": "PLAIN",
                f"{prefix}.plain.sasl.jaas.config": f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
            }
        for lst in self.listeners:
            props |= {f"listener.name.{lst.name.lower()}.{k}": str(v) for k, v in lst.properties.items()}
        props |= {k: str(v) for k, v in self.server_config.items()}
        return props

    def _java(self, main_class: str, *args: str, log_config: str = "kafka-log4j2.properties") -> list[str]:
        java = require_tool("java", "Install Java 17 (apt-get install openjdk-17-jre-headless).")
        jars = kafka_jars(self.jars_dir)
        gc = [] if any(o.startswith("-XX:+Use") and o.endswith("GC") for o in self.jvm_options) else ["-XX:+UseG1GC"]
        return [
            java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            *gc,
            *self.jvm_options,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={RESOURCES / log_config}",
            "-cp",
            f"{jars}/*",
            main_class,
            *args,
        ]

    def up(self) -> str:
        """Start the node (formatting its storage the first time) and wait until it is ready. One
        process at a time starts it: a second ``up`` waits for the first (saying so), then finds
        it running."""
        waiting = f"another process is starting the Kafka broker of {self.folder}: waiting for it"
        with processes.file_lock(self.folder / "lifecycle.lock", waiting=waiting):
            return self._up()

    def _up(self) -> str:
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
        proc = self.start()
        try:
            self.wait_ready(proc)
        except BaseException:
            self.down()
            raise
        return f"Kafka {self.bootstrap} started (pid {proc.pid}, data in {self.data_dir})"

    def start(self) -> subprocess.Popen:
        """Write the config, format the storage the first time, and launch the JVM; returns at
        once (a node of a cluster is not ready before a majority of the controllers runs)."""
        busy = [p for p in self._ports() if not port_is_free(self.host, p)]
        if busy:
            raise SetupError(
                f"ports {busy} on {self.host} are in use by another process; node {self.node_id} "
                f"of {self.folder} cannot start"
            )
        controller_port = self.controller_port or (
            self.port + 1 if port_is_free(self.host, self.port + 1) else free_port()
        )
        internal_port = self.internal_port or (free_port() if self.sasl_users else None)
        self.folder.mkdir(parents=True, exist_ok=True)
        props = self._server_properties(controller_port, internal_port)
        self.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        if self.formatted_cluster_id() is None:
            result = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id or new_cluster_id(),
                    "-c",
                    str(self.config_file),
                    *(
                        arg
                        for name, pw in self.scram_users.items()
                        for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={pw}]")
                    ),
                ),
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                with self.log_file.open("a") as log:
                    log.write(result.stdout + result.stderr)
                said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
                raise SetupError(
                    f"formatting the Kafka storage in {self.data_dir} failed: {said[-1] if said else 'no output'} "
                    f"(its whole output is at the end of {self.log_file})"
                )
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self.config_file)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        return self._proc

    def _answers(self) -> bool:
        try:
            self.wait_ready(timeout=5)
            return True
        except SetupError:
            return False

    def wait_ready(
        self, proc: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S, brokers: int = 1
    ) -> None:
        """Wait until the node answers metadata requests on its client listener and at least
        ``brokers`` brokers (this one among them) are registered and unfenced."""
        from confluent_kafka import KafkaException

        from wavepipe.consumers.kafka_admin import new_admin

        admin = new_admin(self.client_config())  # connection refused while it starts: DEBUG lines only

        def ready() -> bool:
            if proc is not None and proc.poll() is not None:
                raise SetupError(f"Kafka node {self.node_id} exited with code {proc.returncode}; see {self.log_file}")
            meta = admin.list_topics(timeout=2)  # KafkaException while it does not answer yet
            return len(meta.brokers) >= brokers and (self.quorum_voters is None or self.node_id in meta.brokers)

        wait_until(
            ready,
            timeout,
            f"Kafka node {self.node_id} at {self.bootstrap} to be ready",
            retry_on=(KafkaException,),
            hint=f"see its log {self.log_file}",
            error=SetupError,
        )

    def down(self, timeout: float = 30.0) -> str:
        """Stop the node (SIGTERM, a controlled shutdown; SIGKILL after ``timeout``)."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            self._reap()
            return "Kafka is not running"
        processes.stop_group(pid, lambda: self.pid() is not None, timeout)
        self._reap()
        self.pid_file.unlink(missing_ok=True)
        return f"Kafka (pid {pid}) stopped"

    def kill(self, timeout: float = 30.0) -> int | None:
        """SIGKILL the node: a crash, no controlled shutdown. Returns the pid it had."""
        pid = self.pid()
        if pid is None:
            return None
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while self.pid() is not None:
            if time.monotonic() > deadline:
                raise SetupError(f"Kafka node {self.node_id} (pid {pid}) survived SIGKILL for {timeout:.0f}s")
            time.sleep(0.1)
        self._reap()
        return pid

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def status(self) -> str:
        pid = self.pid()
        return f"Kafka running at {self.bootstrap} (pid {pid})" if pid else "Kafka is not running"

    def tool(self, main_class: str, *args: str) -> subprocess.CompletedProcess:
        """Run one of Kafka's own command-line tools (e.g. the consumer-groups command)."""
        cmd = self._java(main_class, *args, log_config="kafka-tools-log4j2.properties")
        return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _security(sasl_users: Mapping[str, str], user: str | None) -> dict[str, str]:
    if not sasl_users:
        return {}
    user = user or next(iter(sasl_users))
    return sasl_client_config(user, sasl_users[user])


#: JVM options of a cluster's nodes: C1 only (no C2 JIT) takes about a third less CPU to start
#: three nodes and about half as much idle, at a lower peak speed that local tests do not need.
CLUSTER_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)


class LocalKafkaCluster:
    """``nodes`` local KRaft nodes on ``host`` forming one cluster, each a broker and a voter of
    the controller quorum, every node's state under ``folder/node-<id>``.

    Internal topics (consumer offsets, transaction state) and topics created without a
    replication factor get ``min(3, nodes)`` replicas and a min ISR of ``min(2, nodes)``: three
    nodes keep serving, acks=all and transactions included, with one node down. ``sasl_users``
    (name -> password) makes the client listener SASL_PLAINTEXT/PLAIN; replication and the quorum
    use PLAINTEXT listeners of their own. Ports are free ones taken when the object is made;
    ``server_config`` is added to every node's server.properties.
    """

    def __init__(
        self,
        folder: Path,
        nodes: int = 3,
        *,
        jars_dir: Path,
        host: str = "127.0.0.1",
        heap: str = "384m",
        default_partitions: int = 4,
        sasl_users: Mapping[str, str] | None = None,
        server_config: Mapping[str, Any] | None = None,
        jvm_options: tuple[str, ...] = CLUSTER_JVM_OPTIONS,
    ):
        if nodes < 1:
            raise ValueError("a cluster has at least one node")
        self.folder = Path(folder)
        self.host = host
        self.sasl_users = dict(sasl_users or {})
        ids = range(1, nodes + 1)
        ports = {i: (free_port(), free_port(), free_port()) for i in ids}  # client, controller, internal
        voters = ",".join(f"{i}@{host}:{ports[i][1]}" for i in ids)
        self.nodes: dict[int, LocalKafka] = {
            i: LocalKafka(
                self.folder / f"node-{i}",
                host,
                ports[i][0],
                Path(jars_dir),
                default_partitions,
                heap,
                node_id=i,
                controller_port=ports[i][1],
                internal_port=ports[i][2],
                quorum_voters=voters,
                replication=min(3, nodes),
                sasl_users=self.sasl_users,
                server_config=dict(server_config or {}),
                jvm_options=tuple(jvm_options),
            )
            for i in ids
        }

    @property
    def bootstrap(self) -> str:
        """Every node's client listener, comma-separated."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """librdkafka properties of a client of the cluster (see ``LocalKafka.client_config``)."""
        return {"bootstrap.servers": self.bootstrap, **_security(self.sasl_users, user)}

    def security_config(self, user: str | None = None) -> dict[str, str]:
        """Only the security properties (wavepipe's ``kafka_client_config``)."""
        return _security(self.sasl_users, user)

    def node_pids(self) -> dict[int, int | None]:
        return {i: node.pid() for i, node in self.nodes.items()}

    def up(self, timeout: float = READY_TIMEOUT_S) -> str:
        """Start every node not running (all formatted with one cluster id the first time) and wait
        until each answers and all are registered. Also brings a killed node back."""
        formatted = (node.formatted_cluster_id() for node in self.nodes.values())
        cluster_id = next(filter(None, formatted), None) or new_cluster_id()
        stopped = [node for node in self.nodes.values() if node.pid() is None]
        for node in stopped:
            node.cluster_id = cluster_id
        try:
            with ThreadPoolExecutor(max(1, len(stopped))) as pool:  # formatting starts a JVM each
                futures = {node.node_id: pool.submit(node.start) for node in stopped}
            started = {i: future.result() for i, future in futures.items()}
            for i, node in self.nodes.items():
                node.wait_ready(started.get(i), timeout=timeout, brokers=len(self.nodes))
        except BaseException:
            for node in stopped:
                node.down(timeout=5)
            raise
        return (
            f"Kafka cluster of {len(self.nodes)} nodes at {self.bootstrap} "
            f"(started {sorted(started) or 'none'}; pids {self.node_pids()})"
        )

    def kill(self, node_id: int) -> int | None:
        """SIGKILL node ``node_id`` (a real crash); returns the pid it had."""
        return self.nodes[node_id].kill()

    def down(self, timeout: float = 30.0) -> str:
        """Stop all nodes at once (a node left alone could wait for a quorum that is gone)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            results = list(pool.map(lambda node: node.down(timeout), self.nodes.values()))
        return "; ".join(f"node {i}: {r}" for i, r in zip(self.nodes, results, strict=True))

    def status(self) -> str:
        return "; ".join(f"node {i}: {node.status()}" for i, node in self.nodes.items())


CONSUMER_GROUPS_TOOL = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
