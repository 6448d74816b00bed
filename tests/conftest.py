"""Shared fixtures: one real Kafka broker for the session, a fresh topic/group/home per test, and a
local Spark session for reading the Delta tables back."""

from __future__ import annotations

import logging
import os
import tempfile
import uuid

# Airflow reads its home at import: keep the test process away from ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="wavepipe-test-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# py4j logs "closing connection" from finalizers after pytest closed its streams
logging.getLogger("py4j").setLevel(logging.WARNING)

import pytest

from wavepipe.config import Settings, load_settings


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real Apache Kafka broker (KRaft, one node) on a free loopback port, stopped at the end."""
    from wavepipe.localkafka import LocalKafka, free_port

    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), "127.0.0.1", free_port(), load_settings().jars_dir)
    broker.up()
    yield broker
    broker.down()


@pytest.fixture
def settings(kafka, tmp_path) -> Settings:
    """Settings for one test: its own home, topic and group on the session's broker."""
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        home=tmp_path / "home", bootstrap_servers=kafka.bootstrap, topic=f"wf-{tag}", group=f"grp-{tag}",
        partitions=2, kafka_client_config={}, max_records_per_partition=0, max_bytes_per_partition=0,
        spark_master="local[2]", reader_stall_timeout_s=30,
    )


@pytest.fixture(scope="session")
def spark():
    from wavepipe.spark import local_session

    session = local_session(load_settings(spark_master="local[2]"), "wavepipe-tests")
    yield session
    session.stop()
