"""How the Airflow Spark connection ``wavepipe_spark`` names the master the Spark apps go to."""

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
