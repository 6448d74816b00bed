"""Frozen run plans: the offset ranges a run reads, decided once and stored before any read.

A plan is written atomically to ``<home>/runs/<run_id>/plan.json`` and every retry of that run
reads it back instead of planning again. A group has at most one active (planned, not yet
committed) run, recorded in ``<home>/groups/<group>/active.json``; a second run for the same
group is refused until the first commits or is abandoned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

from wavepipe.contracts.errors import ConflictError, UsageError


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition; ``end`` is exclusive."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    @property
    def name(self) -> str:
        """File-safe name of the range, used for staged files so a retry overwrites them."""
        return f"{self.topic}-p{self.partition:05d}-{self.start:020d}-{self.end:020d}"


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    topic: str
    group: str
    created_at: str
    ranges: tuple[OffsetRange, ...]
    #: The previous committed run of this group, per partition: ``[safe offset, end]``. A range
    #: equal to it holds nothing that run did not see already (only still-pending chunks).
    previous: dict[int, list[int]] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)
    #: The group's committed offset per partition when planned (None: it had none). The commit
    #: is refused if the group is elsewhere just before it (``consumers/committer.py``).
    committed: dict[int, int | None] = field(default_factory=dict)
    #: Per partition, ``[from, to)`` offsets the topic no longer retained when planned, skipped
    #: on request (``skip_lost_offsets``): never read, recorded in the report.
    lost: dict[int, list[int]] = field(default_factory=dict)
    #: Per partition, the last stable offset when planned (before any cap): the lag before the
    #: run is ``latest - start``.
    latest: dict[int, int] = field(default_factory=dict)
    #: A time-window run (a backfill): ``{"start": iso, "end": iso, "offsets": {partition: [from, to)}}``.
    #: The waveforms whose first chunk (``wp-seq`` 0) is in ``offsets`` are the window's; the ranges
    #: read may go past ``to`` to complete the ones that straddle the window's end. Its output
    #: replaces the window's rows, and it commits no offsets. None: an incremental run.
    window: dict[str, Any] | None = None
    #: The group had no committed offsets on the topic and started here by choice (``earliest``,
    #: ``latest`` or an ISO instant); None for a group that had offsets. Its commit creates them.
    new_group_start: str | None = None
    #: Per partition, a move of the group's offset by someone else since this home's last commit:
    #: ``{"from", "to", "by", "skipped": [a, b) | None, "reread": [a, b) | None}``.
    moved: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: The ``txnVersion`` of this run's commits to the published tables (``wavepipe.delta_txn``):
    #: one above the group's last, frozen here so every retry of the run commits the same one.
    txn_version: int | None = None
    #: Per partition, the run id in the group's committed offset's metadata when planned (None:
    #: no offset, or not a wavepipe run's). With ``committed``, it says where the group stood.
    committed_by: dict[int, str | None] = field(default_factory=dict)
    #: A run whose publish is in the tables' Delta log but whose Kafka commit never happened (a
    #: crash between the two, then its home's record of it was lost): ``{"run_id",
    #: "table_version", "offsets": {partition: [from, to]}}``. This run starts where that one's
    #: safe offsets are, and its commit moves the group there too (``delta_txn.lost_commit``).
    recovered: dict[str, Any] | None = None

    @classmethod
    def new(cls, run_id: str, topic: str, group: str, ranges: Iterable[OffsetRange], **facts: Any) -> RunPlan:
        """A plan made now (``created_at``), its ranges frozen; ``facts``: the other fields."""
        return cls(run_id=run_id, topic=topic, group=group, created_at=utc_now(), ranges=tuple(ranges), **facts)

    @property
    def is_window(self) -> bool:
        return self.window is not None

    def window_offsets(self) -> dict[int, tuple[int, int]]:
        """Per partition, the window's ``[from, to)`` offsets (empty for an incremental run)."""
        return {int(p): (int(a), int(b)) for p, (a, b) in (self.window or {}).get("offsets", {}).items()}

    @property
    def total_offsets(self) -> int:
        return sum(r.size for r in self.ranges)

    @property
    def has_new_data(self) -> bool:
        """False when every range repeats the previous run's (from its safe offset to its end):
        nothing new can complete. A rewind or new records make it True."""
        return any(r.size and [r.start, r.end] != self.previous.get(r.partition) for r in self.ranges)

    def range_for(self, partition: int) -> OffsetRange:
        for r in self.ranges:
            if r.partition == partition:
                return r
        raise KeyError(f"partition {partition} is not in plan {self.run_id}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("previous", "committed", "lost", "latest", "moved", "committed_by"):
            data[name] = {str(k): v for k, v in getattr(self, name).items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunPlan:
        return cls(
            run_id=data["run_id"],
            topic=data["topic"],
            group=data["group"],
            created_at=data["created_at"],
            ranges=tuple(OffsetRange(**r) for r in data["ranges"]),
            previous={int(k): list(v) for k, v in data.get("previous", {}).items()},
            caps=dict(data.get("caps", {})),
            committed={int(k): v for k, v in data.get("committed", {}).items()},
            lost={int(k): list(v) for k, v in data.get("lost", {}).items()},
            latest={int(k): int(v) for k, v in data.get("latest", {}).items()},
            window=data.get("window"),
            new_group_start=data.get("new_group_start"),
            moved={int(k): dict(v) for k, v in data.get("moved", {}).items()},
            txn_version=data.get("txn_version"),
            committed_by={int(k): v for k, v in data.get("committed_by", {}).items()},
            recovered=data.get("recovered"),
        )

    def expected_committed(self, partition: int) -> int | None:
        """Where the group's offset must still be for this run to commit."""
        if partition in self.committed:
            return self.committed[partition]
        return self.range_for(partition).start


class RunRequest(TypedDict, total=False):
    """What one run is asked to read (``wavepipe run``'s options, a DAG run's params); a field left
    out is the settings' value (``topic``, ``group``, ``new_group_start``) or none (the caps, the
    window)."""

    topic: str | None
    group: str | None
    #: caps on the records new to this run, per partition
    max_records: int | None
    max_bytes: int | None
    #: go on from the earliest retained offsets when the group is behind retention
    skip_lost_offsets: bool
    #: (start, end): a backfill of that time window instead of an incremental run
    window: tuple[datetime, datetime] | None
    new_group_start: str | None


def run_request(fields: dict[str, Any]) -> RunRequest:
    """``fields`` as a ``RunRequest``; a name it does not have is a ``TypeError`` naming it (a typo
    must not drop an option silently)."""
    unknown = sorted(set(fields) - set(RunRequest.__annotations__))
    if unknown:
        raise TypeError(f"unknown run option(s) {unknown}; a run takes {sorted(RunRequest.__annotations__)}")
    return RunRequest(**fields)


class ActiveRunError(ConflictError):
    """Another run of the same group is planned and not committed yet."""


def safe_run_id(raw: str) -> str:
    """A run id usable as a folder name (Airflow run ids contain ':' and '+')."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._")
    if not cleaned:
        raise ValueError(f"run id {raw!r} has no usable characters")
    return cleaned


def new_run_id() -> str:
    return "run_" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def as_utc(when: datetime) -> datetime:
    """``when`` as an aware UTC datetime (naive ones are taken as UTC)."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def parse_datetime(text: str) -> datetime:
    """An ISO-8601 instant (``2026-11-02T08:30:00Z``, ``...+01:00``, ``2026-11-02``); naive is UTC."""
    raw = (text or "").strip()
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"datetime {text!r} is not ISO-8601: use e.g. 2026-11-02T08:30:00Z or "
            f"2026-11-02T09:30:00+01:00 (no zone means UTC)"
        ) from None
    return as_utc(value)
