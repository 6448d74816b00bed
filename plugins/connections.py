"""wavepipe's Connection types, whose *Test* button accepts exactly what a run accepts:

* ``wavepipe_kafka`` ("Kafka (wavepipe)"): the apache-kafka provider's ``kafka`` type, as that
  provider defines it (extra = the librdkafka configuration), tested the way a run uses it: the
  configuration is refused where a run would refuse it (a callback that is not the dotted path of
  a function importable here and listed in ``[apache_kafka] callback_allowlist``, as the provider
  requires; wavepipe hands the configuration to its reader processes as data, and each imports
  the callbacks itself), then the cluster is asked for its metadata and the topic, with a
  timeout, by a client that is gone afterwards.
* ``wavepipe_spark_connect`` ("Spark Connect (wavepipe)"): the apache-spark provider's
  ``spark_connect`` type (host, port, user id, token, SSL), tested by attaching, running a query
  and reporting the server's Spark version.

wavepipe also reads the providers' own ``kafka`` and ``spark_connect`` types; only their Test
buttons are the providers'.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.sdk import BaseHook, conf

from wavepipe.contracts.kafka_callbacks import CALLBACK_KEYS, refused_callbacks

#: The Kafka Connection types wavepipe reads, and the Spark Connect ones.
KAFKA_TYPES = ("kafka", "wavepipe_kafka")
SPARK_CONNECT_TYPES = ("spark_connect", "wavepipe_spark_connect")
#: Where the apache-kafka provider (2.x) lists the callback paths a Connection may name.
KAFKA_SECTION, ALLOWLIST_OPTION = "apache_kafka", "callback_allowlist"


def refused_kafka_config(config: dict[str, Any]) -> str | None:
    """Why a run refuses this librdkafka configuration (a Connection's extra), or None."""
    if not config.get("bootstrap.servers"):
        return (
            'it has no bootstrap.servers in its extra: give the brokers there, e.g. {"bootstrap.servers": '
            '"b1:9092,b2:9092"}, beside any other librdkafka property'
        )
    why = refused_callbacks(config) or _not_allowed(config)
    if why:
        return why
    mechanisms = str(config.get("sasl.mechanism") or config.get("sasl.mechanisms") or "").upper()
    oidc = str(config.get("sasl.oauthbearer.method", "")).lower() == "oidc"
    if mechanisms == "OAUTHBEARER" and not oidc and not config.get("oauth_cb"):
        return (
            "it asks for SASL OAUTHBEARER with neither sasl.oauthbearer.method=oidc nor an oauth_cb: give "
            "librdkafka's OIDC properties (sasl.oauthbearer.method=oidc, ...) or a token callback by dotted path, "
            'e.g. "oauth_cb": "mypkg.kafka_auth.token"'
        )
    return None


def _not_allowed(config: dict[str, Any]) -> str | None:
    """A callback path missing from ``[apache_kafka] callback_allowlist``: the apache-kafka
    provider resolves a Connection's callbacks only from that list (who edits Connections must
    not choose the code workers run), and so does wavepipe."""
    allowed = {path.strip() for path in conf.get(KAFKA_SECTION, ALLOWLIST_OPTION, fallback="").split(",")}
    for key in CALLBACK_KEYS:
        path = config.get(key)
        if isinstance(path, str) and path not in allowed:
            return (
                f"{key}={path!r} is not in [{KAFKA_SECTION}] {ALLOWLIST_OPTION}: add its path there (Airflow "
                f"config, or AIRFLOW__{KAFKA_SECTION.upper()}__{ALLOWLIST_OPTION.upper()}) if you trust it"
            )
    return None


def kafka_config_of(conn) -> dict[str, Any]:
    """The librdkafka configuration of a Kafka Connection (``bootstrap.servers`` included), as
    the apache-kafka provider defines its type; a ValueError naming the Connection and what to
    change when a run cannot use it."""
    if conn.conn_type not in KAFKA_TYPES:
        raise ValueError(
            f"Airflow connection {conn.conn_id!r} is of type {conn.conn_type!r}: wavepipe reads Kafka from the "
            "type 'wavepipe_kafka' or the apache-kafka provider's 'kafka' (extra = the librdkafka configuration)"
        )
    config = dict(conn.extra_dejson)
    why = refused_kafka_config(config)
    if why:
        host = f" It names {conn.host!r} as its host, which that type does not read." if conn.host else ""
        raise ValueError(f"Airflow connection {conn.conn_id!r}: {why}.{host}")
    return config


class WavepipeKafkaHook(BaseHook):
    """The ``wavepipe_kafka`` Connection type (see the module)."""

    conn_name_attr = "kafka_config_id"
    default_conn_name = "wavepipe_kafka"
    conn_type = "wavepipe_kafka"
    hook_name = "Kafka (wavepipe)"

    def __init__(self, kafka_config_id: str = default_conn_name):
        super().__init__()
        self.kafka_config_id = kafka_config_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "login", "password", "port", "host"],
            "relabeling": {"extra": "librdkafka configuration (JSON)"},
            "placeholders": {
                "extra": '{"bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL", '
                '"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "...", "sasl.password": "..."}'
            },
        }

    def test_connection(self) -> tuple[bool, str]:
        """What a run checks: the configuration (``kafka_config_of``), then the cluster."""
        from wavepipe.checks import check_kafka
        from wavepipe.contracts.config import load_settings

        try:
            config = kafka_config_of(self.get_connection(self.kafka_config_id))
            servers = config.pop("bootstrap.servers")
            check = check_kafka(load_settings().replace(bootstrap_servers=servers, kafka_client_config=config))
        except Exception as exc:
            return False, str(exc)
        return bool(check.ok), check.line


class WavepipeSparkConnectHook(SparkConnectHook):
    """The ``wavepipe_spark_connect`` Connection type (see the module)."""

    default_conn_name = "wavepipe_spark"
    conn_type = "wavepipe_spark_connect"
    hook_name = "Spark Connect (wavepipe)"

    def test_connection(self) -> tuple[bool, str]:
        """Attach to the server, run a query, report its Spark version."""
        from wavepipe.checks import check_engine
        from wavepipe.contracts.config import load_settings

        try:
            check = check_engine(
                load_settings().replace(spark_engine="connect", spark_remote=self.get_connection_url())
            )
        except Exception as exc:
            return False, str(exc)
        return bool(check.ok), check.line
