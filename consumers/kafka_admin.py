"""Offsets as Kafka reports them: topic creation, watermarks, last stable offsets, group commits."""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, TypeVar

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from wavepipe.config import Settings

log = logging.getLogger(__name__)
TIMEOUT_S = 30.0
T = TypeVar("T")


def retrying(call: Callable[[], T], what: str, attempts: int = 20, pause_s: float = 0.5) -> T:
    """``call()``, retried while Kafka reports a quick transient error (a coordinator still
    loading, a leader moving); any other error, or the last attempt's, is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0]
            if attempt == attempts or err.code() not in _TRANSIENT:
                raise
            log.info("%s: %s (attempt %d/%d), retrying", what, err.str(), attempt, attempts)
            time.sleep(pause_s)
    raise AssertionError("unreachable")


class KafkaAuthenticationError(ConnectionError):
    """The cluster refused the client's credentials (``kafka_client_config``)."""


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka_config())


def cluster_metadata(settings: Settings, topic: str | None = None, timeout: float = TIMEOUT_S):
    """The cluster's metadata (of ``topic`` only, if given). A cluster that rejects the client's
    credentials raises ``KafkaAuthenticationError`` at once, naming it (librdkafka reports that
    only to an error callback, and the request itself would wait out ``timeout``); one that does
    not answer raises ``ConnectionError`` after ``timeout``."""
    errors: list[KafkaError] = []
    admin = AdminClient(settings.kafka_config(error_cb=errors.append))
    deadline = time.monotonic() + timeout
    while True:
        try:
            return admin.list_topics(topic, timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback
            refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            if refused:
                raise KafkaAuthenticationError(
                    f"Kafka at {settings.bootstrap_servers} refused the client's credentials: {refused[0].str()}. "
                    "Check kafka_client_config (security.protocol, sasl.mechanism, sasl.username, sasl.password), "
                    "or in Airflow the extra of the connection wavepipe_kafka."
                ) from exc
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"Kafka at {settings.bootstrap_servers} did not answer ({exc.args[0].str()}). Is it running? "
                    "`wavepipe kafka status` / `wavepipe kafka up` for the local broker."
                ) from exc


def group_consumer(settings: Settings, group: str, **extra) -> Consumer:
    """A consumer that never joins the group (assign only) and never commits on its own."""
    return Consumer(settings.kafka_config(**{
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",
        **extra,
    }))


def ensure_topic(settings: Settings, topic: str | None = None, partitions: int | None = None) -> None:
    """Create the topic if it does not exist (idempotent)."""
    topic = topic or settings.topic
    if topic in cluster_metadata(settings).topics:
        return
    admin = admin_client(settings)
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions or settings.partitions,
                                            replication_factor=settings.topic_replication_factor,
                                            config={k: str(v) for k, v in settings.topic_config.items()})])
    try:
        futures[topic].result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise


def partitions_of(settings: Settings, topic: str) -> list[int]:
    info = cluster_metadata(settings, topic).topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise LookupError(f"topic {topic!r} does not exist on {settings.bootstrap_servers}")
    return sorted(info.partitions)


def list_offsets(settings: Settings, topic: str, partitions: Iterable[int], spec: OffsetSpec,
                 isolation: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[int, int]:
    """Per partition, the offset ``spec`` names (earliest, latest = last stable offset, ...)."""
    request = {TopicPartition(topic, p): spec for p in partitions}

    def fetch() -> dict[int, int]:
        admin = admin_client(settings)  # keep it alive until the futures resolve
        futures = admin.list_offsets(request, isolation_level=isolation, request_timeout=TIMEOUT_S)
        return {tp.partition: fut.result(timeout=TIMEOUT_S + 5).offset for tp, fut in futures.items()}

    return retrying(fetch, f"offsets of {topic}")


def committed_offsets(settings: Settings, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
    """The group's committed offset per partition (None where it has none)."""
    return {p: offset for p, (offset, _) in committed_positions(settings, group, topic, partitions).items()}


def committed_positions(settings: Settings, group: str, topic: str,
                        partitions: Iterable[int]) -> dict[int, tuple[int | None, str | None]]:
    """The group's committed offset and its metadata string per partition (None where none)."""
    partitions = list(partitions)

    def fetch() -> dict[int, tuple[int | None, str | None]]:
        consumer = group_consumer(settings, group)
        try:
            result = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=TIMEOUT_S)
        finally:
            consumer.close()
        out: dict[int, tuple[int | None, str | None]] = {}
        for tp in result:
            if tp.error is not None:
                raise KafkaException(tp.error)
            out[tp.partition] = (tp.offset if tp.offset >= 0 else None, tp.metadata or None)
        return out

    return retrying(fetch, f"committed offsets of group {group!r}")


_TRANSIENT = {
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
}
