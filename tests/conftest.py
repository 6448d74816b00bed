"""Shared fixtures: one real Kafka broker and one warm Spark engine (a Spark Connect server) per
test worker, a fresh topic/group/home per test, and a session on the engine for reading the Delta
tables back."""

from __future__ import annotations

import logging
import os
import tempfile

# Airflow reads its home at import: keep the test process away from ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="wavepipe-test-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
# Under pytest-xdist, a worker's __main__ (execnet's) has no __file__: pyspark.sql.connect then
# takes the process for a doctest run and exits it (sys.exit(0)) when great_expectations imports it
# without Spark Connect's extras. Import great_expectations once with a stand-in __file__, so that
# import fails as in any other process (GX goes on without Spark Connect), then take it away again:
# ``spawn`` children (the consume step's process pool) would try to run it as a script.
import __main__

if getattr(__main__, "__spec__", None) is None and not hasattr(__main__, "__file__"):
    __main__.__file__ = "<pytest-xdist worker>"
    try:
        import great_expectations  # noqa: F401
    finally:
        del __main__.__file__
# py4j logs "closing connection" from finalizers after pytest closed its streams
logging.getLogger("py4j").setLevel(logging.WARNING)

import pytest

from tests.helpers import make_settings
from wavepipe.contracts.config import Settings, load_settings
from wavepipe.local.engine_server import LocalEngine

#: Test files that take longest (real Airflow, many Spark runs), started first so that the two
#: workers of ``make test`` (pytest-xdist, one file per worker at a time) finish close together.
#: Order only: a file missing here runs after these, in the usual order.
LONGEST_FIRST = [  # by their times in a two-worker run
    "test_wheel.py",  # two virtualenvs installed, each with the unit tier and a run through Airflow
    "test_faults.py",
    "test_bad_input.py",
    "test_airflow_ui.py",
    "test_bounded_run.py",
    "test_airflow_kills.py",  # Airflow services killed under three runs
    "test_dag.py",
    "test_rewind.py",
    "test_spark_cluster.py",
    "test_chaos.py",
    "test_object_store.py",
    "test_hosts_apart.py",
    "test_validation.py",
    "test_maintenance.py",
    "test_kafka_cluster.py",
    "test_bench.py",
    "test_backfill.py",
    "test_redelivery.py",
    "test_hostile_waveforms.py",
    "test_operator_input.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def weight(item) -> int:
        return rank.get(item.path.name, len(rank)) if item.path.parent.name == "integration" else len(rank)

    items.sort(key=weight)  # stable: keeps each file's own order


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real Apache Kafka broker (KRaft, one node) on a free loopback port, stopped at the end."""
    from wavepipe.local.kafka import LocalKafka, free_port

    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), "127.0.0.1", free_port(), load_settings().jars_dir)
    broker.up()
    yield broker
    broker.down()


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    """One warm Spark engine (a Spark Connect server in local mode) per test worker: every test's
    runs attach to it, as runs attach to a home's engine (``wavepipe.engine_client``). Its URL carries
    the engine's shared session."""
    from tests.helpers import local_engine

    server = local_engine(tmp_path_factory.mktemp("engine"))
    server.up()
    yield server
    server.down(force=True)


@pytest.fixture
def settings(kafka, engine, tmp_path) -> Settings:
    """Settings for one test: its own home, topic and group on the session's broker, its Spark work
    on the session's engine."""
    return make_settings(tmp_path / "home", kafka, engine)


@pytest.fixture
def own_engine(settings):
    """``settings`` with a Spark engine of the test's own (its home's, started on demand by the
    first run, stopped after the test): for tests that kill the engine."""
    from wavepipe.local.kafka import free_port

    own = settings.replace(spark_remote="", spark_connect_port=free_port())
    yield own
    LocalEngine(own).down(force=True)


@pytest.fixture(scope="session")
def spark(engine):
    """A Spark Connect session on the session's engine, for reading tables back."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(engine.url()).create()
    session.release_session_on_close = False  # the engine's shared session: the runs' too
    yield session
    session.stop()
