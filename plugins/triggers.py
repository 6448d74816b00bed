"""The event-driven ingest's watcher: a trigger in Airflow's triggerer that measures a consumer
group's lag on its topic and fires an asset event when a threshold is reached.

An ingest DAG scheduled on the asset then runs (``wavepipe_ingest_dag`` with a ``watch_*``
setting). It never reads for the group or commits (``wavepipe.consumers.lag``); the run it starts
plans, reads, validates and commits as any other. Runs never overlap: the DAG has
``max_active_runs=1`` and Airflow keeps one queued run per DAG, however many events arrive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from asgiref.sync import sync_to_async
from confluent_kafka import KafkaException

from wavepipe import waiting
from wavepipe.consumers.kafka_admin import UnknownTopicError
from wavepipe.consumers.lag import LagProbe, Thresholds, Watch
from wavepipe.plugins.hooks import WavepipeHook
from wavepipe.plugins.schedules import WINDOW_KINDS, next_tick

log = logging.getLogger(__name__)
#: The same backlog fires again after this long (the run it started failed, or a waveform still
#: missing chunks holds the commit back).
REFIRE_S = 300.0
#: A line on the watcher's state this often, when nothing fired meanwhile.
STATUS_EVERY_S = 600.0
#: Longest pause between attempts while the broker does not answer.
MAX_BACKOFF_S = 60.0
#: What a measurement raises while the broker is down, restarting or refusing the client
#: (``KafkaUnreachableError``, ``KafkaAuthenticationError`` and ``KafkaTlsError`` are
#: ``ConnectionError``s; the Connection is read again each time), or while the topic does not
#: exist yet: tried again.
MEASURE_ERRORS = (KafkaException, OSError, UnknownTopicError)
STOPPED_HINT = "the watcher measures no more: fix the cause, then restart Airflow's triggerer, which starts it again"


class GroupLagTrigger(BaseEventTrigger):
    """Fires when ``group``'s lag on ``topic`` reaches ``records``, about ``bytes``, or a record
    ``max_delay_s`` old (0 turns one off), measured every ``poll_s``. Kafka comes from the Airflow
    Connection ``wavepipe_conn_id`` when it exists, else from the settings (with
    ``settings_overrides``, the DAG's settings). An unreachable broker or a missing topic
    (``MEASURE_ERRORS``) is logged and retried with a growing pause, for ever; any other error
    (a bad setting, a bug) stops its measurements, logged once with its traceback."""

    def __init__(
        self,
        *,
        topic: str,
        group: str,
        records: int = 0,
        bytes: int = 0,
        max_delay_s: float = 0.0,
        poll_s: float = 2.0,
        new_group_start: str = "",
        settings_overrides: Mapping[str, Any] | None = None,
        wavepipe_conn_id: str = WavepipeHook.default_conn_name,
    ):
        super().__init__()
        self.topic, self.group = topic, group
        self.thresholds = Thresholds(int(records), int(bytes), float(max_delay_s))
        self.poll_s, self.new_group_start = float(poll_s), new_group_start
        self.settings_overrides = dict(settings_overrides or {})
        self.wavepipe_conn_id = wavepipe_conn_id
        self._probe: LagProbe | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "topic": self.topic,
                "group": self.group,
                "records": self.thresholds.records,
                "bytes": self.thresholds.bytes,
                "max_delay_s": self.thresholds.max_delay_s,
                "poll_s": self.poll_s,
                "new_group_start": self.new_group_start,
                "settings_overrides": self.settings_overrides,
                "wavepipe_conn_id": self.wavepipe_conn_id,
            },
        )

    def _open(self) -> LagProbe:
        settings = WavepipeHook(self.wavepipe_conn_id).kafka_settings(**self.settings_overrides)
        return LagProbe(settings, self.topic, self.group)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = Watch(self.thresholds, new_group_start=self.new_group_start, refire_s=REFIRE_S)
        where = f"group {self.group!r} on {self.topic!r}"
        log.info(
            "watching %s every %g s: a run when the lag reaches %s", where, self.poll_s, self.thresholds.describe()
        )
        backoff, said_at, polls = self.poll_s, time.monotonic() - STATUS_EVERY_S, 0  # the first state at once
        while True:
            try:
                # its own threads: Kafka calls that wait must not hold up the triggerer's other triggers
                if self._probe is None:
                    self._probe = await sync_to_async(self._open, thread_sensitive=False)()
                probe = self._probe
                lag = await sync_to_async(probe.measure, thread_sensitive=False)(oldest=self.thresholds.needs_oldest)
            except Exception as exc:
                if not waiting.expected(exc, MEASURE_ERRORS):
                    await self._stop(exc, where)  # returns only by being cancelled
                log.warning("%s: could not measure the lag (%s); trying again in %.0f s", where, exc, backoff)
                await self._close()
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
                continue
            backoff, polls = self.poll_s, polls + 1
            reasons = watch.decide(lag, time.time())
            if reasons:
                log.info("%s: %s; a run is due (lag per partition: %s)", where, "; ".join(reasons), lag.per_partition())
                said_at = time.monotonic()
                yield TriggerEvent(
                    {
                        "topic": self.topic,
                        "group": self.group,
                        "lag_records": lag.records,
                        "reasons": reasons,
                        "end_offsets": {str(p): o for p, o in sorted(lag.end.items())},
                    }
                )
            elif time.monotonic() - said_at >= STATUS_EVERY_S:
                if lag.new_group and not self.new_group_start:
                    log.warning(
                        "%s: the group has no offsets on the topic and new_group_start is not set, so no run is "
                        "started for it (it would be refused); set new_group_start, or commit its offsets",
                        where,
                    )
                else:
                    log.info("%s: lag %d records after %d measurements; no run due", where, lag.records, polls)
                said_at = time.monotonic()
            await self._idle(probe, lag, where)

    async def _idle(self, probe: LagProbe, lag, where: str) -> None:
        """Until a record arrives after what ``lag`` measured (a long poll in a thread of its own),
        at most ``poll_s`` (a record's age grows without one); a group without offsets, or a wait
        the broker fails (``MEASURE_ERRORS``), waits ``poll_s``."""
        if lag.new_group:
            await asyncio.sleep(self.poll_s)
            return
        try:
            await sync_to_async(probe.wait_for_records, thread_sensitive=False)(lag.end, self.poll_s)
        except Exception as exc:
            if not waiting.expected(exc, MEASURE_ERRORS):
                await self._stop(exc, where)  # returns only by being cancelled
            log.warning("%s: could not wait for new records (%s); measuring again in %g s", where, exc, self.poll_s)
            await asyncio.sleep(self.poll_s)

    async def _stop(self, exc: Exception, where: str) -> None:
        """Stop measuring for an error that trying again cannot fix: logged once with its
        traceback, then wait until cancelled (a triggerer restart, a changed watcher). Not raised:
        the triggerer would start a failed watcher again within a second, logging the same error
        every second."""
        waiting.stopped(exc, f"the lag of {where}", STOPPED_HINT)
        await self._close()
        await asyncio.Event().wait()

    async def _close(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            try:
                await sync_to_async(probe.close, thread_sensitive=False)()
            except Exception as exc:  # only describes: a client that will not close must not end the watcher
                log.warning("closing the lag probe of %r: %s", self.group, exc)

    async def cleanup(self) -> None:
        await self._close()


class ClockTrigger(BaseEventTrigger):
    """Fires at each tick of a schedule (``kind``: ``delta`` or ``cron``, ``spec``: that window
    timetable's serialized form): the clock that starts an ingest DAG's incremental runs
    (``schedules``). A tick missed while the triggerer was down is not fired late: the next
    incremental run reads what arrived meanwhile anyway."""

    def __init__(self, *, kind: str, spec: Mapping[str, Any], dag_id: str = ""):
        super().__init__()
        self.kind, self.spec, self.dag_id = kind, dict(spec), dag_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"kind": self.kind, "spec": self.spec, "dag_id": self.dag_id},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:

        windows = WINDOW_KINDS[self.kind].deserialize(self.spec)
        log.info("%s: the clock of the incremental runs: %s", self.dag_id, windows.description or windows.summary)
        tick = datetime.now(UTC)
        while True:
            tick = next_tick(windows, max(tick, datetime.now(UTC)))  # never the same tick twice
            await asyncio.sleep(max(0.0, (tick - datetime.now(UTC)).total_seconds()))
            log.info("%s: tick %s: an incremental run is due", self.dag_id, tick.isoformat())
            yield TriggerEvent({"tick": tick.isoformat()})
