"""When an ingest DAG runs: incremental runs on a clock, time windows for backfills.

An incremental run reads whatever arrived since the group's last commit, so no time window is
its own, and it takes no logical date: a clock (an asset whose watcher, ``ClockTrigger``, fires
in the triggerer at each tick of the schedule) starts it. Logical dates belong to window runs
alone, so a backfill finds every past window free of runs unless a window run reprocessed it
before. Each choice of the UI's backfill dialog then means what it says: "Missing Runs" reprocesses
the windows never reprocessed, "Missing and Errored Runs" also those whose window run failed, and
"All Runs" every window again. The history of the incremental runs is never touched.

``BackfillWindows`` is the DAG's timetable: the windows of a data-interval timetable when a
backfill asks for them, and no run of its own (the scheduler asks a wavepipe DAG, which never
catches up, with ``catchup=False``). Airflow finds it through the ``wavepipe`` plugin
(``airflow_plugin.py``), registered by the package's entry point.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk.timezone import coerce_datetime
from airflow.serialization.decoders import decode_timetable
from airflow.serialization.encoders import encode_timetable
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable
from airflow.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable

#: The kinds of window a schedule may give, by the name ``ClockTrigger`` carries.
WINDOW_KINDS: dict[str, type[Timetable]] = {
    "delta": DeltaDataIntervalTimetable,
    "cron": CronDataIntervalTimetable,
}


def windows_of(schedule: Any) -> Timetable | None:
    """The (core) data-interval timetable of ``schedule``: a ``timedelta``, a cron expression or
    preset (``"*/15 * * * *"``, ``"@hourly"``: UTC), or a ``DeltaDataIntervalTimetable`` /
    ``CronDataIntervalTimetable`` (from ``airflow.sdk`` or Airflow's core); None for None."""
    if schedule is None:
        return None
    if isinstance(schedule, timedelta):
        if schedule <= timedelta(0):
            raise ValueError(f"a schedule's period must be positive, got {schedule}")
        return DeltaDataIntervalTimetable(schedule)
    try:
        if isinstance(schedule, str):
            core = CronDataIntervalTimetable(schedule, timezone="UTC")
        else:
            core = schedule if isinstance(schedule, Timetable) else decode_timetable(encode_timetable(schedule))
        core.validate()
    except Exception:  # not a timetable Airflow can encode, or a cron expression it cannot read
        core = None
    if not isinstance(core, tuple(WINDOW_KINDS.values())):
        raise ValueError(
            f"schedule {schedule!r}: give a timedelta, a cron expression, a DeltaDataIntervalTimetable or a "
            "CronDataIntervalTimetable (its intervals are the windows a backfill reprocesses), or None (manual only)"
        )
    return core


def window_kind(windows: Timetable) -> str:
    """The name in ``WINDOW_KINDS`` of ``windows``' class."""
    return next(kind for kind, cls in WINDOW_KINDS.items() if isinstance(windows, cls))


def _period_s(windows: Timetable) -> float | None:
    """The seconds of a fixed period (a timedelta's), else None (cron, months)."""
    delta = getattr(windows, "_delta", None)
    return delta.total_seconds() if isinstance(delta, timedelta) else None


def on_grid(windows: Timetable, when: datetime) -> datetime:
    """``when``, or for a fixed period the first multiple of it since the epoch at or after
    ``when``: the windows of every 15 minutes start at :00, :15, :30 and :45 UTC, as the clock ticks."""
    period = _period_s(windows)
    if period is None:
        return coerce_datetime(when)
    return coerce_datetime(datetime.fromtimestamp(-(-when.timestamp() // period) * period, UTC))


def next_tick(windows: Timetable, now: datetime) -> datetime:
    """The clock's first tick after ``now``: on a fixed period's grid (``on_grid``), or the next
    time a cron schedule names."""
    if _period_s(windows) is not None:
        return on_grid(windows, now + timedelta(microseconds=1))
    info = windows.next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(
            earliest=coerce_datetime(now + timedelta(microseconds=1)), latest=None, catchup=True
        ),
    )
    if info is None or info.data_interval is None:
        raise ValueError(f"{windows.summary}: the schedule names no time after {now.isoformat()}")
    return info.data_interval.start


class BackfillWindows(Timetable):
    """The windows of ``windows`` (a data-interval timetable) for backfills and window runs; no
    scheduled run of its own: wavepipe's incremental runs come from its clock asset."""

    periodic = True  # a backfill may be made of it
    can_be_scheduled = True

    def __init__(self, windows: Timetable):
        self.windows = windows
        self.description = f"backfill windows: {windows.description or windows.summary}"

    @property
    def summary(self) -> str:
        return f"windows of {self.windows.summary}"

    def serialize(self) -> dict[str, Any]:
        encoded = encode_timetable(self.windows)
        return {"windows": {str(getattr(k, "value", k)): v for k, v in encoded.items()}}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> BackfillWindows:
        return cls(decode_timetable(data["windows"]))

    def validate(self) -> None:
        self.windows.validate()

    def infer_manual_data_interval(self, *, run_after) -> DataInterval:
        return self.windows.infer_manual_data_interval(run_after=run_after)

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction: TimeRestriction
    ) -> DagRunInfo | None:
        if not restriction.catchup:  # the scheduler's question: the clock starts the runs
            return None
        if restriction.earliest is not None:
            restriction = restriction._replace(earliest=on_grid(self.windows, restriction.earliest))
        info = self.windows.next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval, restriction=restriction
        )
        if info is None or info.data_interval is None:
            return info
        # a backfill names its run by ``run_after``: the window's start, as its logical date, so
        # backfill__10:45 reprocesses [10:45, 11:00) (a past window may run at once either way)
        return info._replace(run_after=info.data_interval.start)

    def generate_run_id(self, **kwargs: Any) -> str:
        return self.windows.generate_run_id(**kwargs)
