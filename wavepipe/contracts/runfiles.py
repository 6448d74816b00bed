"""Where a run's files live and how its step records are named: the one place that knows.

Under ``<home>`` (the ``home`` setting):

* ``runs/<run_id>/plan.json``: the frozen plan; ``runs/<run_id>/<step>.json``: each step's record
  (``Step``; the consume, reassemble and validate records are typed in ``wavepipe.contracts.steps``),
  written atomically once the step is done; ``runs/<run_id>/.<name>.lock``: the OS
  locks that keep two processes out of one step.
* ``staging/<run_id>/`` (or ``<staging_uri>/<run_id>/`` on an object store): what the readers
  staged (``chunks/``, ``dead_letter/``, ``digests/``, one Parquet file per offset range) and the
  candidate tables (``candidate/``); removed after commit.
* ``groups/<group>/``: the group's active run (``active.json``), its last ranges and idle runs.
* ``reports/<run_id>.json`` and ``.html``, ``reports/<run_id>/waveforms.png`` and
  ``reports/validation_history.jsonl``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from wavepipe import storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import ActiveRunError, OffsetRange, RunPlan, safe_run_id, utc_now
from wavepipe.contracts.steps import from_record, to_record

T = TypeVar("T")


class Step:
    """The names of a run's step records (``RunStore.save_step``/``load_step``) and step locks."""

    #: the whole run (``run_once``, the plan step and the report take it)
    RUN = "run"
    REASSEMBLE = "reassemble"
    VALIDATE = "validate"
    REPORT = "report"
    #: seconds each step took, added to the report
    TIMINGS = "timings"
    #: the Spark jobs each engine step started, as the engine listed them
    SPARK_JOBS = "spark_jobs"

    @staticmethod
    def consume(rng: OffsetRange) -> str:
        """The record of reading one offset range."""
        return f"consume-{rng.topic}-{rng.partition}"

    @staticmethod
    def consume_lock(partition: int) -> str:
        """The lock one partition's reader holds."""
        return f"consume-{partition}"


class StepBusyError(RuntimeError):
    """The same step of the same run is executing in another process right now."""


#: Step locks this process holds, so a step called inside ``run_once`` does not wait on itself.
_held_locks: dict[Path, int] = {}


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


def read_json_or(path: Path, default: Any) -> Any:
    """``path``'s JSON, or ``default`` where there is none to read: no file, or one that is not
    JSON (state a killed process left behind is as good as none)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return default


def staged_paths(store: RunStore, run_id: str, rng: OffsetRange) -> tuple[str, str]:
    """Where the range's staged chunks and dead letters are (``digest_path``: its in-order
    waveforms' hashes): a local path or an object's location."""
    return store.staged(run_id, "chunks", rng), store.staged(run_id, "dead_letter", rng)


def digest_path(store: RunStore, run_id: str, rng: OffsetRange) -> str:
    return store.staged(run_id, "digests", rng)


def json_path(settings: Settings, run_id: str) -> Path:
    return settings.reports_dir / f"{run_id}.json"


def html_path(settings: Settings, run_id: str) -> Path:
    """The run's page (its JSON twin is ``json_path``)."""
    return settings.reports_dir / f"{run_id}.html"


def plot_path(settings: Settings, run_id: str) -> Path:
    return settings.reports_dir / run_id / "waveforms.png"


def history_path(settings: Settings) -> Path:
    return settings.reports_dir / "validation_history.jsonl"


#: Failed steps a group's history keeps (``RunStore.record_failure``).
FAILURES_KEPT = 50


class RunStore:
    """Where a run's durable state lives: plan, per-step results, the group's active marker."""

    def __init__(self, settings: Settings):
        self.settings = settings
        storage.configure(settings)  # this process reaches the run's tables where the settings say

    def run_dir(self, run_id: str) -> Path:
        return self.settings.runs_dir / run_id

    def plan_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "plan.json"

    def step_path(self, run_id: str, step: str) -> Path:
        return self.run_dir(run_id) / f"{step}.json"

    def staging_dir(self, run_id: str) -> str:
        """The run's staging: a local folder or a prefix on an object store (``staging_uri``)."""
        return storage.join(self.settings.staging_location, run_id)

    def staged(self, run_id: str, kind: str, rng: OffsetRange) -> str:
        """Where range ``rng``'s staged file of ``kind`` (chunks, dead_letter, digests) is."""
        return storage.join(self.staging_dir(run_id), kind, f"{rng.name}.parquet")

    def staged_files(self, run_id: str, kind: str) -> list[str]:
        """The run's staged files of ``kind`` (chunks, dead_letter, digests), sorted by name."""
        return storage.files(storage.join(self.staging_dir(run_id), kind), ".parquet")

    def staged_bytes(self, run_id: str) -> int:
        """Bytes of the run's staged chunk and dead-letter files (what its Spark app reads)."""
        return storage.total_bytes([f for kind in ("chunks", "dead_letter") for f in self.staged_files(run_id, kind)])

    def candidate_dir(self, run_id: str) -> str:
        """The run's candidate tables (waveforms, quarantine, dead_letter): written by the
        reassembly, read by validation, published only if it passes; removed with the staging."""
        return storage.join(self.staging_dir(run_id), "candidate")

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
        return read_json_or(self.active_path(group), {})

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
        storage.delete_tree(self.staging_dir(run_id))
        storage.delete_tree(str(self.settings.spool_dir / run_id))  # what killed readers left before an upload

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

    def _failures_path(self, group: str) -> Path:
        return self.group_dir(group) / "failed-runs.jsonl"

    def record_failure(self, group: str, run_id: str, step: str, reason: str) -> None:
        """Note that ``step`` of ``run_id`` failed, with its reason in a line (``wavepipe status``
        lists it); the group's last ``FAILURES_KEPT`` failures are kept."""
        path = self._failures_path(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"run_id": run_id, "step": step, "reason": reason, "at": utc_now()})
        with path.open("a") as fh:
            fh.write(line + "\n")
        if path.stat().st_size > FAILURES_KEPT * 1000:
            write_text_atomic(path, "".join(f"{json.dumps(f)}\n" for f in self.failures(group)))

    def failures(self, group: str) -> list[dict[str, Any]]:
        """The group's last ``FAILURES_KEPT`` failed steps, oldest first."""
        path = self._failures_path(group)
        if not path.exists():
            return []
        found = []
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:  # a line cut short by a crash
                continue
        return found[-FAILURES_KEPT:]

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
        """A record kept as JSON as it is (the step timings, the report)."""
        write_json_atomic(self.step_path(run_id, step), data)

    def load_step(self, run_id: str, step: str) -> dict[str, Any] | None:
        path = self.step_path(run_id, step)
        return read_json(path) if path.exists() else None

    def save_result(self, run_id: str, step: str, result: Any) -> None:
        """A step's typed result (``wavepipe.contracts.steps``), once the step is done."""
        write_json_atomic(self.step_path(run_id, step), to_record(result))

    def load_result(self, run_id: str, step: str, kind: type[T]) -> T | None:
        """Step ``step``'s result as ``kind``; None before the step is done. A record that is not
        one (written by another wavepipe, or edited) is refused, naming the step to run again."""
        path = self.step_path(run_id, step)
        if not path.exists():
            return None
        try:
            return from_record(kind, read_json(path))
        except ValueError as exc:  # not JSON, or pydantic's ValidationError
            if isinstance(exc, ValidationError):
                problem = exc.errors()[0]
                why = f"{'.'.join(map(str, problem['loc'])) or 'the record'}: {problem['msg']}"
            else:
                why = f"not JSON: {exc}"
            raise RuntimeError(
                f"run {run_id}: {path} is not a {step} record this wavepipe reads ({why}); "
                f"run the run's {step.split('-')[0]} step again"
            ) from None

    def clear_step(self, run_id: str, step: str) -> None:
        """Forget a step's result (its inputs are about to change)."""
        self.step_path(run_id, step).unlink(missing_ok=True)
