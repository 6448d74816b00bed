"""Frozen run plans: the offset ranges a run reads, decided once and stored before any read.

A plan is written atomically to ``<home>/runs/<run_id>/plan.json`` and every retry of that run
reads it back instead of planning again. A group has at most one active (planned, not yet
committed) run, recorded in ``<home>/groups/<group>/active.json``; a second run for the same
group is refused until the first commits or is abandoned.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from wavepipe.config import Settings
from wavepipe.errors import UsageError


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
    #: is a compare-and-set against these.
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
        for name in ("previous", "committed", "lost", "latest", "moved"):
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
        )

    def expected_committed(self, partition: int) -> int | None:
        """Where the group's offset must still be for this run to commit."""
        if partition in self.committed:
            return self.committed[partition]
        return self.range_for(partition).start


class ActiveRunError(RuntimeError):
    """Another run of the same group is planned and not committed yet."""


class StepBusyError(RuntimeError):
    """The same step of the same run is executing in another process right now."""


#: Step locks this process holds, so a step called inside ``run_once`` does not wait on itself.
_held_locks: dict[Path, int] = {}


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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never a part (fsync + rename)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never a part (fsync + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    with path.open() as fh:
        return json.load(fh)


class RunStore:
    """Where a run's durable state lives: plan, per-step results, the group's active marker."""

    def __init__(self, settings: Settings):
        self.settings = settings

    def run_dir(self, run_id: str) -> Path:
        return self.settings.runs_dir / run_id

    def plan_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "plan.json"

    def step_path(self, run_id: str, step: str) -> Path:
        return self.run_dir(run_id) / f"{step}.json"

    def staging_dir(self, run_id: str) -> Path:
        return self.settings.staging_dir / run_id

    def staged_bytes(self, run_id: str) -> int:
        """Bytes of the run's staged chunk and dead-letter files (what its Spark app reads)."""
        staging = self.staging_dir(run_id)
        return sum(f.stat().st_size for kind in ("chunks", "dead_letter") for f in (staging / kind).glob("*.parquet"))

    def candidate_dir(self, run_id: str) -> Path:
        """The run's candidate tables (waveforms, quarantine, dead_letter): written by the
        reassembly, read by validation, published only if it passes; removed with the staging."""
        return self.staging_dir(run_id) / "candidate"

    def group_dir(self, group: str) -> Path:
        return self.settings.groups_dir / safe_run_id(group)

    def active_path(self, group: str) -> Path:
        return self.group_dir(group) / "active.json"

    def load_plan(self, run_id: str) -> RunPlan | None:
        path = self.plan_path(run_id)
        return RunPlan.from_json(read_json(path)) if path.exists() else None

    def save_plan(self, plan: RunPlan) -> None:
        write_json_atomic(self.plan_path(plan.run_id), plan.to_json())

    def active_run(self, group: str) -> str | None:
        path = self.active_path(group)
        return read_json(path)["run_id"] if path.exists() else None

    def claim_group(self, group: str, run_id: str) -> None:
        """Mark ``run_id`` as the group's one active run (atomic create; refused if taken)."""
        path = self.active_path(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".active.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"run_id": run_id, "since": utc_now(), "host": socket.gethostname(), "pid": os.getpid()}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, path)  # fails if the marker exists; readers never see a half-written one
        except FileExistsError:
            holder = self.active_run(group)
            if holder == run_id:
                return
            if holder is not None and self.load_plan(holder) is None:
                claim = self._claim(group)
                raise ActiveRunError(
                    f"run {holder} of group {group!r} is being planned right now (pid {claim.get('pid', '?')} on "
                    f"{claim.get('host', '?')}, since {claim.get('since', '?')}); wait for it to finish planning, "
                    f"or stop it (a planner that is gone is released by the next run)"
                ) from None
            raise ActiveRunError(
                f"run {holder} of group {group!r} is planned but not committed; retry it "
                f"(wavepipe run resumes it) or abandon it (wavepipe abandon --group {group})"
            ) from None
        finally:
            os.unlink(tmp)

    def _claim(self, group: str) -> dict[str, Any]:
        try:
            return read_json(self.active_path(group))
        except (OSError, ValueError):
            return {}

    def claim_is_orphaned(self, group: str) -> bool:
        """Whether the group's claim was made by a process on this host that no longer exists."""
        claim = self._claim(group)
        if claim.get("host") != socket.gethostname() or not isinstance(claim.get("pid"), int):
            return False
        try:
            os.kill(claim["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        import psutil

        try:  # a zombie (exited, not reaped yet) is gone too
            return psutil.Process(claim["pid"]).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def discard_staging(self, run_id: str) -> None:
        """Delete a run's staged copies (after it committed, or was abandoned or refused): the
        records are still in Kafka, and a new run reads them again."""
        import shutil

        shutil.rmtree(self.staging_dir(run_id), ignore_errors=True)

    def claim_age_s(self, group: str) -> float:
        """Seconds since the group's active claim was made (0 when there is none)."""
        path = self.active_path(group)
        if not path.exists():
            return 0.0
        since = datetime.fromisoformat(read_json(path)["since"])
        return (datetime.now(UTC) - since).total_seconds()

    def release_group(self, group: str, run_id: str) -> None:
        if self.active_run(group) == run_id:
            self.active_path(group).unlink()

    def _previous_path(self, group: str, topic: str) -> Path:
        return self.group_dir(group) / f"last-run-{safe_run_id(topic)}.json"

    def previous_ranges(self, group: str, topic: str) -> dict[int, list[int]]:
        """Per partition, ``[safe offset, end]`` of the group's last committed run of ``topic``."""
        path = self._previous_path(group, topic)
        return {int(k): v for k, v in read_json(path).items()} if path.exists() else {}

    def save_previous_ranges(self, group: str, topic: str, ranges: dict[int, list[int]]) -> None:
        write_json_atomic(self._previous_path(group, topic), {str(k): v for k, v in ranges.items()})

    def _idle_path(self, group: str) -> Path:
        return self.group_dir(group) / "idle-runs.json"

    def record_idle_run(self, group: str, run_id: str) -> None:
        """Count an idle run (nothing new to read) in the group's one line of idle history."""
        idle = self.idle_runs(group) or {"count": 0, "first_at": utc_now()}
        idle.update(count=idle["count"] + 1, last_at=utc_now(), last_run_id=run_id)
        write_json_atomic(self._idle_path(group), idle)

    def idle_runs(self, group: str) -> dict[str, Any] | None:
        """``{"count", "first_at", "last_at", "last_run_id"}`` of the idle runs since the group's
        last run that read something (None: none)."""
        path = self._idle_path(group)
        try:
            return read_json(path) if path.exists() else None
        except ValueError:
            return None

    def forget_idle_runs(self, group: str) -> None:
        self._idle_path(group).unlink(missing_ok=True)

    def step_lock(self, run_id: str, name: str):
        """Hold step ``name`` of ``run_id`` exclusively, or raise ``StepBusyError`` at once."""
        return self.lock(self.run_dir(run_id) / f".{name}.lock", f"run {run_id}: '{name}'")

    def is_locked(self, run_id: str, name: str) -> bool:
        """Whether some process holds step ``name`` of ``run_id`` right now."""
        try:
            with self.step_lock(run_id, name):
                return False
        except StepBusyError:
            return True

    @contextmanager
    def lock(self, path: Path, what: str, wait_s: float = 0.0) -> Iterator[None]:
        """Hold the lock file ``path`` exclusively, or raise ``StepBusyError``: at once, or after
        waiting up to ``wait_s`` seconds for its holder (logging who it waits for each minute).

        An OS file lock (``flock``): the kernel drops it when the holder exits, also on SIGKILL,
        so a crashed step never blocks its retry. It serialises processes on one machine or on a
        shared filesystem with working ``flock`` (local disks; not every NFS).
        """
        if path in _held_locks:
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            began = time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    waited = time.monotonic() - began
                    if waited >= wait_s:
                        raise StepBusyError(
                            f"{what} is running in another process right now (pid {holder}); two of them "
                            "must not overlap."
                            + (f" Waited {waited:.0f}s." if wait_s else "")
                            + " Wait for it, or stop it and retry."
                        ) from None
                    if int(waited) % 60 == 0:
                        logging.getLogger(__name__).info("waiting for %s (pid %s) to finish", what, holder)
                    time.sleep(1.0)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            _held_locks[path] = fd
            try:
                yield
            finally:
                del _held_locks[path]
        finally:
            os.close(fd)  # releases the lock

    def save_step(self, run_id: str, step: str, data: dict[str, Any]) -> None:
        write_json_atomic(self.step_path(run_id, step), data)

    def load_step(self, run_id: str, step: str) -> dict[str, Any] | None:
        path = self.step_path(run_id, step)
        return read_json(path) if path.exists() else None

    def clear_step(self, run_id: str, step: str) -> None:
        """Forget a step's result (its inputs are about to change)."""
        self.step_path(run_id, step).unlink(missing_ok=True)
