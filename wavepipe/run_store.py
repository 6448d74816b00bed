"""A run's durable state, through the run state (``wavepipe.state``: the home folder, or
``state_uri``): its plan, its step records, its group's claim and history, its staged files. Where
each lives is ``wavepipe.contracts.runfiles``'."""

from __future__ import annotations

import collections
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from wavepipe import state, storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import StepFailedError
from wavepipe.contracts.plan import ActiveRunError, OffsetRange, RunPlan, safe_run_id, utc_now
from wavepipe.contracts.runfiles import Step, json_bytes, json_path, write_json_atomic
from wavepipe.contracts.steps import from_record, to_record
from wavepipe.state import StepBusyError

T = TypeVar("T")


def staged_paths(store: RunStore, run_id: str, rng: OffsetRange) -> tuple[str, str]:
    """Where the range's staged chunks and dead letters are (``digest_path``: its in-order
    waveforms' hashes): a local path or an object's location."""
    return store.staged(run_id, "chunks", rng), store.staged(run_id, "dead_letter", rng)


def digest_path(store: RunStore, run_id: str, rng: OffsetRange) -> str:
    return store.staged(run_id, "digests", rng)


#: Runs whose state reads and writes this process counts (``RunStore.state_io``): the latest ones.
COUNTED_RUNS = 256
_io: collections.OrderedDict[tuple[str, str], collections.Counter] = collections.OrderedDict()
_io_lock = threading.Lock()


#: Failed steps a group's history keeps (``RunStore.record_failure``), and refused runs the home's.
FAILURES_KEPT = 50
#: Runs whose state (``runs/<run_id>/``) is kept, as many as their pages (``pages.PAGES_KEPT``);
#: an older one is removed unless it still holds its group (``RunStore.prune_runs``).
RUNS_KEPT = 200


class RunStore:
    """Where a run's durable state lives: plan, per-step results, the group's active marker.
    Each is a key of ``self.state`` (``wavepipe.state``: the home folder, or ``state_uri``)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        storage.configure(settings)  # this process reaches the run's tables where the settings say
        self.state = state.open_state(settings)

    # --- keys and JSON in the state ------------------------------------------------------------
    @staticmethod
    def _run_key(run_id: str, name: str) -> str:
        return f"runs/{run_id}/{name}"

    @staticmethod
    def _group_key(group: str, name: str) -> str:
        return f"groups/{safe_run_id(group)}/{name}"

    def _count(self, key: str, what: str) -> None:
        """Count a read or write of ``key`` when it is a run's (``runs/<run_id>/...``), per state
        location: two homes may have runs of the same id."""
        if not key.startswith("runs/"):
            return
        run_id, _, name = key[len("runs/") :].partition("/")
        with _io_lock:
            counts = _io.setdefault((self.runs_location, run_id), collections.Counter())
            _io.move_to_end((self.runs_location, run_id))
            counts[what] += 1
            if name == "plan.json":
                counts[f"plan_{what}"] += 1
            while len(_io) > COUNTED_RUNS:
                _io.popitem(last=False)

    def state_io(self, run_id: str) -> dict[str, int]:
        """The reads and writes of run ``run_id``'s state this process made (its plan's apart)."""
        with _io_lock:
            counts = collections.Counter(_io.get((self.runs_location, run_id), {}))
        return {name: counts[name] for name in ("plan_reads", "reads", "writes", "plan_writes")}

    def _get(self, key: str, default: Any = None) -> Any:
        self._count(key, "reads")
        data = self.state.read(key)
        return default if data is None else json.loads(data)

    def _get_or(self, key: str, default: Any) -> Any:
        """As ``_get``, with what is not JSON (left by a killed process) taken as nothing."""
        try:
            return self._get(key, default)
        except ValueError:
            return default

    def _put(self, key: str, data: Any) -> None:
        self._count(key, "writes")
        self.state.write(key, json_bytes(data))

    def where(self, run_id: str, step: str) -> str:
        """Where step ``step``'s record of ``run_id`` is (for messages)."""
        return self.state.where(self._run_key(run_id, f"{step}.json"))

    @property
    def runs_location(self) -> str:
        return self.state.where("runs")

    # --- staging -------------------------------------------------------------------------------
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

    def discard_staging(self, run_id: str) -> None:
        """Delete a run's staged copies (after it committed, or was abandoned or refused): the
        records are still in Kafka, and a new run reads them again."""
        storage.delete_tree(self.staging_dir(run_id))
        self._sweep_spool(run_id)

    def _sweep_spool(self, run_id: str) -> None:
        """Delete what killed readers of this worker left in its spool before an upload: of
        ``run_id``, and of runs that have finished since (resumed by another worker) or whose
        state is gone (``prune_runs``)."""
        spool = self.settings.spool_dir
        for folder in sorted(spool.iterdir()) if spool.is_dir() else []:
            if folder.name == run_id or self._finished_or_pruned(folder.name):
                storage.delete_tree(str(folder))

    def _finished_or_pruned(self, run_id: str) -> bool:
        return self.load_step(run_id, Step.REPORT) is not None or not self.has_plan(run_id)

    # --- the runs kept --------------------------------------------------------------------------
    def prune_runs(self, kept: int = RUNS_KEPT) -> list[str]:
        """Remove the state of every run but the ``kept`` whose state changed last, except a run
        that still holds its group (it failed and waits for its retry or ``abandon``): a committed
        or abandoned run needs it no more. An Airflow run cleared after that plans again, as a
        new run. Returns the run ids that went."""
        runs = self.state.folders("runs")
        older = sorted(runs, key=lambda run_id: (runs[run_id], run_id), reverse=True)[kept:]
        gone = [run_id for run_id in older if not self._holds_its_group(run_id)]
        for run_id in gone:
            self.state.delete_folder(f"runs/{run_id}")
        return gone

    def _holds_its_group(self, run_id: str) -> bool:
        plan = self._get_or(self._run_key(run_id, "plan.json"), None)
        group = plan.get("group") if isinstance(plan, dict) else None
        return isinstance(group, str) and self.active_run(group) == run_id

    # --- plans and the group's claim -----------------------------------------------------------
    def has_plan(self, run_id: str) -> bool:
        self._count(self._run_key(run_id, "plan.json"), "reads")
        return self.state.exists(self._run_key(run_id, "plan.json"))

    def load_plan(self, run_id: str) -> RunPlan | None:
        data = self._get(self._run_key(run_id, "plan.json"))
        return None if data is None else RunPlan.from_json(data)

    def save_plan(self, plan: RunPlan) -> None:
        self._put(self._run_key(plan.run_id, "plan.json"), plan.to_json())

    def _claim(self, group: str) -> dict[str, Any]:
        return self._get_or(self._group_key(group, "active.json"), {})

    def active_run(self, group: str) -> str | None:
        return self._claim(group).get("run_id")

    def claim_group(self, group: str, run_id: str) -> None:
        """Mark ``run_id`` as the group's one active run (a create that one writer wins; refused if taken)."""
        claim = {"run_id": run_id, "since": utc_now(), "host": socket.gethostname(), "pid": os.getpid()}
        if self.state.create(self._group_key(group, "active.json"), json.dumps(claim).encode()):
            return
        claim = self._claim(group)
        holder = claim.get("run_id")
        if holder == run_id:
            return
        if holder is not None and self.load_plan(holder) is None:
            raise ActiveRunError(
                f"run {holder} of group {group!r} is being planned right now (pid {claim.get('pid', '?')} on "
                f"{claim.get('host', '?')}, since {claim.get('since', '?')}); wait for it to finish planning, "
                f"or stop it (a planner that is gone is released by the next run)"
            )
        raise ActiveRunError(
            f"run {holder} of group {group!r} is planned but not committed; retry it "
            f"(wavepipe run resumes it) or abandon it (wavepipe abandon --group {group})"
        )

    def claim_is_orphaned(self, group: str) -> bool:
        """Whether the group's claim was made by a process on this host that no longer exists."""
        claim = self._claim(group)
        return state.process_gone(claim.get("host"), claim.get("pid"))

    def claim_age_s(self, group: str) -> float:
        """Seconds since the group's active claim was made (0 when there is none)."""
        since = self._claim(group).get("since")
        return (datetime.now(UTC) - datetime.fromisoformat(since)).total_seconds() if since else 0.0

    def release_group(self, group: str, run_id: str) -> None:
        if self.active_run(group) == run_id:
            self.state.delete(self._group_key(group, "active.json"))

    # --- the group's history -------------------------------------------------------------------
    def previous_ranges(self, group: str, topic: str) -> dict[int, list[int]]:
        """Per partition, ``[safe offset, end]`` of the group's last committed run of ``topic``."""
        found = self._get(self._group_key(group, f"last-run-{safe_run_id(topic)}.json"), {})
        return {int(k): v for k, v in found.items()}

    def save_previous_ranges(self, group: str, topic: str, ranges: dict[int, list[int]]) -> None:
        self._put(self._group_key(group, f"last-run-{safe_run_id(topic)}.json"), {str(k): v for k, v in ranges.items()})

    def record_idle_run(self, group: str, run_id: str) -> None:
        """Count an idle run (nothing new to read) in the group's one line of idle history."""
        idle = self.idle_runs(group) or {"count": 0, "first_at": utc_now()}
        idle.update(count=idle["count"] + 1, last_at=utc_now(), last_run_id=run_id)
        self._put(self._group_key(group, "idle-runs.json"), idle)

    def idle_runs(self, group: str) -> dict[str, Any] | None:
        """``{"count", "first_at", "last_at", "last_run_id"}`` of the idle runs since the group's
        last run that read something (None: none)."""
        return self._get_or(self._group_key(group, "idle-runs.json"), None)

    def forget_idle_runs(self, group: str) -> None:
        self.state.delete(self._group_key(group, "idle-runs.json"))

    def record_failure(self, group: str, run_id: str, step: str, reason: str) -> None:
        """Note that ``step`` of ``run_id`` failed, with its reason in a line (``wavepipe status``
        lists it); the group's last ``FAILURES_KEPT`` failures are kept."""
        line = json.dumps({"run_id": run_id, "step": step, "reason": reason, "at": utc_now()})
        self.state.append(self._group_key(group, "failed-runs.jsonl"), line, FAILURES_KEPT)

    def failures(self, group: str) -> list[dict[str, Any]]:
        """The group's last ``FAILURES_KEPT`` failed steps, oldest first."""
        return self._lines(self._group_key(group, "failed-runs.jsonl"))

    def record_refusal(self, run_id: str, topic: str | None, group: str | None, reason: str) -> None:
        """Note that ``run_id`` was refused before it read anything (what its user typed can
        never work: a retry would be refused the same way), with the topic and group it asked
        for, which may not exist: kept for the whole home, as a typo names no real group."""
        line = {"run_id": run_id, "topic": topic, "group": group, "reason": reason, "at": utc_now()}
        self.state.append("refused-runs.jsonl", json.dumps(line), FAILURES_KEPT)

    def refusals(self) -> list[dict[str, Any]]:
        """The home's last ``FAILURES_KEPT`` refused runs, oldest first."""
        return self._lines("refused-runs.jsonl")

    def _lines(self, key: str) -> list[dict[str, Any]]:
        found = []
        for line in (self.state.read(key) or b"").decode().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:  # a line cut short by a crash
                continue
        return found[-FAILURES_KEPT:]

    # --- reports and ledgers -------------------------------------------------------------------
    def save_report(self, report: dict) -> None:
        """The run's report: beside its page under ``<home>``, and in the state where other
        workers read it (one file when the state is the home)."""
        write_json_atomic(json_path(self.settings, report["run_id"]), report)
        if not self.in_home(f"reports/{report['run_id']}.json"):
            self._put(f"reports/{report['run_id']}.json", report)
        if report.get("commit") and report.get("group") and report.get("topic"):
            self._put(self._last_committed_key(report["group"], report["topic"]), report)

    def last_committed(self, group: str, topic: str) -> dict | None:
        """The report of the group's last run that committed offsets of ``topic`` (kept in the
        group's state: the reports themselves go with their pages, ``pages.prune``)."""
        return self._get_or(self._last_committed_key(group, topic), None)

    def _last_committed_key(self, group: str, topic: str) -> str:
        return self._group_key(group, f"last-committed-{safe_run_id(topic)}.json")

    def in_home(self, key: str) -> bool:
        """Whether the state's ``key`` is the home's own file of that path (the state is the
        home): what the home has there needs no copy."""
        return self.state.where(key) == str(self.settings.home / key)

    def reports(self) -> list[dict]:
        """Every run's report in the state, oldest first (what is not a report's JSON is skipped)."""
        found = []
        for key, _ in sorted(self.state.listing("reports"), key=lambda entry: entry[1]):
            try:
                report = self._get(key) if key.endswith(".json") else None
            except ValueError:
                continue
            if isinstance(report, dict) and isinstance(report.get("run_id"), str):
                found.append(report)
        return found

    def ledger(self, topic: str) -> dict:
        """The dead letters of ``topic`` published so far (``consumers.committer``)."""
        return self._get(f"dead-letters/{topic}.json", {})

    def save_ledger(self, topic: str, data: dict) -> None:
        self._put(f"dead-letters/{topic}.json", data)

    # --- locks ---------------------------------------------------------------------------------
    def step_lock(self, run_id: str, name: str):
        """Hold step ``name`` of ``run_id`` exclusively, or raise ``StepBusyError`` at once."""
        return self.lock(self._run_key(run_id, f".{name}.lock"), f"run {run_id}: '{name}'")

    def is_locked(self, run_id: str, name: str) -> bool:
        """Whether some process holds step ``name`` of ``run_id`` right now."""
        try:
            with self.step_lock(run_id, name):
                return False
        except StepBusyError:
            return True

    def lock(self, key: str, what: str, wait_s: float = 0.0):
        """Hold the state's lock ``key`` exclusively, or raise ``StepBusyError``: at once, or after
        waiting up to ``wait_s`` seconds (``wavepipe.state``: an OS lock, or a lease)."""
        return self.state.lock(key, what, wait_s)

    # --- step records --------------------------------------------------------------------------
    def save_step(self, run_id: str, step: str, data: dict[str, Any]) -> None:
        """A record kept as JSON as it is (the step timings, the report)."""
        self._put(self._run_key(run_id, f"{step}.json"), data)

    def load_step(self, run_id: str, step: str) -> dict[str, Any] | None:
        return self._get(self._run_key(run_id, f"{step}.json"))

    def save_result(self, run_id: str, step: str, result: Any) -> None:
        """A step's typed result (``wavepipe.contracts.steps``), once the step is done."""
        self._put(self._run_key(run_id, f"{step}.json"), to_record(result))

    def load_result(self, run_id: str, step: str, kind: type[T]) -> T | None:
        """Step ``step``'s result as ``kind``; None before the step is done. A record that is not
        one (written by another wavepipe, or edited) is refused, naming the step to run again."""
        try:
            data = self._get(self._run_key(run_id, f"{step}.json"))
            return None if data is None else from_record(kind, data)
        except ValueError as exc:  # not JSON, or pydantic's ValidationError
            if isinstance(exc, ValidationError):
                problem = exc.errors()[0]
                why = f"{'.'.join(map(str, problem['loc'])) or 'the record'}: {problem['msg']}"
            else:
                why = f"not JSON: {exc}"
            raise StepFailedError(
                f"run {run_id}: {self.where(run_id, step)} is not a {step} record this wavepipe reads ({why}); "
                f"run the run's {step.split('-')[0]} step again"
            ) from None

    def clear_step(self, run_id: str, step: str) -> None:
        """Forget a step's result (its inputs are about to change)."""
        self.state.delete(self._run_key(run_id, f"{step}.json"))


@dataclass(eq=False)
class Run:
    """One run as a value in this process: its plan and its step records. ``Run.load`` reads the
    plan (once per process: each driver loads the run once and passes it through the steps); each
    record is read at most once (``result``, ``raw``) and written by ``record``, which keeps it.
    A record another process writes meanwhile (the consume step's readers) is read again after
    ``forget``."""

    store: RunStore
    plan: RunPlan
    _records: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, settings: Settings, run_id: str) -> Run | None:
        """The run ``run_id`` as its plan and records are now; None when it has no plan."""
        store = RunStore(settings)
        plan = store.load_plan(safe_run_id(run_id))
        return None if plan is None else cls(store, plan)

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    @property
    def settings(self) -> Settings:
        return self.store.settings

    def result(self, step: str, kind: type[T]) -> T | None:
        """Step ``step``'s typed result (``RunStore.load_result``); None before the step is done."""
        if step not in self._records:
            self._records[step] = self.store.load_result(self.run_id, step, kind)
        return self._records[step]

    def raw(self, step: str) -> dict[str, Any] | None:
        """A record kept as JSON as it is (``RunStore.load_step``: the timings, the report)."""
        if step not in self._records:
            self._records[step] = self.store.load_step(self.run_id, step)
        return self._records[step]

    def record(self, step: str, value: Any) -> None:
        """Write step ``step``'s record (a typed result, or a dict kept as it is) and keep it."""
        if isinstance(value, dict):
            self.store.save_step(self.run_id, step, value)
        else:
            self.store.save_result(self.run_id, step, value)
        self._records[step] = value

    def clear(self, *steps: str) -> None:
        """Forget ``steps``' results in the state too: their inputs are about to change."""
        for step in steps:
            self.store.clear_step(self.run_id, step)
            self._records[step] = None

    def forget(self, *steps: str) -> None:
        """Read ``steps``' records again when next asked: another process wrote them."""
        for step in steps:
            self._records.pop(step, None)

    def replan(self, plan: RunPlan) -> None:
        """Save the run's plan as it is now (a transaction version given at its publish)."""
        self.store.save_plan(plan)
        self.plan = plan

    def state_io(self) -> dict[str, int]:
        return self.store.state_io(self.run_id)
