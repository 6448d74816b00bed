"""The lag watcher's measurement against the session's real broker (no Spark, no Airflow): what
``GroupLagTrigger`` decides on. The watcher through the real triggerer and scheduler is in
test_watcher.py."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import TopicPartition

from tests.helpers import produce_in_order, waveform_records
from wavepipe.consumers.kafka_admin import ensure_topic, group_consumer
from wavepipe.consumers.lag import LagProbe, Thresholds, Watch, group_lag

pytestmark = pytest.mark.integration


def test_records_bytes_and_the_oldest_records_age_without_touching_the_group(settings):
    ensure_topic(settings, partitions=2)
    probe = LagProbe(settings, settings.topic, settings.group)
    try:
        empty = probe.measure(oldest=True)
        assert empty.new_group and empty.records == 0 and empty.oldest == {}
        # a new group: no run is started for it unless it has a start
        assert Watch(Thresholds(records=1)).decide(empty, time.time()) == []

        old = datetime.now(UTC) - timedelta(minutes=10)
        records, _ = waveform_records("w-old", n_chunks=3, chunk_size=1000)
        produce_in_order(settings, records, partition=0, when=old)
        produce_in_order(settings, waveform_records("w-new", n_chunks=2, chunk_size=504)[0], partition=1)
        lag = probe.measure(oldest=True)
        assert lag.per_partition() == {0: 3, 1: 2} and lag.records == 5
        size0 = len(records[0][0] or b"") + len(records[0][2])
        assert lag.oldest[0][1] == size0 and lag.bytes_estimate == 3 * size0 + 2 * lag.oldest[1][1]
        now_ms = int(time.time() * 1000)
        assert 590 <= lag.oldest_age_s(now_ms) <= 700
        assert lag.reasons(Thresholds(max_delay_s=300), now_ms) == [
            f"oldest uncommitted record {lag.oldest_age_s(now_ms):.1f} s old >= 300 s"
        ]
        assert lag.reasons(Thresholds(bytes=3 * size0), now_ms)

        # the group commits partition 0 (as a run does): its lag is gone, its oldest record too
        consumer = group_consumer(settings, settings.group)
        try:
            consumer.commit(offsets=[TopicPartition(settings.topic, 0, 3)], asynchronous=False)
        finally:
            consumer.close()
        after = probe.measure(oldest=True)
        assert after.per_partition() == {0: 0, 1: 2} and after.committed == {0: 3, 1: None}
        assert set(after.oldest) == {1} and after.oldest_age_s(int(time.time() * 1000)) < 120
    finally:
        probe.close()
    # measuring never committed or moved anything
    assert group_lag(settings, settings.topic, settings.group).committed == {0: 3, 1: None}


def test_an_unknown_topic_is_an_error_naming_it(settings):
    with pytest.raises(Exception, match=f"topic '{settings.topic}-nope' does not exist"):
        group_lag(settings, f"{settings.topic}-nope", settings.group)


def test_the_watcher_outlives_a_topic_that_is_missing_and_fires_once_records_arrive(settings, monkeypatch):
    """``GroupLagTrigger.run`` as the triggerer drives it: a measurement that fails (the topic does
    not exist yet) is logged and retried; once the topic has records, it fires, naming them."""
    import asyncio
    import logging

    from wavepipe.plugins import triggers

    monkeypatch.setattr(triggers, "MAX_BACKOFF_S", 1.0)  # the retries' pace only
    said: list[str] = []

    class Said(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    trigger = triggers.GroupLagTrigger(
        topic=settings.topic,
        group=settings.group,
        records=1,
        poll_s=0.2,
        new_group_start="earliest",
        settings_overrides={"bootstrap_servers": settings.bootstrap_servers, "home": str(settings.home)},
    )

    async def scenario():
        events = trigger.run()
        first = asyncio.ensure_future(events.__anext__())
        while sum("could not measure the lag" in m for m in said) < 2:
            assert not first.done(), first  # no event, and no end, while the topic is missing
            await asyncio.sleep(0.2)
        await asyncio.to_thread(ensure_topic, settings, partitions=2)
        consumer = await asyncio.to_thread(group_consumer, settings, settings.group)
        await asyncio.to_thread(
            consumer.commit, offsets=[TopicPartition(settings.topic, p, 0) for p in (0, 1)], asynchronous=False
        )
        consumer.close()
        await asyncio.to_thread(produce_in_order, settings, waveform_records("w", n_chunks=2)[0], 1)
        event = await asyncio.wait_for(first, timeout=120)
        await trigger.cleanup()
        await events.aclose()
        return event

    logger = logging.getLogger("wavepipe.plugins.triggers")
    handler = Said(level=logging.INFO)
    logger.addHandler(handler)
    try:
        event = asyncio.run(asyncio.wait_for(scenario(), timeout=240))
    finally:
        logger.removeHandler(handler)
    assert event.payload["topic"] == settings.topic and event.payload["group"] == settings.group
    assert event.payload["lag_records"] == 2 and event.payload["reasons"] == ["lag 2 records >= 1"]
    assert any(f"topic '{settings.topic}' does not exist" in m for m in said), said


def test_waiting_for_records_wakes_when_one_after_the_measured_offsets_arrives(settings):
    import threading

    ensure_topic(settings, partitions=2)
    produce_in_order(settings, waveform_records("w-before", n_chunks=2, chunk_size=100)[0], partition=0)
    probe = LagProbe(settings, settings.topic, settings.group)
    try:
        lag = probe.measure(oldest=False)
        assert lag.end == {0: 2, 1: 0}
        # records before the measured offsets do not wake it: it waits out its timeout
        began = time.monotonic()
        assert probe.wait_for_records(lag.end, 1.0) is False
        assert time.monotonic() - began >= 0.9
        later = threading.Timer(
            0.5,
            produce_in_order,
            (settings, waveform_records("w-after", n_chunks=1, chunk_size=100)[0]),
            {"partition": 1},
        )
        later.start()
        began = time.monotonic()
        assert probe.wait_for_records(lag.end, 60.0) is True
        assert time.monotonic() - began < 30  # woken by the record, long before its timeout
        later.join()
        # after it, the lag is measured again, and a wait after the new offsets sleeps again
        assert probe.measure(oldest=False).end == {0: 2, 1: 1}
        assert probe.wait_for_records({0: 2, 1: 1}, 0.5) is False
    finally:
        probe.close()
