"""Offsets as Kafka reports them: topic creation, watermarks, last stable offsets, group commits.

Also the one place Kafka clients are made (``new_producer``, ``new_consumer``, ``new_admin``):
librdkafka's own log lines go to Python logging (logger ``wavepipe.kafka.client``) at a level
that says how much they matter, never straight to the terminal; callbacks named by dotted path
are imported by the process making the client; and a cluster that has not
answered this process yet gets ``FIRST_CONTACT_TIMEOUT_S`` to do so (``require_reachable``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import tenacity
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import UnavailableError, UsageError, did_you_mean
from wavepipe.contracts.kafka_callbacks import resolved

log = logging.getLogger(__name__)
TIMEOUT_S = 30.0
#: How long a cluster that has not answered this process yet gets for its first metadata answer:
#: a broker that is down or a mistyped address is one clear error in seconds, not after every
#: request's timeout. Once it has answered, calls wait the full ``TIMEOUT_S`` (a broker restart).
FIRST_CONTACT_TIMEOUT_S = 5.0
T = TypeVar("T")


# --- Kafka clients: one way to make them ---------------------------------------------------------

client_log = logging.getLogger("wavepipe.kafka.client")

#: librdkafka log facilities that are a broker being down, restarting or busy (connect failures,
#: "all brokers are down", retried requests) or housekeeping: wavepipe says what matters of these
#: itself (an unreachable cluster, a reader with no progress), so they stay at DEBUG.
QUIET_FACILITIES = frozenset({"FAIL", "ERROR", "BGQUEUE", "GETPID", "REQTMOUT"})


def kafka_log_level(level: int, facility: str) -> int:
    """The Python logging level of a librdkafka log line, given the level confluent-kafka mapped
    its syslog level to (ERR 40, WARNING 30, NOTICE/INFO 20, DEBUG 10) and its facility: errors
    and warnings keep theirs, client chatter (notice, info) and ``QUIET_FACILITIES`` are DEBUG."""
    if facility in QUIET_FACILITIES or level < logging.WARNING:
        return logging.DEBUG
    return level


class _LibrdkafkaLog:
    """The ``logger`` client property: receives librdkafka's log lines (served by the client's
    poll calls) and logs them to ``client_log`` at ``kafka_log_level``."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        facility = str(args[0]) if args else ""
        client_log.log(kafka_log_level(level, facility), msg, *args)


_LIBRDKAFKA_LOG = _LibrdkafkaLog()


def client_config(config: Mapping[str, Any], **own: Callable[..., Any]) -> dict[str, Any]:
    """``config`` as a client of this process takes it: librdkafka's logs routed to Python
    logging (an explicit ``logger`` stays), callbacks named by dotted path imported, and
    wavepipe's ``own`` callbacks added, called after a user's of the same key
    (``contracts.kafka_callbacks.resolved``)."""
    return {"logger": _LIBRDKAFKA_LOG, **resolved(config, own)}


def new_producer(config: Mapping[str, Any], **own: Callable[..., Any]) -> Producer:
    """A ``Producer`` of ``config`` (``client_config``)."""
    return Producer(client_config(config, **own))


def new_consumer(config: Mapping[str, Any], **own: Callable[..., Any]) -> Consumer:
    """A ``Consumer`` of ``config`` (``client_config``)."""
    return Consumer(client_config(config, **own))


def new_admin(config: Mapping[str, Any], **own: Callable[..., Any]) -> AdminClient:
    """An ``AdminClient`` of ``config`` (``client_config``)."""
    return AdminClient(client_config(config, **own))


def retrying(call: Callable[[], T], what: str, servers: str, attempts: int = 20, pause_s: float = 0.5) -> T:
    """``call()``, retried while Kafka reports a quick transient error (a coordinator still
    loading, a leader moving); no broker of ``servers`` answering is ``KafkaUnreachableError``
    (``answering``); any other error, or the last attempt's, is raised."""

    def transient(exc: BaseException) -> bool:
        return isinstance(exc, KafkaException) and exc.args[0].code() in _TRANSIENT

    def say(state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception().args[0]
        log.info("%s: %s (attempt %d/%d), retrying", what, err.str(), state.attempt_number, attempts)

    with answering(servers, what):
        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(transient),
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_fixed(pause_s),
            before_sleep=say,
            reraise=True,
        )(call)


#: What librdkafka says when no broker answered a request: it timed out, or the connection failed.
_NO_ANSWER = {
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError.REQUEST_TIMED_OUT,
}


@contextlib.contextmanager
def answering(servers: str, what: str) -> Iterator[None]:
    """Kafka's error for ``what`` when no broker of ``servers`` answered it, as
    ``KafkaUnreachableError`` in one line (``unreachable_message``: the servers and how to start
    or point at a cluster); any other error as it is."""
    began = time.monotonic()
    try:
        yield
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or err.code() not in _NO_ANSWER:
            raise
        why = f"{what}: {err.str()}"
        raise KafkaUnreachableError(unreachable_message(servers, why, time.monotonic() - began)) from None


class KafkaAuthenticationError(UnavailableError):
    """The cluster refused the client's credentials (``kafka_client_config``)."""


class KafkaTlsError(UnavailableError):
    """The TLS handshake with the cluster failed (a CA that did not sign the brokers'
    certificates, a client certificate the brokers refuse)."""


class KafkaUnreachableError(UnavailableError):
    """No broker of the bootstrap servers answered: down, or the address is wrong."""


#: Bootstrap servers that answered a metadata request in this process.
_answered: set[str] = set()


def require_reachable(settings: Settings) -> None:
    """Return at once if the cluster answered this process before; else ask it for metadata and
    raise ``KafkaUnreachableError`` (one line: the servers, why, what to do) if no broker answers
    within ``FIRST_CONTACT_TIMEOUT_S``."""
    if settings.bootstrap_servers not in _answered:
        cluster_metadata(settings)


#: This process's admin clients, one per cluster configuration (a client is thread-safe, and a
#: new one takes up to a second to find the partitions' leaders: a run asks several times).
_admins: dict[tuple[int, str], AdminClient] = {}


def admin_client(settings: Settings) -> AdminClient:
    """This process's admin client of ``settings``' cluster, which has answered
    (``require_reachable``); made once per configuration and process (a child process makes its
    own)."""
    require_reachable(settings)
    config = settings.kafka_config()
    key = (os.getpid(), json.dumps(config, sort_keys=True, default=str))
    if key not in _admins:
        _admins[key] = new_admin(config)
    return _admins[key]


def cluster_metadata(settings: Settings, topic: str | None = None, timeout: float = TIMEOUT_S):
    """The cluster's metadata (of ``topic`` only, if given). A cluster that rejects the client's
    credentials raises ``KafkaAuthenticationError`` at once, naming it (librdkafka reports that
    only to an error callback, and the request itself would wait out ``timeout``), a failed TLS
    handshake ``KafkaTlsError`` at once, naming the listener and the certificates; one that does
    not answer raises ``KafkaUnreachableError`` after ``timeout``, or after
    ``FIRST_CONTACT_TIMEOUT_S`` if it never answered this process."""
    errors: list[KafkaError] = []
    admin = new_admin(settings.kafka_config(), error_cb=errors.append)
    if settings.bootstrap_servers not in _answered:
        timeout = min(timeout, FIRST_CONTACT_TIMEOUT_S)
    began = time.monotonic()
    deadline = began + timeout
    while True:
        try:
            meta = admin.list_topics(topic, timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            _answered.add(settings.bootstrap_servers)
            return meta
        except KafkaException as exc:
            admin.poll(0)  # serves the error callback
            refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
            if refused:
                raise KafkaAuthenticationError(
                    f"Kafka at {settings.bootstrap_servers} refused the client's credentials: {refused[0].str()}. "
                    "Check kafka_client_config (security.protocol, sasl.mechanism, sasl.username, sasl.password), "
                    "or in Airflow the extra of the connection wavepipe_kafka."
                ) from exc
            tls = [e for e in errors if _is_tls_failure(e)]
            if tls:
                raise KafkaTlsError(tls_message(settings.kafka_config(), tls[-1].str())) from None
            if time.monotonic() >= deadline:
                raise KafkaUnreachableError(
                    unreachable_message(
                        settings.bootstrap_servers, _why_unreachable(errors, exc), time.monotonic() - began
                    )
                ) from None


#: What librdkafka says of a failed TLS handshake: the brokers' certificate did not verify, or
#: the brokers refused the client's (a TLS alert).
_TLS_FAILURES = ("SSL handshake failed", "certificate verify failed", "alert bad certificate", "SSL alert number")


def _is_tls_failure(err: KafkaError) -> bool:
    return err.code() == KafkaError._SSL or any(text in err.str() for text in _TLS_FAILURES)


def tls_message(config: Mapping[str, Any], said: str) -> str:
    """One line for a failed TLS handshake: the listener (servers, security protocol), the
    certificate the client checked or presented, what librdkafka said and what to do."""
    said = said.split(" (after ", 1)[0].split(": broker certificate could not be verified", 1)[0]
    where = f"Kafka at {config.get('bootstrap.servers')} ({config.get('security.protocol', 'PLAINTEXT')})"
    fix = "(kafka_client_config, or in Airflow the extra of the connection wavepipe_kafka)"
    if "certificate verify failed" in said:
        ca = config.get("ssl.ca.location") or "unset: the system's CAs"
        return (
            f"{where}: the brokers' certificate does not verify against ssl.ca.location ({ca}): {said}. "
            f"Give the CA that signed the brokers' certificates as ssl.ca.location {fix}."
        )
    if "alert" in said:  # the brokers ended the handshake: mutual TLS, and no certificate they trust
        cert = config.get("ssl.certificate.location") or "unset"
        return (
            f"{where}: the brokers refused the client's certificate (ssl.certificate.location: {cert}): {said}. "
            "Give ssl.certificate.location and ssl.key.location of a certificate signed by a CA the brokers "
            f"trust {fix}."
        )
    return (
        f"{where}: the TLS handshake failed: {said}. Check that this listener speaks "
        f"{config.get('security.protocol', 'PLAINTEXT')}, and ssl.ca.location {fix}."
    )


def unreachable_message(servers: str, why: str, seconds: float) -> str:
    """One line for a cluster that did not answer: the servers, why, and what to do."""
    return (
        f"Kafka at {servers} did not answer in {seconds:.0f}s ({why}). Start the local broker with "
        f"`wavepipe kafka up`, or point WAVEPIPE_BOOTSTRAP_SERVERS (setting bootstrap_servers; in "
        f"Airflow the connection wavepipe_kafka) at a running cluster."
    )


def _why_unreachable(errors: list[KafkaError], exc: KafkaException) -> str:
    """The last connection error librdkafka reported (``connection refused``, ``failed to resolve
    'host:port'``), without its broker prefix and timing; else the request's own error."""
    for err in reversed(errors):
        if err.code() in (KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._SSL):
            text = err.str().split(": ", 1)[-1].split(" (after ", 1)[0]
            return text.replace("Connect to ", "connect to ")
    return exc.args[0].str()


def group_consumer(settings: Settings, group: str, **extra) -> Consumer:
    """A consumer that never joins the group (assign only) and never commits on its own, of a
    cluster that has answered (``require_reachable``)."""
    require_reachable(settings)
    return new_consumer(
        settings.kafka_config(
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "error",
                **extra,
            }
        )
    )


#: This process's consumers that only read and commit a group's offsets, one per configuration
#: and group (opening one and finding its coordinator costs a run 50-100 ms each time).
_offset_clients: dict[tuple[int, str, str], Consumer] = {}


def offsets_client(settings: Settings, group: str) -> Consumer:
    """This process's ``group_consumer`` for reading and committing ``group``'s offsets (never
    for reading records); kept open, one per configuration, group and process."""
    config = settings.kafka_config()
    key = (os.getpid(), json.dumps(config, sort_keys=True, default=str), group)
    if key not in _offset_clients:
        _offset_clients[key] = group_consumer(settings, group)
    return _offset_clients[key]


def ensure_topic(settings: Settings, topic: str | None = None, partitions: int | None = None) -> None:
    """Create the topic if it does not exist (idempotent)."""
    topic = topic or settings.topic
    if topic in cluster_metadata(settings).topics:
        return
    admin = admin_client(settings)
    futures = admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=partitions or settings.partitions,
                replication_factor=settings.topic_replication_factor,
                config={k: str(v) for k, v in settings.topic_config.items()},
            )
        ]
    )
    try:
        futures[topic].result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise


class UnknownTopicError(UsageError):
    """The topic does not exist on the cluster (yet: a watcher waits for it)."""


def partitions_of(settings: Settings, topic: str) -> list[int]:
    """The topic's partitions; an unknown topic is an ``UnknownTopicError`` (a ``UsageError``)
    naming the closest topics."""
    info = cluster_metadata(settings, topic).topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        existing = [t for t in cluster_metadata(settings).topics if not t.startswith("__")]
        raise UnknownTopicError(
            f"topic {topic!r} does not exist on {settings.bootstrap_servers}{did_you_mean(topic, existing)}"
        )
    return sorted(info.partitions)


def list_offsets(
    settings: Settings,
    topic: str,
    partitions: Iterable[int],
    spec: OffsetSpec,
    isolation: IsolationLevel = IsolationLevel.READ_COMMITTED,
    admin: AdminClient | None = None,
    timeout_s: float = TIMEOUT_S,
    attempts: int = 20,
) -> dict[int, int]:
    """Per partition, the offset ``spec`` names (earliest, latest = last stable offset, ...);
    ``admin``: a client to ask (one that polls often keeps its own), else a new one. A request
    waits up to ``timeout_s`` (a leader that died is waited for until then) and is made up to
    ``attempts`` times while Kafka answers with a transient error."""
    request = {TopicPartition(topic, p): spec for p in partitions}

    def fetch() -> dict[int, int]:
        client = admin or admin_client(settings)  # keep it alive until the futures resolve
        futures = client.list_offsets(request, isolation_level=isolation, request_timeout=timeout_s)
        return {tp.partition: fut.result(timeout=timeout_s + 5).offset for tp, fut in futures.items()}

    return retrying(fetch, f"offsets of {topic}", settings.bootstrap_servers, attempts=attempts)


def committed_offsets(settings: Settings, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
    """The group's committed offset per partition (None where it has none)."""
    return {p: offset for p, (offset, _) in committed_positions(settings, group, topic, partitions).items()}


def committed_positions(
    settings: Settings, group: str, topic: str, partitions: Iterable[int]
) -> dict[int, tuple[int | None, str | None]]:
    """The group's committed offset and its metadata string per partition (None where none)."""
    partitions = list(partitions)

    def fetch() -> dict[int, tuple[int | None, str | None]]:
        result = offsets_client(settings, group).committed(
            [TopicPartition(topic, p) for p in partitions], timeout=TIMEOUT_S
        )
        out: dict[int, tuple[int | None, str | None]] = {}
        for tp in result:
            if tp.error is not None:
                raise KafkaException(tp.error)
            out[tp.partition] = (tp.offset if tp.offset >= 0 else None, tp.metadata or None)
        return out

    return retrying(fetch, f"committed offsets of group {group!r}", settings.bootstrap_servers)


_TRANSIENT = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
}
