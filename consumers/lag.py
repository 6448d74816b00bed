"""A consumer group's lag on a topic, measured without reading for the group or committing: what
the event-driven watcher (``wavepipe.plugins.triggers.GroupLagTrigger``) decides on.

Per partition the lag is the last stable offset (what a ``read_committed`` run can reach) minus the
group's committed offset, as a run would plan it: a partition the group has no offset for counts
from the earliest retained offset. Each measurement is two small requests to the broker on
clients kept open (the group's committed offsets, the partitions' last stable offsets; the
topic's partitions once a minute); when a byte threshold or a maximum
delay is set and the lag is not zero, the oldest uncommitted record of each lagging partition is
fetched once per committed offset (its timestamp and size; kept until the group commits again).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from wavepipe.consumers.kafka_admin import (
    TIMEOUT_S,
    admin_client,
    group_consumer,
    list_offsets,
    partitions_of,
    retrying,
)
from wavepipe.contracts.config import Settings

log = logging.getLogger(__name__)
#: How long a measurement waits for the oldest uncommitted records before deciding without them.
OLDEST_TIMEOUT_S = 5.0
#: The topic's partitions are asked for again this often.
PARTITIONS_EVERY_S = 60.0
#: After a wait that a new record ended, the lag is measured no sooner than this after the last
#: measurement: records arriving without a pause wake a watcher at most this often.
MIN_MEASURE_INTERVAL_S = 0.1


@dataclass(frozen=True)
class Thresholds:
    """When a group's backlog is worth a run: any threshold reached (0 turns one off)."""

    records: int = 0
    bytes: int = 0
    max_delay_s: float = 0.0

    @classmethod
    def of(cls, settings: Settings) -> Thresholds:
        return cls(settings.watch_records, settings.watch_bytes, settings.watch_max_delay_s)

    @property
    def on(self) -> bool:
        return bool(self.records or self.bytes or self.max_delay_s)

    @property
    def needs_oldest(self) -> bool:
        """Whether a decision needs the oldest uncommitted records (their age, their size)."""
        return bool(self.bytes or self.max_delay_s)

    def describe(self) -> str:
        parts = [
            f"{self.records} records" if self.records else "",
            f"{self.bytes} bytes" if self.bytes else "",
            f"a record {self.max_delay_s:g} s old" if self.max_delay_s else "",
        ]
        return " or ".join(p for p in parts if p) or "nothing (every threshold is 0)"


@dataclass(frozen=True)
class Lag:
    """One measurement. ``committed``: the group's offsets (None: it has none there);
    ``start``: where a run would start (committed, else the earliest retained offset);
    ``end``: the last stable offsets; ``oldest``: per lagging partition, the oldest uncommitted
    record's (timestamp ms, size in bytes) when it was fetched."""

    committed: dict[int, int | None]
    start: dict[int, int]
    end: dict[int, int]
    oldest: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def new_group(self) -> bool:
        return all(offset is None for offset in self.committed.values())

    @property
    def records(self) -> int:
        return sum(max(0, self.end[p] - self.start[p]) for p in self.end)

    def per_partition(self) -> dict[int, int]:
        return {p: max(0, self.end[p] - self.start[p]) for p in self.end}

    @property
    def bytes_estimate(self) -> int | None:
        """Records times the size of each partition's oldest uncommitted record (a waveform's
        chunks are of one size but its last), or None when no size was fetched."""
        if not self.oldest:
            return None
        lagging = self.per_partition()
        return sum(size * lagging[p] for p, (_, size) in self.oldest.items() if p in lagging)

    def oldest_age_s(self, now_ms: int) -> float | None:
        """Seconds since the oldest uncommitted record's timestamp (None: none known)."""
        stamps = [ts for ts, _ in self.oldest.values() if ts > 0]
        return max(0.0, (now_ms - min(stamps)) / 1000.0) if stamps else None

    def reasons(self, thresholds: Thresholds, now_ms: int) -> list[str]:
        """Which thresholds this lag reaches, in words ([] for none)."""
        records = self.records
        if records == 0:
            return []
        out = []
        if thresholds.records and records >= thresholds.records:
            out.append(f"lag {records} records >= {thresholds.records}")
        size = self.bytes_estimate
        if thresholds.bytes and size is not None and size >= thresholds.bytes:
            out.append(f"lag ~{size} bytes >= {thresholds.bytes}")
        age = self.oldest_age_s(now_ms)
        if thresholds.max_delay_s and age is not None and age >= thresholds.max_delay_s:
            out.append(f"oldest uncommitted record {age:.1f} s old >= {thresholds.max_delay_s:g} s")
        return out


class Watch:
    """When to fire: a threshold is reached, and new data arrived since the last firing (the end
    offsets moved); the same backlog fires again only after ``refire_s`` (the run it started
    failed, or a waveform still missing chunks holds the commit back).

    So polling during a run adds an event only for new data, and Airflow keeps one queued run per
    DAG however many events arrive: with ``max_active_runs=1``, one follow-up run after the one in
    flight. A run that a cap cut short asks for its own follow-up from its commit task
    (``CommitOperator``), while it still runs."""

    def __init__(self, thresholds: Thresholds, *, new_group_start: str = "", refire_s: float = 300.0):
        self.thresholds, self.new_group_start, self.refire_s = thresholds, new_group_start, refire_s
        self.fired_end: dict[int, int] | None = None
        self.fired_at = float("-inf")

    def decide(self, lag: Lag, now_s: float) -> list[str]:
        """The reasons to fire now ([] for none); remembers a firing."""
        if lag.new_group:
            # a run refuses a new group without a start, so it fires only when one is set: that
            # run creates the group's offsets (and reads what is there, from an earliest start)
            if not self.new_group_start:
                return []
            reasons = [f"the group has no offsets on the topic yet; a run starts it at {self.new_group_start}"]
        else:
            reasons = lag.reasons(self.thresholds, int(now_s * 1000))
        if not reasons:
            return []
        if lag.end == self.fired_end and now_s - self.fired_at < self.refire_s:
            return []
        self.fired_end, self.fired_at = dict(lag.end), now_s
        return reasons


class LagProbe:
    """Measures a group's lag on a topic, keeping one admin client and one assign-only consumer
    (it never joins the group and never commits) between measurements. Not thread-safe: one
    watcher owns it (``close`` may come from another thread)."""

    def __init__(self, settings: Settings, topic: str, group: str):
        self.settings, self.topic, self.group = settings, topic, group
        self._consumer = None
        self._admin = None
        self._lock = threading.Lock()
        self._partition_list: list[int] | None = None
        self._partitions_at = 0.0
        self._oldest: dict[tuple[int, int], tuple[int, int]] = {}  # (partition, offset) -> (ts ms, bytes)

    def _group_consumer(self):
        if self._consumer is None:
            # small fetches: the oldest record of a partition is all it reads
            self._consumer = group_consumer(
                self.settings,
                self.group,
                **{
                    "fetch.max.bytes": 1024 * 1024,
                    "max.partition.fetch.bytes": 1024 * 1024,
                    "queued.max.messages.kbytes": 1024,
                    "auto.offset.reset": "earliest",  # a start the topic no longer retains
                },
            )
        return self._consumer

    def _partitions(self) -> list[int]:
        """The topic's partitions, asked again every ``PARTITIONS_EVERY_S`` (a topic may grow)."""
        if self._partition_list is None or time.monotonic() - self._partitions_at >= PARTITIONS_EVERY_S:
            self._partition_list, self._partitions_at = partitions_of(self.settings, self.topic), time.monotonic()
        return self._partition_list

    def measure(self, *, oldest: bool) -> Lag:
        with self._lock:  # a close from the trigger's cleanup waits for a measurement in flight
            return self._measure(oldest=oldest)

    def _measure(self, *, oldest: bool) -> Lag:
        """Two requests (the group's committed offsets, the last stable offsets), plus the
        earliest offsets while the group has none somewhere, and the oldest records if asked."""
        partitions = self._partitions()
        consumer = self._group_consumer()
        if self._admin is None:
            self._admin = admin_client(self.settings)
        wanted = [TopicPartition(self.topic, p) for p in partitions]
        result = retrying(
            lambda: consumer.committed(wanted, timeout=TIMEOUT_S),
            f"committed offsets of {self.group!r}",
            self.settings.bootstrap_servers,
        )
        committed = {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in result}
        end = list_offsets(self.settings, self.topic, partitions, OffsetSpec.latest(), admin=self._admin)
        if any(offset is None for offset in committed.values()):
            earliest = list_offsets(self.settings, self.topic, partitions, OffsetSpec.earliest(), admin=self._admin)
        else:
            earliest = {}
        start = {p: committed[p] if committed[p] is not None else earliest[p] for p in partitions}
        lag = Lag(committed, start, end)
        if not oldest or lag.records == 0:
            return lag
        wanted = {p: start[p] for p in partitions if end[p] > start[p]}
        self._oldest = {k: v for k, v in self._oldest.items() if wanted.get(k[0]) == k[1]}
        missing = {p: o for p, o in wanted.items() if (p, o) not in self._oldest}
        if missing:
            self._oldest.update(self._fetch_oldest(missing))
        return Lag(
            committed, start, end, {p: self._oldest[(p, o)] for p, o in wanted.items() if (p, o) in self._oldest}
        )

    def _fetch_oldest(self, starts: dict[int, int]) -> dict[tuple[int, int], tuple[int, int]]:
        """The first readable record at or after each start: (timestamp ms, key + value bytes). A
        start inside an aborted transaction's records reads on to the next committed one."""
        consumer = self._group_consumer()
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])
        found: dict[tuple[int, int], tuple[int, int]] = {}
        done: set[int] = set()
        deadline = time.monotonic() + OLDEST_TIMEOUT_S
        try:
            while len(done) < len(starts) and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is None or message.error() is not None or message.partition() in done:
                    continue
                p = message.partition()
                done.add(p)
                consumer.pause([TopicPartition(self.topic, p)])
                size = len(message.key() or b"") + len(message.value() or b"")
                found[(p, starts[p])] = (message.timestamp()[1], size)
        finally:
            consumer.unassign()
        if len(done) < len(starts):
            log.info(
                "%s: no record read within %.0f s at %s; deciding on the record count",
                self.topic,
                OLDEST_TIMEOUT_S,
                {p: o for p, o in starts.items() if p not in done},
            )
        return found

    def wait_for_records(self, end: dict[int, int], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a record after the offsets ``end`` (a measurement's last
        stable offsets) and say whether one came: a long poll on the assign-only consumer, so a
        watcher wakes when a producer's records become readable, not at its next poll (at most
        every ``MIN_MEASURE_INTERVAL_S``). False also when the wait could not be made (an error is
        logged; the caller measures again after ``timeout_s``)."""
        began = time.monotonic()
        with self._lock:
            consumer = self._group_consumer()
            consumer.assign([TopicPartition(self.topic, p, o) for p, o in end.items()])
            try:
                message = consumer.poll(timeout_s)
            finally:
                consumer.unassign()
        if message is None:
            return False
        if message.error() is not None:
            log.warning("%s: waiting for new records: %s; measuring the lag again", self.topic, message.error())
            time.sleep(timeout_s)  # an error that comes back at once must not turn the wait into a spin
            return False
        time.sleep(max(0.0, MIN_MEASURE_INTERVAL_S - (time.monotonic() - began)))
        return True

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._admin = None  # an AdminClient closes when it is dropped


def group_lag(settings: Settings, topic: str, group: str, *, oldest: bool = False) -> Lag:
    """One measurement of ``group``'s lag on ``topic``, with clients of its own."""
    probe = LagProbe(settings, topic, group)
    try:
        return probe.measure(oldest=oldest)
    finally:
        probe.close()
