"""Offset rewinds: move a consumer group's committed offsets so the next run re-reads (or skips).

A rewind is planned first (a dry run that changes nothing: per partition, where the group is,
where it would go, and the lag before and after) and applied only on request. The guarantees:

- **Never under a live reader.** Refused while the group has active members (Kafka would refuse
  the commit too) or while wavepipe has a planned, uncommitted run for it (its commit would be
  refused as "moved", and its staged work wasted): abandon the run or let it finish first.
- **Inside what Kafka retains.** A target before the earliest retained offset or past the end
  is refused, naming the retained range; ``force`` clamps it into the range instead.
- **Whole waveforms.** A target inside a waveform moves back to that waveform's first chunk
  (``boundaries.scan_boundaries``), so the next run never sees a waveform without its beginning;
  the output is idempotent, so re-reading a few chunks already written emits nothing twice.
- **Checked against the plan.** Applying re-reads the committed offsets and refuses if they moved
  since the plan (a check just before the commit: Kafka has no compare-and-set for offsets); the
  committed offsets carry ``{"rewind": <audit id>}`` as metadata, so
  ``kafka-consumer-groups --describe`` and the next run's report can tell who put them there.
- **Audited.** Every applied rewind, and every refused attempt to apply one, is appended as one
  JSON line to ``<home>/audit/rewinds.jsonl`` (who, when, why, from/to per partition).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from wavepipe.consumers.boundaries import scan_boundaries
from wavepipe.consumers.kafka_admin import (
    TIMEOUT_S,
    admin_client,
    committed_positions,
    list_offsets,
    partitions_of,
    retrying,
)
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import BUGS, EXIT_USAGE, ConflictError, StepFailedError
from wavepipe.contracts.plan import ActiveRunError, parse_datetime
from wavepipe.run_store import RunStore

log = logging.getLogger(__name__)

MODES = ("earliest", "latest", "offset", "datetime", "shift", "duration")
AUDIT_FILE = "rewinds.jsonl"


class RewindRefused(ConflictError):
    """The rewind must not be applied now (consumers of the group are live, a run of it is in
    flight, the group moved since the plan); the message says why and what to do. ``plan`` is the
    dry-run plan when one could be made (so a refused dry run still shows its table). Nothing
    changed: the CLI exits 2."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, plan: RewindPlan | None = None):
        super().__init__(message)
        self.plan = plan


# --- the target --------------------------------------------------------------------------------

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_ISO_DURATION_RE = re.compile(
    r"P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def parse_duration(text: str) -> timedelta:
    """A positive duration: ``2h``, ``90m``, ``30s``, ``1d``, ``1h30m``, or ISO-8601 ``PT1H30M``/``P1D``."""
    raw = (text or "").strip()
    seconds = None
    if raw[:1].upper() == "P":
        m = _ISO_DURATION_RE.fullmatch(raw)
        if m and any(m.groupdict().values()) and not raw.upper().endswith("T"):
            units = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
            seconds = sum(float(v) * units[k] for k, v in m.groupdict().items() if v)
    elif raw and _DURATION_RE.sub("", raw).strip() == "":
        seconds = sum(float(n) * _DURATION_UNITS[u.lower()] for n, u in _DURATION_RE.findall(raw))
    if seconds is None:
        raise ValueError(
            f"duration {text!r} is not understood: use a number and a unit (30s, 90m, 2h, 1d, "
            f"1h30m) or ISO-8601 (PT1H30M, P1D)"
        )
    if seconds <= 0:
        raise ValueError(f"duration {text!r} must be positive")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class RewindTarget:
    """Where to move: ``mode`` and its ``value`` (an offset, a shift, an instant, a duration)."""

    mode: str
    value: int | datetime | timedelta | None = None

    @classmethod
    def parse(cls, mode: str, value: Any = None) -> RewindTarget:
        """From text (the CLI's and the DAG form's values); ValueError says what is wrong."""
        mode = (mode or "").strip().lower()
        if mode not in MODES:
            raise ValueError(f"rewind mode {mode!r} is not one of {', '.join(MODES)}")
        text = "" if value is None else str(value).strip()
        if mode in ("earliest", "latest"):
            return cls(mode)
        if not text:
            raise ValueError(f"rewind mode {mode!r} needs a value")
        if mode in ("offset", "shift"):
            try:
                number = int(text)
            except ValueError:
                raise ValueError(f"{mode} value {text!r} is not an integer") from None
            if mode == "offset" and number < 0:
                raise ValueError(f"offset {number} is negative: offsets start at 0")
            return cls(mode, number)
        if mode == "datetime":
            return cls(mode, parse_datetime(text))
        return cls(mode, parse_duration(text))

    @classmethod
    def from_args(cls, args) -> RewindTarget:
        """From the ``wavepipe rewind`` arguments (exactly one of the --to-*/--shift-by/--by-* options)."""
        if getattr(args, "to_earliest", False):
            return cls("earliest")
        if getattr(args, "to_latest", False):
            return cls("latest")
        for attr, mode in (
            ("to_offset", "offset"),
            ("to_datetime", "datetime"),
            ("shift_by", "shift"),
            ("by_duration", "duration"),
        ):
            if getattr(args, attr, None) is not None:
                return cls.parse(mode, getattr(args, attr))
        raise ValueError(
            "give one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by, --by-duration"
        )

    @property
    def value_text(self) -> str | None:
        if isinstance(self.value, datetime):
            return self.value.isoformat()
        if isinstance(self.value, timedelta):
            return f"{self.value.total_seconds():g}s"
        return None if self.value is None else str(self.value)

    def describe(self) -> str:
        return self.mode if self.value is None else f"{self.mode} {self.value_text}"


# --- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionRewind:
    partition: int
    committed: int | None  # None: the group has no committed offset here
    earliest: int
    end: int  # last stable offset
    requested: int
    final: int
    snapped_from: int | None = None  # the offset before moving back to a waveform's first chunk
    clamped_from: int | None = None  # the requested offset outside [earliest, end], with force
    out_of_range: bool = False  # requested outside [earliest, end] (refused without force)
    note: str = ""

    @property
    def lag_before(self) -> int:
        """What the next run would read without the rewind (from earliest without a commit)."""
        return self.end - (self.committed if self.committed is not None else self.earliest)

    @property
    def lag_after(self) -> int:
        return self.end - self.final

    @property
    def changed(self) -> bool:
        return self.final != self.committed


@dataclass(frozen=True)
class RewindPlan:
    topic: str
    group: str
    target: RewindTarget
    force: bool
    planned_at: str
    partitions: tuple[PartitionRewind, ...]
    #: The instant asked of offsets-for-times (datetime and duration modes), UTC ISO.
    instant: str | None = None
    #: Why applying it would be refused now (empty: it may be applied).
    refusals: tuple[str, ...] = field(default_factory=tuple)

    @property
    def final_offsets(self) -> dict[int, int]:
        return {p.partition: p.final for p in self.partitions}

    @property
    def committed(self) -> dict[int, int | None]:
        return {p.partition: p.committed for p in self.partitions}


def parse_partitions(text: str | Iterable[int] | None) -> list[int] | None:
    """``"0,2"`` -> [0, 2]; empty or None -> None (all of the topic's)."""
    if text is None:
        return None
    if isinstance(text, str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        try:
            parts = [int(t) for t in items]
        except ValueError:
            raise ValueError(f"partitions {text!r}: give comma-separated partition numbers, e.g. 0,2") from None
    else:
        parts = [int(p) for p in text]
    return sorted(set(parts)) or None


def clamp(requested: int, earliest: int, end: int, *, force: bool) -> tuple[int, bool]:
    """(offset, out_of_range): ``requested`` if it is within [earliest, end]; else clamped into
    the range when ``force``, or left as is (the plan is then refused)."""
    if earliest <= requested <= end:
        return requested, False
    return (min(max(requested, earliest), end) if force else requested), True


def group_members(settings: Settings, group: str) -> tuple[str, list[str]]:
    """(state, members as ``client_id@host``) of the group as the coordinator describes it."""

    def fetch():
        admin = admin_client(settings)
        return admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group].result(timeout=TIMEOUT_S + 5)

    try:
        desc = retrying(fetch, f"describe group {group!r}", settings.bootstrap_servers)
    except KafkaException as exc:
        if exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
            return "DEAD", []
        raise
    state = desc.state.name if isinstance(desc.state, ConsumerGroupState) else str(desc.state)
    return state, [f"{m.client_id}@{m.host.lstrip('/')}" for m in desc.members]


def check_refusals(settings: Settings, group: str, claimed_by: str | None = None) -> list[str]:
    """Why the group's offsets must not be moved now: live members, or an active wavepipe run
    (other than ``claimed_by``: the rewind's own claim while it applies)."""
    reasons = []
    state, members = group_members(settings, group)
    if members or state not in ("EMPTY", "DEAD", "UNKNOWN"):
        who = ", ".join(members) or "none listed"
        reasons.append(
            f"group {group!r} is {state} with {len(members)} active member(s) ({who}): stop those consumers "
            f"first (Kafka refuses to move a live group's offsets), then rewind"
        )
    active = RunStore(settings).active_run(group)
    if active is not None and active != claimed_by:
        reasons.append(
            f"wavepipe run {active} of group {group!r} is planned and not committed: let it finish "
            f"(`wavepipe run` resumes it) or release it with `wavepipe abandon --group {group}`, then rewind"
        )
    return reasons


def _requested(
    target: RewindTarget, committed: int | None, earliest: int, end: int, by_time: dict[int, int] | None, partition: int
) -> int:
    if target.mode == "earliest":
        return earliest
    if target.mode == "latest":
        return end
    if target.mode == "offset":
        return int(target.value)
    if target.mode == "shift":
        return (committed if committed is not None else earliest) + int(target.value)
    found = by_time[partition]
    return end if found < 0 else found  # -1: no record at or after the instant


def plan_rewind(
    settings: Settings,
    *,
    topic: str,
    group: str,
    target: RewindTarget,
    partitions: Iterable[int] | None = None,
    force: bool = False,
    max_scan: int | None = None,
) -> RewindPlan:
    """The rewind as it would be applied now; changes nothing.

    Raises ``RewindRefused`` (with the plan attached, for its table) when it must not be
    applied: live group members, an active wavepipe run, or a target outside what the topic
    retains (without ``force``). ValueError for unknown partitions.
    """
    available = partitions_of(settings, topic)
    selected = available if partitions is None else sorted(set(partitions))
    unknown = [p for p in selected if p not in available]
    if unknown:
        raise ValueError(f"{topic} has no partition(s) {unknown}; its partitions are {available}")
    refusals = check_refusals(settings, group)
    committed = {p: c for p, (c, _) in committed_positions(settings, group, topic, selected).items()}
    earliest = list_offsets(settings, topic, selected, OffsetSpec.earliest())
    end = list_offsets(settings, topic, selected, OffsetSpec.latest())
    instant, by_time = None, None
    if target.mode in ("datetime", "duration"):
        when = target.value if target.mode == "datetime" else datetime.now(UTC) - target.value
        instant = when.isoformat(timespec="milliseconds")
        by_time = list_offsets(settings, topic, selected, OffsetSpec.for_timestamp(int(when.timestamp() * 1000)))
    known = _Known(committed, earliest, end, by_time)
    rows = [_partition_rewind(settings, topic, p, target, known, force, max_scan) for p in selected]
    outside = [
        f"{topic}[{r.partition}] {r.requested} is outside the retained range [{r.earliest}, {r.end}]"
        for r in rows
        if r.out_of_range
    ]
    if outside and not force:
        refusals.append(
            f"{'; '.join(outside)}. Kafka no longer has (or does not yet have) those offsets: pick a target "
            f"inside the range, or add --force (DAG param force) to clamp to it"
        )
    plan = RewindPlan(
        topic=topic,
        group=group,
        target=target,
        force=force,
        planned_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        partitions=tuple(rows),
        instant=instant,
        refusals=tuple(refusals),
    )
    if refusals:
        raise RewindRefused(f"rewind of group {group!r} refused: " + " | ".join(refusals), plan)
    return plan


@dataclass(frozen=True)
class _Known:
    """What Kafka says of the selected partitions when a rewind is planned: the group's committed
    offsets, the earliest retained and the end offsets, and (a time target) the offsets at that time."""

    committed: dict[int, int | None]
    earliest: dict[int, int]
    end: dict[int, int]
    by_time: dict[int, int] | None


def _partition_rewind(
    settings: Settings, topic: str, p: int, target: RewindTarget, known: _Known, force: bool, max_scan: int | None
) -> PartitionRewind:
    """Where partition ``p`` would go: the target's offset, clamped (``force``) or flagged when
    outside what the topic retains, then snapped back to the first chunk of a waveform open there."""
    earliest, end = known.earliest[p], known.end[p]
    requested = _requested(target, known.committed[p], earliest, end, known.by_time, p)
    offset, out_of_range = clamp(requested, earliest, end, force=force)
    notes, snapped_from, final = [], None, offset
    if out_of_range:
        notes.append(f"clamped from {requested}" if force else f"outside retained [{earliest}, {end}]")
    if not out_of_range or force:
        bounds = scan_boundaries(settings, topic, p, offset, low=earliest, high=end, max_scan=max_scan)
        if bounds.first_offset != offset:
            snapped_from, final = offset, bounds.first_offset
            more = " ..." if len(bounds.snapped_for) > 3 else ""
            notes.append(f"snapped from {offset} to the first chunk of {', '.join(bounds.snapped_for[:3])}{more}")
        notes += bounds.notes
    if final == known.committed[p] and not notes:
        notes.append("unchanged")
    return PartitionRewind(
        partition=p,
        committed=known.committed[p],
        earliest=earliest,
        end=end,
        requested=requested,
        final=final,
        snapped_from=snapped_from,
        clamped_from=requested if out_of_range and force else None,
        out_of_range=out_of_range,
        note="; ".join(notes),
    )


# --- applying it --------------------------------------------------------------------------


def new_audit_id() -> str:
    return "rw_" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "_" + uuid.uuid4().hex[:6]


def audit_path(settings: Settings) -> Path:
    return settings.audit_dir / AUDIT_FILE


def append_audit(settings: Settings, record: dict) -> Path:
    """Append one JSON line to the audit file (flushed and fsynced: the record outlives a crash)."""
    path = audit_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return path


def audit_record(
    plan: RewindPlan,
    *,
    audit_id: str,
    who: str,
    reason: str,
    outcome: str,
    message: str | None = None,
    origin: str | None = None,
) -> dict:
    return {
        "id": audit_id,
        "who": who,
        "origin": origin,
        "when": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "outcome": outcome,
        "message": message,
        "group": plan.group,
        "topic": plan.topic,
        "mode": plan.target.mode,
        "value": plan.target.value_text,
        "instant": plan.instant,
        "force": plan.force,
        "reason": reason,
        "planned_at": plan.planned_at,
        "partitions": {
            str(p.partition): {
                "from": p.committed,
                "to": p.final,
                "requested": p.requested,
                "earliest": p.earliest,
                "end": p.end,
                "snapped_from": p.snapped_from,
                "clamped_from": p.clamped_from,
                "note": p.note,
            }
            for p in plan.partitions
        },
    }


def rewind_metadata(audit_id: str) -> str:
    return json.dumps({"rewind": audit_id}, separators=(",", ":"))


def execute_rewind(
    settings: Settings, plan: RewindPlan, *, who: str | None = None, reason: str = "", origin: str | None = None
) -> dict:
    """Apply ``plan``: re-check the refusals, commit the offsets if they are still where the plan saw them, verify, audit.

    Refused (``RewindRefused``, and an audit record with outcome "refused") when the plan was
    refused, the group now has members or an active run, or its committed offsets moved since
    the plan. Returns the audit record of the applied rewind (with ``audit_path``).
    """
    who = who or getpass.getuser()
    audit_id = new_audit_id()

    def refuse(message: str) -> RewindRefused:
        append_audit(
            settings,
            audit_record(
                plan, audit_id=audit_id, who=who, reason=reason, outcome="refused", message=message, origin=origin
            ),
        )
        return RewindRefused(message, plan)

    if plan.refusals:
        raise refuse(f"rewind of group {plan.group!r} refused: " + " | ".join(plan.refusals))
    # Hold the group's run claim while applying: a wavepipe run starting now is refused
    # (ActiveRunError) instead of planning from the offsets this is about to move.
    store, claim = RunStore(settings), f"rewind-{audit_id}"
    try:
        store.claim_group(plan.group, claim)
    except ActiveRunError:
        reasons = check_refusals(settings, plan.group)
        raise refuse(f"rewind of group {plan.group!r} refused: " + " | ".join(reasons)) from None
    try:
        return _apply(
            settings, plan, audit_id=audit_id, claim=claim, who=who, reason=reason, origin=origin, refuse=refuse
        )
    except RewindRefused:
        raise
    except Exception as exc:
        now = committed_positions(settings, plan.group, plan.topic, [p.partition for p in plan.partitions])
        append_audit(
            settings,
            audit_record(
                plan,
                audit_id=audit_id,
                who=who,
                reason=reason,
                outcome="unknown",
                origin=origin,
                message=f"{exc}; committed offsets afterwards: { {p: offset for p, (offset, _) in now.items()} }",
            ),
        )
        if isinstance(exc, BUGS):  # audited as unknown above; a defect is raised as itself
            raise
        raise StepFailedError(
            f"rewind {audit_id} of group {plan.group!r} did not finish ({exc}); "
            "the group may or may not have moved: check `wavepipe status`, then plan the rewind "
            "again"
        ) from exc
    finally:
        store.release_group(plan.group, claim)


def audit_refused(
    settings: Settings, refused: RewindRefused, *, who: str | None = None, reason: str = "", origin: str | None = None
) -> None:
    """Record an attempt to apply a rewind that was refused while planning (when a plan could be
    made), as ``execute_rewind`` records the refusals it finds itself."""
    if refused.plan is None:
        return
    try:
        execute_rewind(settings, refused.plan, who=who, reason=reason, origin=origin)
    except RewindRefused:
        pass


def _apply(
    settings: Settings,
    plan: RewindPlan,
    *,
    audit_id: str,
    claim: str,
    who: str,
    reason: str,
    origin: str | None,
    refuse,
) -> dict:
    """``execute_rewind``'s work while it holds the group's claim."""
    reasons = check_refusals(settings, plan.group, claimed_by=claim)
    if reasons:
        raise refuse(f"rewind of group {plan.group!r} refused: " + " | ".join(reasons))
    partitions = [p.partition for p in plan.partitions]
    now = {p: c for p, (c, _) in committed_positions(settings, plan.group, plan.topic, partitions).items()}
    moved = [
        f"{plan.topic}[{p}] is at {now[p]}, was {plan.committed[p]} when planned"
        for p in partitions
        if now[p] != plan.committed[p]
    ]
    if moved:
        raise refuse(
            f"group {plan.group!r} moved since the rewind was planned ({'; '.join(moved)}): nothing was "
            "changed; plan the rewind again (dry run) and apply that"
        )
    metadata = rewind_metadata(audit_id)
    _alter_offsets(settings, plan, metadata, refuse)
    after = committed_positions(settings, plan.group, plan.topic, partitions)
    wrong = [
        f"{plan.topic}[{p.partition}] is at {after[p.partition][0]}, wanted {p.final}"
        for p in plan.partitions
        if after[p.partition] != (p.final, metadata)
    ]
    record = audit_record(
        plan,
        audit_id=audit_id,
        who=who,
        reason=reason,
        outcome="failed" if wrong else "applied",
        message="; ".join(wrong) or None,
        origin=origin,
    )
    path = append_audit(settings, record)
    if wrong:
        raise ConflictError(
            f"rewind {audit_id}: the committed offsets are not what was set ({'; '.join(wrong)}); "
            f"another client moved the group meanwhile. See {path}; check `wavepipe status` and "
            "plan the rewind again"
        )
    log.info(
        "rewind %s of group %r on %s applied: %s",
        audit_id,
        plan.group,
        plan.topic,
        {p.partition: (p.committed, p.final) for p in plan.partitions},
    )
    return {**record, "audit_path": str(path)}


def _alter_offsets(settings: Settings, plan: RewindPlan, metadata: str, refuse) -> None:
    """Set the group's offsets to the plan's (one admin request); ``refuse`` what Kafka refuses."""
    request = ConsumerGroupTopicPartitions(
        plan.group, [TopicPartition(plan.topic, p.partition, p.final, metadata=metadata) for p in plan.partitions]
    )
    admin = admin_client(settings)
    try:
        result = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[plan.group].result(
            timeout=TIMEOUT_S + 5
        )
    except KafkaException as exc:
        err = exc.args[0]
        raise refuse(
            f"Kafka refused to move group {plan.group!r}: {err.name()} ({err.str()}); if consumers of "
            "the group are running, stop them first, then plan the rewind again"
        ) from exc
    failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result.topic_partitions if tp.error is not None]
    if failed:
        raise refuse(f"Kafka refused to move group {plan.group!r} for {', '.join(failed)}")


# --- presenting it --------------------------------------------------------------------------


def format_plan(plan: RewindPlan) -> str:
    """The plan as a table: where each partition is, where it would go, and the lag either way."""

    def show(v):
        return "-" if v is None else str(v)

    when = f" (at {plan.instant})" if plan.instant else ""
    head = [
        f"rewind of group {plan.group!r} on {plan.topic}: {plan.target.describe()}{when}"
        + (" (force)" if plan.force else "")
    ]
    cols = ("partition", "committed", "requested", "after", "earliest", "end", "lag before -> after", "note")
    rows = [cols] + [
        (
            str(p.partition),
            show(p.committed),
            str(p.requested),
            str(p.final),
            str(p.earliest),
            str(p.end),
            f"{p.lag_before} -> {p.lag_after}",
            p.note,
        )
        for p in plan.partitions
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) - 1)]
    lines = [
        "  "
        + "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=False)))
        + "  "
        + r[-1]
        for r in rows
    ]
    return "\n".join(head + [line.rstrip() for line in lines])


def run_cli(settings: Settings, args) -> int:
    """``wavepipe rewind``: print the plan; apply it with --execute. 0 ok, 2 refused or bad input.
    ``--json``: the plan and what happened to it as one document (``rewind_document``) on stdout."""
    topic = args.topic or settings.topic
    group = args.group or settings.group
    as_json = getattr(args, "json", False)
    say = (lambda _text: None) if as_json else print

    def told(plan, code: int, applied: dict | None = None, refused: str | None = None) -> int:
        if as_json:
            print(
                json.dumps(rewind_document(plan, args.execute, applied, refused), indent=2, sort_keys=True, default=str)
            )
        return code

    try:
        target = RewindTarget.from_args(args)
        partitions = parse_partitions(args.partitions)
        plan = plan_rewind(settings, topic=topic, group=group, target=target, partitions=partitions, force=args.force)
    except ValueError as exc:
        print(f"wavepipe rewind: {exc}", file=sys.stderr)
        return 2
    except RewindRefused as exc:
        if exc.plan is not None:
            say(format_plan(exc.plan))
        if args.execute:
            audit_refused(settings, exc, reason=args.reason)
        print(f"{'refused' if args.execute else 'dry run: would be refused'}: {exc}", file=sys.stderr)
        print("nothing changed", file=sys.stderr)
        return told(exc.plan, 2, refused=str(exc))
    say(format_plan(plan))
    if not args.execute:
        say("dry run: nothing changed; add --execute to apply")
        return told(plan, 0)
    if not args.reason.strip():
        print(
            'wavepipe rewind: --execute needs --reason "..." (kept in the audit record); nothing changed',
            file=sys.stderr,
        )
        return 2
    try:
        done = execute_rewind(settings, plan, reason=args.reason)
    except RewindRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return told(plan, 2, refused=str(exc))
    say(
        f"applied rewind {done['id']}: "
        + ", ".join(f"{plan.topic}[{p}] {part['from']} -> {part['to']}" for p, part in done["partitions"].items())
    )
    say(f"audit: {done['audit_path']}")
    return told(plan, 0, applied=done)


def rewind_document(plan: RewindPlan | None, execute: bool, applied: dict | None, refused: str | None) -> dict:
    """``wavepipe rewind --json``: the plan (None when it could not be made), whether it was to be
    applied, the applied rewind's record (id, partitions from -> to, audit path) or the refusal."""
    return {
        "execute": bool(execute),
        "outcome": "refused" if refused else "applied" if applied else "dry_run",
        "plan": None if plan is None else plan_as_dict(plan),
        "applied": applied,
        "refused": refused,
    }


def plan_as_dict(plan: RewindPlan) -> dict:
    """JSON-able form (for an Airflow XCom or a report)."""
    data = asdict(plan)
    data["target"] = {"mode": plan.target.mode, "value": plan.target.value_text}
    return data
