"""Levels of relayed log lines: a Spark app's output and librdkafka's log lines."""

from __future__ import annotations

import logging

import pytest

from wavepipe.consumers.kafka_admin import client_config, kafka_log_level
from wavepipe.spark_launch import AppOutput

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR


@pytest.mark.parametrize(
    "line, level, message",
    [
        (
            "26/11/23 09:00:01 WARN NativeCodeLoader: Unable to load native-hadoop library",
            WARNING,
            "NativeCodeLoader: Unable to load native-hadoop library",
        ),
        (
            "26/11/23 09:00:01 INFO SparkContext: Running Spark version 4.2.0",
            INFO,
            "SparkContext: Running Spark version 4.2.0",
        ),
        ("26/11/23 09:00:01 ERROR Executor: Exception in task 0.0", ERROR, "Executor: Exception in task 0.0"),
        ("26/11/23 09:00:01 DEBUG Foo: x", DEBUG, "Foo: x"),
        (
            "2026-11-23 09:00:01,123 WARNING wavepipe.reassemble: 2 incomplete",
            WARNING,
            "wavepipe.reassemble: 2 incomplete",
        ),
        ("2026-11-23 09:00:01,123 INFO wavepipe.reassemble: 24 waveforms", INFO, "wavepipe.reassemble: 24 waveforms"),
        ("ERROR:root:boom", ERROR, "root:boom"),
        (
            "WARNING: Using incubator modules: jdk.incubator.vector",
            WARNING,
            "Using incubator modules: jdk.incubator.vector",
        ),
        ('Setting default log level to "WARN".', INFO, 'Setting default log level to "WARN".'),
        ('{"success": true, "published": true}', INFO, '{"success": true, "published": true}'),
        ("/x/y.py:12: UserWarning: careful", WARNING, "/x/y.py:12: UserWarning: careful"),
        ("INFORMATION about ERROR handling", INFO, "INFORMATION about ERROR handling"),
    ],
)
def test_a_line_has_the_level_its_prefix_states_else_info(line, level, message):
    assert AppOutput().classify(line) == (level, message)


def test_continuation_lines_keep_the_level_of_the_line_they_continue():
    out = AppOutput()
    lines = [
        ("26/11/23 09:00:01 WARN TaskSetManager: Lost task 0.0", WARNING),
        ("java.io.IOException: broken pipe", WARNING),
        ("\tat org.apache.spark.Foo.bar(Foo.scala:1)", WARNING),
        ("Caused by: java.net.SocketException: reset", WARNING),
        ("\t... 12 more", WARNING),
        ("a plain line", INFO),
        ("Traceback (most recent call last):", ERROR),
        ('  File "app.py", line 3, in <module>', ERROR),
        ("    main()", ERROR),
        ("ValueError: boom", ERROR),
        ("", ERROR),
        ("2026-11-23 09:00:01,123 INFO wavepipe.validate: done", INFO),
        ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', ERROR),
        ("\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)", ERROR),
    ]
    assert [out.classify(line)[0] for line, _ in lines] == [level for _, level in lines]


def test_sparks_heartbeat_race_is_a_warning_with_its_stack_and_other_errors_stay_errors():
    # SPARK-59451, seen in a successful DAG run of the test suite (the run's result was right)
    out = AppOutput()
    lines = [
        ("26/11/23 12:35:28 ERROR Utils: Uncaught exception in thread executor-heartbeater", WARNING),
        (
            'java.lang.NullPointerException: Cannot invoke "java.util.concurrent.ConcurrentHashMap.isEmpty()" because '
            'the return value of "org.apache.spark.sql.util.PartitionKeyedAccumulator.byPartition()" is null',
            WARNING,
        ),
        (
            "\tat org.apache.spark.sql.util.PartitionKeyedAccumulator.isZero(PartitionKeyedAccumulator.scala:51)",
            WARNING,
        ),
        ("\tat org.apache.spark.executor.Executor.reportHeartBeat(Executor.scala:1530)", WARNING),
        ("26/11/23 12:35:29 INFO DAGScheduler: Job 3 finished", INFO),
        ("26/11/23 12:35:30 ERROR Utils: Uncaught exception in thread delta-commit", ERROR),
        ("\tat org.apache.spark.Foo.bar(Foo.scala:1)", ERROR),
    ]
    assert [out.classify(line)[0] for line, _ in lines] == [level for _, level in lines]


@pytest.mark.parametrize(
    "level, facility, expected",
    [
        (ERROR, "FAIL", DEBUG),  # connection refused, disconnects: wavepipe says it itself
        (ERROR, "ERROR", DEBUG),  # "1/1 brokers are down"
        (INFO, "BGQUEUE", DEBUG),  # "Purging N unserved events from background queue"
        (WARNING, "GETPID", DEBUG),  # idempotent producer id: coordinator load in progress, retrying
        (WARNING, "CONFWARN", WARNING),  # a property the client ignores: the user's configuration
        (ERROR, "SSL", ERROR),
        (logging.CRITICAL, "FATAL", logging.CRITICAL),
        (INFO, "CONFWARN", DEBUG),  # notice and info: client chatter
        (DEBUG, "PROTOCOL", DEBUG),
    ],
)
def test_librdkafka_levels(level, facility, expected):
    assert kafka_log_level(level, facility) == expected


def test_librdkafka_lines_go_to_python_logging(caplog):
    logger = client_config({"bootstrap.servers": "127.0.0.1:1"})["logger"]
    with caplog.at_level(DEBUG, logger="wavepipe.kafka.client"):
        logger.log(
            ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect to ipv4#127.0.0.1:1 failed: Connection refused"
        )
        logger.log(
            WARNING,
            "%s [%s] %s",
            "CONFWARN",
            "rdkafka#consumer-2",
            "Configuration property acks is a producer property",
        )
    assert [(r.name, r.levelno) for r in caplog.records] == [
        ("wavepipe.kafka.client", DEBUG),
        ("wavepipe.kafka.client", WARNING),
    ]
    assert (
        caplog.records[0].getMessage()
        == "FAIL [rdkafka#producer-1] Connect to ipv4#127.0.0.1:1 failed: Connection refused"
    )
    mine = object()
    assert client_config({"logger": mine})["logger"] is mine  # an explicit logger stays
