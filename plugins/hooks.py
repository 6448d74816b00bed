"""The hook owns the connections: Airflow Connections when they are defined, else wavepipe config."""

from __future__ import annotations

import json
import logging
import os

from airflow.sdk import BaseHook

from wavepipe.contracts.config import Settings, load_settings, redact_url
from wavepipe.contracts.errors import BUGS
from wavepipe.plugins.connections import SPARK_CONNECT_TYPES, WavepipeSparkConnectHook, kafka_config_of

log = logging.getLogger(__name__)

#: The Airflow Connection naming the Spark cluster the run's Spark apps are submitted to.
SPARK_CONN_ID = "wavepipe_spark"


def spark_master_from_connection(host: str | None, port: int | None, extra: dict) -> str:
    """``spark://master:7077``, ``yarn``, ``k8s://https://api:6443`` or ``local[2]`` from a Spark
    Connection's host and port (the form the Apache Spark provider's connection uses); a
    ``master`` in the extra wins."""
    mode = str(extra.get("deploy-mode") or extra.get("deploy_mode") or "client")
    if mode != "client":
        raise ValueError(
            f"Airflow connection {SPARK_CONN_ID!r} asks for deploy mode {mode!r}: "
            "wavepipe submits in client mode only (the step waits for its Spark app and reads "
            "its result); remove deploy-mode from the connection's extra"
        )
    if extra.get("master"):
        return str(extra["master"])
    host = (host or "").strip()
    if not host:
        raise ValueError(
            f"Airflow connection {SPARK_CONN_ID!r} has no host: give e.g. spark://spark-master "
            "with port 7077, or yarn, or k8s://https://<api server>"
        )
    if host.startswith(("local", "yarn", "k8s://")):
        return host
    if "://" not in host:
        host = f"spark://{host}"
    if host.startswith("spark://") and ":" in host[len("spark://") :]:
        return host  # the port (or standby masters' ports) already in the host
    return f"{host}:{port or 7077}"  # a standalone master's default port


def kafka_client_config(conn_id: str, conn=None) -> dict:
    """The librdkafka configuration of the Kafka Connection ``conn_id`` (``bootstrap.servers``
    included): its extra, as the apache-kafka provider defines its type; refused where a run
    cannot use it (``connections.kafka_config_of``)."""
    return kafka_config_of(conn or BaseHook.get_connection(conn_id))


class WavepipeHook(BaseHook):
    """Settings for a run, with Kafka and Spark taken from Airflow Connections where they exist.

    Kafka, Connection ``conn_id`` (default ``wavepipe_kafka``) of wavepipe's type
    ``wavepipe_kafka`` or the apache-kafka provider's ``kafka`` (``connections``): its extra is the
    librdkafka configuration (``bootstrap.servers`` and TLS, SASL, ... properties; callbacks by
    dotted path, listed in ``[apache_kafka] callback_allowlist`` as the provider requires), given
    to every Kafka client, with wavepipe's own keys per client (group, isolation, transactions)
    on top.

    Spark, Connection ``wavepipe_spark``, of one of these types:

    * ``wavepipe_spark_connect`` or the apache-spark provider's ``spark_connect`` (Spark Connect):
      the server the run's Spark work attaches to, its URL built as the provider's
      ``SparkConnectHook`` builds it (host, port, user id, token, SSL). Airflow's workers then need
      no JVM.
    * ``spark`` (spark-submit, the fallback): its host and port name the master each step's Spark
      app is submitted to (``spark://host`` + port, ``yarn``, ``k8s://https://...``), and ``conf``
      in its extra (a JSON object of Spark properties) is added to ``spark_conf``.

    Without it, the ``spark_engine``, ``spark_remote`` and ``spark_master`` settings apply (by
    default: this home's own Spark Connect server, in local mode).
    """

    conn_name_attr = "wavepipe_conn_id"
    default_conn_name = "wavepipe_kafka"

    def __init__(self, wavepipe_conn_id: str = default_conn_name, spark_conn_id: str = SPARK_CONN_ID):
        super().__init__()
        self.wavepipe_conn_id = wavepipe_conn_id
        self.spark_conn_id = spark_conn_id

    def _connection(self, conn_id: str):
        try:
            return self.get_connection(conn_id)
        except BUGS:
            raise
        except Exception as exc:
            env = f"AIRFLOW_CONN_{conn_id.upper()}"
            if os.environ.get(env):  # defined, but Airflow could not read it: never fall back silently
                raise ValueError(
                    f"{env} is set, but Airflow could not read it as a connection ({exc}); fix its JSON or URI form"
                ) from exc
            log.info("no Airflow connection %r (%s)", conn_id, type(exc).__name__)
            return None

    def kafka_settings(self, **overrides) -> Settings:
        """The settings with Kafka from the Connection (the Spark part as configured)."""
        settings = load_settings(**overrides)
        conn = self._connection(self.wavepipe_conn_id)
        if conn is None:
            log.info("Kafka from wavepipe config: %s", settings.bootstrap_servers)
            return settings
        config = kafka_client_config(self.wavepipe_conn_id, conn)
        servers = config.pop("bootstrap.servers")
        log.info("Kafka from Airflow connection %r: %s", self.wavepipe_conn_id, servers)
        return settings.replace(
            bootstrap_servers=servers, kafka_client_config={**settings.kafka_client_config, **config}
        )

    def get_settings(self, **overrides) -> Settings:
        settings = self.kafka_settings(**overrides)
        conn = self._connection(self.spark_conn_id)
        if conn is None:
            log.info(
                "Spark from wavepipe config: %s",
                redact_url(settings.spark_remote)
                or (
                    f"this home's Spark engine ({settings.spark_master})"
                    if settings.spark_engine == "connect"
                    else f"spark-submit to {settings.spark_master}"
                ),
            )
            return settings
        if conn.conn_type in SPARK_CONNECT_TYPES:
            url = WavepipeSparkConnectHook(self.spark_conn_id).get_connection_url()
            log.info("Spark from Airflow connection %r: Spark Connect server %s", self.spark_conn_id, redact_url(url))
            return settings.replace(spark_engine="connect", spark_remote=url)
        extra = json.loads(conn.extra) if conn.extra else {}
        master = spark_master_from_connection(conn.host, conn.port, extra)
        log.info("Spark from Airflow connection %r: %s", self.spark_conn_id, master)
        return settings.replace(
            spark_engine="submit",
            spark_master=master,
            spark_conf={**settings.spark_conf, **dict(extra.get("conf") or {})},
        )
