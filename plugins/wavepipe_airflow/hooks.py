"""The hook owns the Kafka connection: an Airflow Connection when one is defined, else config."""

from __future__ import annotations

import json
import logging

from airflow.sdk import BaseHook

from wavepipe.config import Settings, load_settings

log = logging.getLogger(__name__)


class WavepipeHook(BaseHook):
    """Settings for a run, with Kafka taken from the Airflow Connection ``conn_id`` if it exists.

    The connection's host (``host:port[,host:port...]``) becomes ``bootstrap.servers`` and its
    extra (a JSON object of librdkafka properties: TLS, SASL, ...) is passed to every client.
    """

    conn_name_attr = "wavepipe_conn_id"
    default_conn_name = "wavepipe_kafka"
    conn_type = "kafka"
    hook_name = "wavepipe Kafka"

    def __init__(self, wavepipe_conn_id: str = default_conn_name):
        super().__init__()
        self.wavepipe_conn_id = wavepipe_conn_id

    def get_settings(self, **overrides) -> Settings:
        settings = load_settings(**overrides)
        try:
            conn = self.get_connection(self.wavepipe_conn_id)
        except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException and friends
            log.info("no Airflow connection %r (%s); Kafka from wavepipe config: %s",
                     self.wavepipe_conn_id, type(exc).__name__, settings.bootstrap_servers)
            return settings
        servers = conn.host if conn.port is None else f"{conn.host}:{conn.port}"
        extra = json.loads(conn.extra) if conn.extra else {}
        log.info("Kafka from Airflow connection %r: %s", self.wavepipe_conn_id, servers)
        return settings.replace(bootstrap_servers=servers, kafka_client_config={**settings.kafka_client_config, **extra})
