"""wavepipe on a real three-node Apache Kafka cluster (KRaft, every node a broker and a controller,
started by ``wavepipe.local.kafka.LocalKafkaCluster``) whose client listener takes SASL/PLAIN only:
every Kafka client wavepipe makes (producer, planner, readers, committer, transactional dead-letter
publisher) must carry ``kafka_client_config``; a wrong password fails at once, naming the
authentication failure; and a ``wavepipe run`` (CLI subprocess, real Spark) still ends with every
waveform once and bit-exact, offsets committed at the planned ends, each dead letter once on its
topic and the accounting balanced, at most one rerun later, when a node is SIGKILLed under it: the
partition leader while its reader pauses mid-range, the transaction coordinator while the commit's
transaction is sending dead letters, and the group coordinator as a plain commit starts. Each test
brings the killed node back and waits until every partition is fully replicated again. The
cluster is this module's own (the session's single broker is not started). Run it alone with
``.venv/bin/pytest tests/integration/test_kafka_cluster.py -v`` (4-6 minutes on two cores, most of
it Spark; twice that when the machine is busy with other work).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from tests.helpers import assert_accounted, output_rows, read_topic, run_cli, start_cli, when_stopped
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, list_offsets
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.config import load_settings
from wavepipe.local.kafka import CONSUMER_GROUPS_TOOL
from wavepipe.run_store import RunStore

pytestmark = pytest.mark.integration

USER, PASSWORD = "wavepipe", "cluster-secret"
CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from wavepipe.local.kafka import LocalKafkaCluster

    nodes = LocalKafkaCluster(
        tmp_path_factory.mktemp("kafka-cluster"),
        3,
        jars_dir=load_settings().jars_dir,
        heap="384m",
        sasl_users={USER: PASSWORD, "admin": "admin-secret"},
        # Small fetch responses (at least one record batch each): with the readers' small
        # prefetch queue below, a reader paused mid-range has not fetched the rest of its range
        # yet, so it really reads it from the new leader after the failover.
        server_config={"fetch.max.bytes": 256 * 1024},
    )
    try:
        nodes.up()
        yield nodes
    finally:
        nodes.down(timeout=15)


@pytest.fixture
def cluster_settings(cluster, engine, tmp_path):
    cluster.up()  # brings back a node an earlier test killed
    tag = uuid.uuid4().hex[:8]
    return load_settings(
        home=tmp_path / "home",
        bootstrap_servers=cluster.bootstrap,
        topic=f"wf-{tag}",
        group=f"grp-{tag}",
        partitions=2,
        max_records_per_partition=0,
        max_bytes_per_partition=0,
        spark_master="local[2]",
        # SASL credentials for every client; queued.min.messages keeps a reader's prefetch to a
        # few records (librdkafka warns that producers ignore it).
        kafka_client_config={**cluster.security_config(USER), "queued.min.messages": 8},
        # record batches of a few chunks; each staged record is flushed at once, so the test sees
        # how far a reader has got
        batch_size=256 * 1024,
        staging_flush_bytes=1,
        reader_stall_timeout_s=60,
        new_group_start="earliest",
        dead_letter_topic=f"dlq-{tag}",
        topic_replication_factor=3,
        topic_config={"min.insync.replicas": "2"},
        spark_remote=engine.url(),
    )


def _create_topics(settings, *specs: tuple[str, int]) -> None:
    """Topics created by wavepipe with three replicas and min.insync.replicas=2 (the settings
    ``topic_replication_factor`` and ``topic_config``), once every partition of them and of Kafka's
    internal topics is fully replicated (a node an earlier test killed has caught up)."""
    for name, partitions in specs:
        ensure_topic(settings, name, partitions)
    admin = AdminClient(settings.kafka_config())
    [configs] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, settings.topic)]).values()
    assert configs.result(timeout=60)["min.insync.replicas"].value == "2"
    internal = [t for t in ("__consumer_offsets", "__transaction_state") if t in admin.list_topics(timeout=30).topics]
    deadline = time.monotonic() + 120
    while not all(_fully_replicated(settings, name) for name in [*internal, *(name for name, _ in specs)]):
        assert time.monotonic() < deadline, "the topics did not get a leader and three in-sync replicas in 120 s"
        time.sleep(0.5)


def _fully_replicated(settings, topic: str) -> bool:
    try:
        return all(p["leader"] is not None and len(p["isr"]) == 3 for p in _describe(settings, topic).values())
    except KafkaException:  # not known to every broker yet
        return False


def _describe(settings, topic: str) -> dict[int, dict]:
    """Per partition: leader id, replica ids and in-sync replica ids, as the cluster reports them."""
    admin = AdminClient(settings.kafka_config())
    [future] = admin.describe_topics(TopicCollection([topic]), request_timeout=30).values()
    return {
        p.id: {
            "leader": p.leader.id if p.leader else None,
            "replicas": [n.id for n in p.replicas],
            "isr": [n.id for n in p.isr],
        }
        for p in future.result(timeout=60).partitions
    }


def test_wrong_password_fails_at_once_naming_the_authentication_failure(cluster_settings):
    settings = cluster_settings.replace(
        kafka_client_config={**cluster_settings.kafka_client_config, "sasl.password": "not-the-password"}
    )
    began = time.monotonic()
    code, out = run_cli(settings, "run", timeout=120)
    seconds = time.monotonic() - began
    assert code == 1, out[-3000:]
    assert "refused the client's credentials" in out and "Invalid username or password" in out, out[-3000:]
    assert "KafkaAuthenticationError" not in out, "no Python class names in what a user reads"
    assert seconds < 25, f"took {seconds:.0f}s: the failure must not wait out the 30 s request timeout"
    assert RunStore(settings).active_run(settings.group) is None, "a refused plan leaves the group free"


def test_partition_leader_killed_mid_range_then_the_run_completes_exactly_once(cluster, cluster_settings, spark):
    settings = cluster_settings
    _create_topics(settings, (settings.topic, 2), (settings.dead_letter_topic, 1))
    sent = produce_demo(settings, count=16, target_bytes=512 * 1024, batch=f"cluster-{settings.topic}")
    junk = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    junk.produce(settings.topic, value=b"not a chunk", key=b"junk", partition=0)  # a dead letter
    assert junk.flush(30) == 0
    ends = list_offsets(settings, settings.topic, [0, 1], OffsetSpec.latest())
    target = max(ends, key=ends.get)  # the partition with the longest range
    assert ends[target] >= 16, ends

    began = time.monotonic()
    run = start_cli(settings, "run", "--run-id", "failover", failpoints="consume.record@6=sleep:10")
    staging = Path(RunStore(settings).staging_dir("failover")) / "chunks"
    # the target partition's reader has staged 5+ records (one row group each) and stopped: it is
    # inside its pause, mid-range
    deadline, size, steady_since = time.monotonic() + 180, -1, time.monotonic()
    while True:
        assert time.monotonic() < deadline and run.poll() is None, "the reader never paused mid-range"
        files = list(staging.glob(f".{settings.topic}-p{target:05d}-*.tmp")) if staging.exists() else []
        now_size = files[0].stat().st_size if files else 0
        if now_size != size:
            size, steady_since = now_size, time.monotonic()
        elif size >= 4 * CHUNK and time.monotonic() - steady_since >= 1.0:
            break
        time.sleep(0.1)
    before = _describe(settings, settings.topic)
    killed = before[target]["leader"]
    assert before[target]["isr"] and len(before[target]["replicas"]) == 3, before
    assert cluster.kill(killed) is not None and cluster.node_pids()[killed] is None

    attempts = _finished(settings, run)
    run_seconds = time.monotonic() - began
    report = _assert_once(spark, settings, "failover", sent, ends, dead_letters=1)
    [dead] = read_topic(settings, settings.dead_letter_topic)  # published in the commit's transaction
    assert dead[0] == b"not a chunk" and dead[1]["wp-dlq-reason"]

    after = _describe(settings, settings.topic)
    assert after[target]["leader"] not in (None, killed), after
    assert all(p["leader"] not in (None, killed) and killed not in p["isr"] for p in after.values()), after
    print(
        f"killed node {killed}, leader of partition {target} ({ends[target]} offsets); leaders now "
        f"{ ({p: d['leader'] for p, d in after.items()}) }; {attempts} attempt(s) in {run_seconds:.0f}s; reads took "
        f"{ ({p: part['read_seconds'] for p, part in report['partitions'].items()}) }s"
    )


def _finished(settings, run, timeout: float = 600) -> int:
    """Wait for ``run`` to end; if it failed, it must say so in a line, and one ``wavepipe run``
    must then complete it. The number of attempts it took."""
    out, _ = run.communicate(timeout=timeout)
    if run.returncode == 0:
        return 1
    assert "wavepipe run failed" in out, out[-3000:]  # a clean failure naming the cause
    code, out = run_cli(settings, "run", timeout=timeout)
    assert code == 0, out[-3000:]
    return 2


def _assert_once(spark, settings, run_id: str, sent, ends: dict[int, int], dead_letters: int) -> dict:
    """Run ``run_id`` committed every waveform once and bit-exact, its offsets at the planned
    ``ends`` (as Kafka reports the group's) and ``dead_letters`` once on their topic; its report."""
    report = json.loads((settings.reports_dir / f"{run_id}.json").read_text())
    assert report["status"] == "committed", report["status"]
    assert_accounted(spark, settings, report)
    assert report["waveforms"] == {"output_new": len(sent)}
    assert report["totals"]["dead_letter"] == dead_letters
    rows = output_rows(spark, settings)
    assert {r[0]: r[1] for r in rows} == {s.waveform_id: s.checksum for s in sent}, "each waveform exactly once"
    assert all(r[1] == r[2] for r in rows), "payloads must be bit-exact"
    assert {int(p): part["end"] for p, part in report["partitions"].items()} == ends
    assert committed_offsets(settings, settings.group, settings.topic, sorted(ends)) == ends
    if settings.dead_letter_topic:
        on_topic = read_topic(settings, settings.dead_letter_topic)  # committed records only
        origins = [dict(headers)["wp-dlq-origin"] for _, headers in on_topic]
        assert len(origins) == len(set(origins)) == dead_letters, (
            f"{len(origins)} dead letters, {len(set(origins))} origins"
        )
    return report


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` of an ASCII ``text``, as a signed 32-bit integer."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _coordinator(settings, internal_topic: str, key: str) -> int:
    """The node that coordinates ``key`` (a group id or transactional id): the leader of its
    partition of ``internal_topic`` (Kafka's ``Utils.abs(key.hashCode()) % partitions``)."""
    partitions = _describe(settings, internal_topic)
    h = _java_hash(key)
    return partitions[(0 if h == -(1 << 31) else abs(h)) % len(partitions)]["leader"]


TRANSACTIONS_TOOL = "org.apache.kafka.tools.TransactionsCommand"


def _tool_coordinator(cluster, settings, tmp_path, main_class: str, *args: str) -> int:
    """The coordinator id Kafka's own tool reports (``CoordinatorId`` of a transaction, the
    ``COORDINATOR (ID)`` of a group), over the SASL listener."""
    config = tmp_path / "tool.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config="
        f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{USER}" password="{PASSWORD}";\n'
    )
    node = next(n for n in cluster.nodes.values() if n.pid() is not None)
    said = node.tool(
        main_class, "--bootstrap-server", settings.bootstrap_servers, "--command-config", str(config), *args
    )
    assert said.returncode == 0, said.stderr[-2000:]
    lines = [line.split() for line in said.stdout.splitlines() if line.strip()]
    if main_class == TRANSACTIONS_TOOL:  # a header row, then the transaction's row
        return int(lines[1][lines[0].index("CoordinatorId")])
    [row] = [line for line in said.stdout.splitlines() if settings.group in line]
    return int(row.split("(")[1].split(")")[0])  # "host:port (id)"


def _produce_with_junk(settings, count: int, junk: int, junk_bytes: int = 0):
    """``count`` demo waveforms over both partitions, then ``junk`` records that are not chunks
    (dead letters) of ``junk_bytes`` each on partition 0; what was sent, and the partitions' ends."""
    sent = produce_demo(settings, count=count, target_bytes=256 * 1024, batch=f"cluster-{settings.topic}")
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    for i in range(junk):
        producer.produce(settings.topic, value=b"not a chunk".ljust(junk_bytes, b"."), key=b"junk%d" % i, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    return sent, list_offsets(settings, settings.topic, [0, 1], OffsetSpec.latest())


def test_transaction_coordinator_killed_mid_transaction_then_each_dead_letter_is_on_its_topic_once(
    cluster, cluster_settings, spark, tmp_path
):
    """The run commits 60 dead letters of 256 KiB with its offsets in one transaction; once the
    first of them is on the dead-letter topic (uncommitted) and before the last is, the node that
    coordinates the transaction is SIGKILLed. The transaction completes on the new coordinator,
    or is aborted and one rerun commits it: either way each dead letter is on the topic once."""
    settings, junk = cluster_settings, 60
    _create_topics(settings, (settings.topic, 2), (settings.dead_letter_topic, 1))
    sent, ends = _produce_with_junk(settings, 6, junk, junk_bytes=256 * 1024)
    run = start_cli(settings, "run", "--run-id", "txn", failpoints="commit.before_offsets=stop")
    frozen = when_stopped(run)
    # Kafka makes its transaction state topic at the first transaction: made now, and whole
    Producer(settings.kafka_config(**{"transactional.id": f"first-{settings.group}"})).init_transactions(60)
    _create_topics(settings)
    coordinator = _coordinator(settings, "__transaction_state", f"wavepipe-commit-{settings.group}")

    frozen.resume()
    began, seen = time.monotonic(), 0
    while seen == 0:  # the transaction is open once a dead letter is on the topic, uncommitted
        assert time.monotonic() - began < 120 and run.poll() is None, "no dead letter was sent"
        [seen] = _uncommitted_end(settings).values()
        time.sleep(0.02)
    assert cluster.kill(coordinator) is not None
    killed_at = time.monotonic()
    assert seen < junk, f"all {seen} dead letters were sent before the kill: not mid-transaction"
    attempts = _finished(settings, run)
    recovery = time.monotonic() - killed_at

    _assert_once(spark, settings, "txn", sent, ends, dead_letters=junk)
    tid = f"wavepipe-commit-{settings.group}"
    now = _coordinator(settings, "__transaction_state", tid)
    assert now not in (None, coordinator), now
    # the coordinator computed as Kafka does is the one Kafka's own tool reports
    assert (
        _tool_coordinator(cluster, settings, tmp_path, TRANSACTIONS_TOOL, "describe", "--transactional-id", tid) == now
    )
    print(
        f"killed node {coordinator} (transaction coordinator) after {seen} of {junk} dead letters; "
        f"{attempts} attempt(s), {recovery:.1f}s from the kill to the commit"
    )


def _uncommitted_end(settings) -> dict[int, int]:
    return list_offsets(
        settings, settings.dead_letter_topic, [0], OffsetSpec.latest(), isolation=IsolationLevel.READ_UNCOMMITTED
    )


def test_group_coordinator_killed_as_the_commit_starts_then_the_offsets_are_committed_once(
    cluster, cluster_settings, spark, tmp_path
):
    """A plain commit (no dead-letter topic): the run is frozen just before it commits its offsets,
    the node that coordinates its group is SIGKILLed, and the run goes on: the commit finds the new
    coordinator, or fails in one line and one rerun commits."""
    settings = cluster_settings.replace(dead_letter_topic="")
    _create_topics(settings, (settings.topic, 2))
    sent, ends = _produce_with_junk(settings, 8, 0)
    run = start_cli(settings, "run", "--run-id", "group", failpoints="commit.before_offsets=stop")
    frozen = when_stopped(run)
    coordinator = _coordinator(settings, "__consumer_offsets", settings.group)

    assert cluster.kill(coordinator) is not None
    killed_at = time.monotonic()
    frozen.resume()
    attempts = _finished(settings, run)
    recovery = time.monotonic() - killed_at

    _assert_once(spark, settings, "group", sent, ends, dead_letters=0)
    now = _coordinator(settings, "__consumer_offsets", settings.group)
    assert now not in (None, coordinator), now
    described = ("--describe", "--group", settings.group, "--state")
    assert _tool_coordinator(cluster, settings, tmp_path, CONSUMER_GROUPS_TOOL, *described) == now
    print(
        f"killed node {coordinator} (group coordinator) as the commit started; "
        f"{attempts} attempt(s), {recovery:.1f}s from the kill to the commit"
    )
