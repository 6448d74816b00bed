"""How the Airflow Spark connection ``wavepipe_spark`` names the master the Spark apps go to."""

import json

import pytest

from wavepipe.plugins.hooks import spark_master_from_connection


@pytest.mark.parametrize(
    "host, port, extra, master",
    [
        ("spark://spark-master", 7077, {}, "spark://spark-master:7077"),
        ("spark-master", 7077, {}, "spark://spark-master:7077"),  # the Spark provider's form: host and port
        ("yarn", None, {}, "yarn"),
        ("k8s://https://kube-api:6443", None, {}, "k8s://https://kube-api:6443"),
        ("local[4]", None, {}, "local[4]"),
        ("spark-master", None, {}, "spark://spark-master:7077"),  # no port: the standalone default
        ("spark://a:7078", None, {}, "spark://a:7078"),
        ("ignored", 1, {"master": "spark://a:7077,b:7077"}, "spark://a:7077,b:7077"),  # standby masters
    ],
)
def test_spark_connection_names_the_master(host, port, extra, master):
    assert spark_master_from_connection(host, port, extra) == master


def test_a_spark_connection_without_host_or_in_cluster_deploy_mode_is_refused():
    with pytest.raises(ValueError, match="has no host"):
        spark_master_from_connection("", 7077, {})
    with pytest.raises(ValueError, match="client mode only"):
        spark_master_from_connection("spark://m", 7077, {"deploy-mode": "cluster"})


def _kafka_connection(monkeypatch, **conn):
    monkeypatch.setenv("AIRFLOW_CONN_WP_KAFKA_TEST", json.dumps(conn))
    return "wp_kafka_test"


def test_kafka_comes_from_the_kafka_providers_connection_type(monkeypatch, tmp_path):
    """extra = the librdkafka configuration, as the apache-kafka provider defines its `kafka` type"""
    from wavepipe.plugins.hooks import WavepipeHook, kafka_client_config

    extra = {"bootstrap.servers": "b1:9092,b2:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    conn_id = _kafka_connection(monkeypatch, conn_type="kafka", extra=extra)
    assert kafka_client_config(conn_id) == extra
    monkeypatch.setenv("WAVEPIPE_HOME", str(tmp_path))
    settings = WavepipeHook(wavepipe_conn_id=conn_id, spark_conn_id="wp_no_such_spark").get_settings()
    assert settings.bootstrap_servers == "b1:9092,b2:9092"
    assert settings.kafka_client_config == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}


def test_a_kafka_connection_the_provider_would_not_read_is_refused_with_what_to_change(monkeypatch):
    from wavepipe.plugins.hooks import kafka_client_config

    conn_id = _kafka_connection(monkeypatch, conn_type="kafka", host="b1:9092", extra={"client.id": "x"})
    with pytest.raises(
        ValueError, match=r"no bootstrap.servers in its extra.*property\. It names 'b1:9092' as its host"
    ):
        kafka_client_config(conn_id)
    conn_id = _kafka_connection(monkeypatch, conn_type="http", extra={"bootstrap.servers": "b1:9092"})
    with pytest.raises(ValueError, match="of type 'http'"):
        kafka_client_config(conn_id)


def test_callbacks_by_dotted_path_are_taken_as_the_provider_takes_them(monkeypatch):
    """a Connection may name callbacks by dotted path, listed in [apache_kafka] callback_allowlist
    as the apache-kafka provider requires; a path that does not import, a Python object, or
    OAUTHBEARER with neither OIDC nor an oauth_cb is refused, by both Kafka types"""
    from wavepipe.plugins.connections import refused_kafka_config
    from wavepipe.plugins.hooks import kafka_client_config

    oauth = {"bootstrap.servers": "b1:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
    minted = {**oauth, "oauth_cb": "tests.kafka_tokens.mint"}
    monkeypatch.delenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", raising=False)
    assert "oauth_cb='tests.kafka_tokens.mint' is not in [apache_kafka] callback_allowlist" in refused_kafka_config(
        minted
    )
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "tests.kafka_tokens.mint, tests.kafka_tokenz.mint")
    for conn_type in ("kafka", "wavepipe_kafka"):
        conn_id = _kafka_connection(monkeypatch, conn_type=conn_type, extra=minted)
        assert kafka_client_config(conn_id) == minted
        typo = {**oauth, "oauth_cb": "tests.kafka_tokenz.mint"}
        conn_id = _kafka_connection(monkeypatch, conn_type=conn_type, extra=typo)
        with pytest.raises(ValueError, match=r"oauth_cb='tests.kafka_tokenz.mint': module 'tests.kafka_tokenz'"):
            kafka_client_config(conn_id)
    assert "neither sasl.oauthbearer.method=oidc nor an oauth_cb" in refused_kafka_config(oauth)
    assert refused_kafka_config({**oauth, "sasl.oauthbearer.method": "oidc"}) is None  # librdkafka's own
    assert "Python object" in refused_kafka_config({"bootstrap.servers": "b1:9092", "error_cb": print})
