"""Planning: decide a run's offset ranges once, store them, and hand the same plan to retries."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Unpack

from confluent_kafka.admin import OffsetSpec

from wavepipe import delta_txn, storage
from wavepipe.consumers.boundaries import scan_boundaries
from wavepipe.consumers.committer import committed_run_id, tables_committed_to
from wavepipe.consumers.kafka_admin import admin_client, committed_positions, list_offsets, partitions_of
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import BUGS, StepFailedError, UsageError, closest
from wavepipe.contracts.plan import OffsetRange, RunPlan, RunRequest, as_utc, parse_datetime, run_request
from wavepipe.faults import failpoint
from wavepipe.maintenance import table_paths
from wavepipe.run_store import RunStore

log = logging.getLogger(__name__)
#: A claim without a stored plan is taken over only after this long (its planner may be mid-way).
PLANNING_GRACE_S = 300.0


class RetentionGapError(StepFailedError):
    """The group's committed offset points at data the topic no longer retains."""


class NewGroupError(UsageError):
    """The group has no committed offsets on the topic and no start was chosen for it."""


def record_cap(settings: Settings, max_records: int | None, max_bytes: int | None) -> int:
    """Records per partition per run (0 = no cap); a byte cap counts chunk_size bytes a record."""
    for name, value in (("max_records", max_records), ("max_bytes", max_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UsageError(f"{name} must be 0 (no cap) or a positive integer, got {value!r}")
    records = settings.max_records_per_partition if max_records is None else max_records
    byts = settings.max_bytes_per_partition if max_bytes is None else max_bytes
    caps = [c for c in (records, max(1, byts // settings.chunk_size) if byts else 0) if c > 0]
    return min(caps) if caps else 0


def parse_group_start(text: str) -> str:
    """``earliest``, ``latest`` or an ISO-8601 instant (normalised to UTC), else ``UsageError``."""
    value = (text or "").strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    try:
        return parse_datetime(value).isoformat()
    except ValueError:
        raise UsageError(
            f"new group start {text!r} must be earliest, latest or an ISO-8601 instant (e.g. 2026-11-20T00:00:00Z)"
        ) from None


#: Groups whose offsets a refusal looks at (one request each), the most alike the typed one first.
GROUPS_CHECKED = 50


def groups_on_topic(settings: Settings, topic: str, like: str) -> list[str]:
    """The consumer groups with committed offsets on ``topic`` (asks the cluster; best effort):
    of a large cluster's groups, the ``GROUPS_CHECKED`` most like ``like``."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = admin_client(settings)
    try:
        listed = admin.list_consumer_groups(request_timeout=10).result(timeout=15)
        names = closest(like, (listing.group_id for listing in listed.valid), n=GROUPS_CHECKED, cutoff=0)
        found = []
        for g in sorted(names):
            futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)], request_timeout=10)
            tps = futures[g].result(timeout=15).topic_partitions or []
            if any(tp.topic == topic and tp.offset >= 0 for tp in tps):
                found.append(g)
        return found
    except Exception as exc:
        log.info("could not list the groups of %s: %s", topic, exc)
        return []


def new_group_message(settings: Settings, group: str, topic: str) -> str:
    """Why a run of a group without committed offsets is refused, and the choices."""
    known = groups_on_topic(settings, topic, like=group)
    near = closest(group, known)
    listed = f"Groups with offsets on {topic}: {', '.join(known)}" if known else f"No group has offsets on {topic} yet"
    hint = f" Did you mean {' or '.join(repr(g) for g in near)}?" if near else ""
    return (
        f"group {group!r} has no committed offsets on {topic}, so it would read the topic from a place "
        f"nobody chose.{hint} {listed}. To start this group, say where: earliest, latest or an ISO "
        "time, as the param new_group_start (the trigger form), --new-group-start (the CLI) or the "
        "setting new_group_start."
    )


def _group_starts(
    settings: Settings, topic: str, partitions: list[int], choice: str, earliest: dict[int, int], stable: dict[int, int]
) -> dict[int, int]:
    """Per partition, where a new group starts for ``choice`` (see ``parse_group_start``)."""
    if choice == "earliest":
        return dict(earliest)
    if choice == "latest":
        return dict(stable)
    return offsets_for_time(settings, topic, partitions, datetime.fromisoformat(choice), stable)


def offsets_moved(
    store: RunStore, previous: dict[int, list[int]], positions: dict[int, tuple[int | None, str | None]]
) -> dict[int, dict]:
    """Per partition, a move of the group's offset since this home's last commit there: where this
    home left it (``from``), where it is (``to``), who moved it (``by``) and the range that is
    skipped (moved forward) or read again (moved back). Kafka is the source of truth, so the run
    honours the move; this makes it visible."""
    moved = {}
    for p, (offset, metadata) in positions.items():
        left = previous.get(p, [None])[0]
        if left is None or offset == left:
            continue
        run = committed_run_id(metadata)
        if run is not None and store.load_plan(run) is not None:
            continue  # this home's own commit (its record of it was cut short)
        moved[p] = {
            "from": left,
            "to": offset,
            "by": describe_committer(metadata, store),
            "skipped": [left, offset] if offset is not None and offset > left else None,
            "reread": [offset, left] if offset is not None and offset < left else None,
        }
    return moved


def describe_committer(metadata: str | None, store: RunStore) -> str:
    """Who committed an offset, from its metadata, in words."""
    import json

    try:
        meta = json.loads(metadata) if metadata else {}
    except ValueError:
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    if meta.get("rewind"):
        return f"wavepipe rewind {meta['rewind']}"
    if meta.get("run_id"):
        return f"run {meta['run_id']}, which this run state ({store.runs_location}) does not know: another wavepipe home or state_uri"
    return "a commit without wavepipe metadata: a Kafka tool (kafka-consumer-groups --reset-offsets) or another client"


def release_stale_claim(store: RunStore, group: str, run_id: str) -> None:
    """Release ``group``'s claim if it has no plan and its planner is gone: it read nothing.

    A planner that is gone is one whose process on this host no longer exists; a claim from
    another host is taken over only after ``PLANNING_GRACE_S``."""
    holder = store.active_run(group)
    if holder is None or holder == run_id or store.load_plan(holder) is not None:
        return
    if store.claim_is_orphaned(group) or store.claim_age_s(group) > PLANNING_GRACE_S:
        log.warning(
            "run %s of group %s claimed the group but never stored a plan, and its planner is gone: "
            "released (nothing was read)",
            holder,
            group,
        )
        store.release_group(group, holder)
        store.discard_staging(holder)


def plan_run(
    settings: Settings, run_id: str, *, known: RunPlan | None = None, **request: Unpack[RunRequest]
) -> RunPlan:
    """The frozen plan of ``run_id``: loaded if it exists (``known``: as the caller read it), else
    planned now and stored first.

    Per partition, ``start`` is the group's committed offset and ``end`` is the last stable offset
    now (what a read_committed reader can reach), capped per partition. A group with no committed
    offset on the topic starts where ``new_group_start`` (else the setting) says, and is refused
    without one (``NewGroupError``). Claims the group, so a second run of the group is refused
    meanwhile. An offset moved since this home's last commit is honoured and recorded
    (``RunPlan.moved``).

    A committed offset the topic no longer retains raises ``RetentionGapError`` naming the lost
    range, unless ``skip_lost_offsets``: then the range starts at the earliest retained offset and
    the plan (and so the report) records what was skipped. A ``window`` is ``plan_window_run``'s.
    """
    request = run_request(request)
    if request.get("window") is not None:
        raise TypeError("plan_run plans incremental runs; plan a window with plan_window_run")
    max_records, max_bytes = request.get("max_records"), request.get("max_bytes")
    skip_lost_offsets, new_group_start = request.get("skip_lost_offsets", False), request.get("new_group_start")
    store = RunStore(settings)
    existing = known if known is not None and known.run_id == run_id else store.load_plan(run_id)
    if existing is not None:
        store.claim_group(existing.group, run_id)
        log.info("run %s: reusing its frozen plan (%d offsets)", run_id, existing.total_offsets)
        return existing
    topic = request.get("topic") or settings.topic
    group = request.get("group") or settings.group
    cap = record_cap(settings, max_records, max_bytes)  # refused before anything is claimed
    choice = new_group_start if new_group_start not in (None, "") else settings.new_group_start
    choice = parse_group_start(choice) if choice else ""
    release_stale_claim(store, group, run_id)
    store.claim_group(group, run_id)
    try:
        failpoint("plan.after_claim")
        plan = _plan_incremental(settings, store, run_id, topic, group, cap, choice, skip_lost_offsets)
        store.save_plan(plan)
    except BaseException:
        store.release_group(group, run_id)
        raise
    log.info("run %s: planned %d offsets over %d partitions", run_id, plan.total_offsets, len(plan.ranges))
    return plan


class TablesMovedError(UsageError):
    """The group last committed with other tables: a run here would split its output."""


def _refuse_other_tables(settings: Settings, group: str, topic: str, positions: dict) -> None:
    """Refuse a run whose tables are not those the group last committed with: its offsets say
    what those tables hold, so a run here would skip it (one group, two stores, split)."""
    others = sorted({tables_committed_to(meta) for _, meta in positions.values()} - {None, settings.tables_location})
    if others:
        raise TablesMovedError(
            f"group {group!r} last committed {topic} with its tables at {', '.join(others)}, and this run's "
            f"tables are at {settings.tables_location}: its offsets say what those tables hold, so a run here "
            "would skip it. Run with the tables it used (tables_uri), or use a new group for these tables; "
            f"to move the group on purpose, `wavepipe rewind --group {group} --topic {topic} --shift-by 0 "
            '--execute` commits its offsets untied (docs/operations.md, "One group, one set of tables")'
        )


def _plan_incremental(
    settings: Settings,
    store: RunStore,
    run_id: str,
    topic: str,
    group: str,
    cap: int,
    choice: str,
    skip_lost_offsets: bool,
) -> RunPlan:
    """``plan_run``'s new plan, with the group claimed: where each partition starts (the group's
    offsets, a lost commit found in the tables, or a new group's ``choice``) and ends."""
    previous = store.previous_ranges(group, topic)
    partitions = partitions_of(settings, topic)
    positions = committed_positions(settings, group, topic, partitions)
    committed = {p: offset for p, (offset, _) in positions.items()}
    _refuse_other_tables(settings, group, topic, positions)
    committed_by = {p: committed_run_id(meta) for p, (_, meta) in positions.items()}
    earliest = list_offsets(settings, topic, partitions, OffsetSpec.earliest())
    stable = list_offsets(settings, topic, partitions, OffsetSpec.latest())
    started = None
    recovered = _lost_commit(settings, run_id, group, topic, committed, committed_by)
    if recovered is not None:  # the tables hold a run Kafka never heard of: go on after it
        starts = {p: recovered["offsets"].get(p, [0, committed[p]])[1] for p in partitions}
        starts = {p: earliest[p] if v is None else v for p, v in starts.items()}
    elif all(offset is None for offset in committed.values()):
        if not choice:
            raise NewGroupError(_new_group_refusal(settings, group, topic, previous))
        started = choice
        starts = _group_starts(settings, topic, partitions, choice, earliest, stable)
        log.info("run %s: group %s is new on %s and starts at %s: %s", run_id, group, topic, choice, starts)
    else:
        starts = {p: earliest[p] if committed[p] is None else committed[p] for p in partitions}
    moved = offsets_moved(store, previous, positions)
    for p, move in moved.items():
        log.warning(
            "run %s: %s[%d] was moved from %s to %s by %s since this home's last commit",
            *(run_id, topic, p, move["from"], move["to"], move["by"]),
        )
    ranges, lost = planned_ranges(topic, starts, earliest, stable, cap, previous)
    _skip_or_refuse_lost(run_id, group, topic, lost, skip_lost_offsets)
    return RunPlan.new(
        run_id,
        topic,
        group,
        ranges,
        previous=previous,
        caps={"records_per_partition": cap},
        committed=committed,
        lost=lost,
        latest={p: stable[p] for p in partitions},
        new_group_start=started,
        moved=moved,
        txn_version=_next_txn(settings, group, topic),
        committed_by=committed_by,
        recovered=recovered,
    )


def _skip_or_refuse_lost(run_id: str, group: str, topic: str, lost: dict[int, list[int]], skip: bool) -> None:
    """Offsets the topic deleted before the group read them: a refusal, or (``skip``) a warning."""
    gaps = [f"{topic}[{p}] [{a}, {b})" for p, (a, b) in sorted(lost.items())]
    if gaps and not skip:
        raise RetentionGapError(
            f"group {group!r} is behind what {topic} still retains: offsets {', '.join(gaps)} were "
            f"deleted before they were read. Nothing was read. To accept the loss and go on from the "
            f"earliest retained offsets, run with --skip-lost-offsets (DAG param skip_lost_offsets); "
            f"the run's report records the skipped ranges."
        )
    if gaps:
        log.warning("run %s: skipping offsets the topic no longer retains: %s", run_id, ", ".join(gaps))


def planned_ranges(
    topic: str,
    starts: dict[int, int],
    earliest: dict[int, int],
    stable: dict[int, int],
    cap: int,
    previous: dict[int, list[int]],
) -> tuple[list[OffsetRange], dict[int, list[int]]]:
    """Per partition, ``[start, end)``: from its start (moved up to the earliest offset the topic
    retains; what that skips is ``lost``) to the last stable offset, at most ``cap`` records new
    to this run (0: no cap). When the last run ended with the same start (a waveform longer than
    the cap is still pending there), the range grows past that run's end instead of repeating
    it. Returns (ranges, lost)."""
    ranges, lost = [], {}
    for p in sorted(starts):
        start = starts[p]
        if start < earliest[p]:
            lost[p] = [start, earliest[p]]
            start = earliest[p]
        end = max(start, stable[p])
        if cap:
            seen_end = previous.get(p, [None, None])[1] if previous.get(p, [None])[0] == start else None
            end = min(end, max(start, seen_end or start) + cap)
        ranges.append(OffsetRange(topic, p, start, end))
    return ranges, lost


def _new_group_refusal(settings: Settings, group: str, topic: str, previous: dict[int, list[int]]) -> str:
    """Why a group without offsets on ``topic`` and without a start to take is refused, and what to do."""
    message = new_group_message(settings, group, topic)
    if previous:  # this home committed there before: Kafka dropped the group's offsets
        left = ", ".join(f"{topic}[{p}] {v[0]}" for p, v in sorted(previous.items()))
        message += (
            f" This home's last commit left the group at {left}: its offsets may have expired "
            "(the broker's offsets.retention.minutes) or been deleted; to go on from there, "
            "choose a time with --new-group-start or set them with `wavepipe rewind "
            "--to-offset`."
        )
    return message


def _lost_commit(
    settings: Settings,
    run_id: str,
    group: str,
    topic: str,
    committed: dict[int, int | None],
    committed_by: dict[int, str | None],
) -> dict | None:
    """The group's newest publish in the output table if its Kafka commit never happened
    (``delta_txn.lost_commit``), said in the log; None otherwise, or when the table cannot say."""
    positions = {p: (committed[p], committed_by[p]) for p in committed}
    try:
        newest = delta_txn.published_runs(settings.output_table, delta_txn.app_id(group, topic), commits=50)
    except BUGS:
        raise
    except Exception as exc:  # a table delta-rs cannot read: Kafka's offsets stand, as before
        log.warning("run %s: could not read the output table's log for unfinished commits: %s", run_id, exc)
        return None
    lost = delta_txn.lost_commit(newest[0] if newest else None, positions)
    if lost is not None:
        log.warning(
            "run %s: run %s published up to %s (table version %s) but its Kafka commit never happened; "
            "going on from there, and this run's commit moves the group there too",
            run_id,
            lost["run_id"],
            {p: to for p, (_, to) in lost["offsets"].items()},
            lost["table_version"],
        )
    return lost


def _next_txn(settings: Settings, group: str, topic: str) -> int | None:
    """The ``txnVersion`` the run of ``group`` on ``topic`` planned now commits with; None when a
    table cannot be read yet (one an earlier wavepipe wrote: the publish repairs it, then asks)."""
    try:
        return delta_txn.next_version(table_paths(settings).values(), delta_txn.app_id(group, topic))
    except (StepFailedError, storage.StorageUnavailableError) as exc:  # storage.delta_error's kinds
        log.warning("%s; the run's transaction version is chosen when it publishes", exc)
        return None


class WindowError(UsageError):
    """A time window that cannot be planned (empty, or not closed yet): refused at once, as any
    value a user typed; no retry can change it."""


def backfill_lane(group: str) -> str:
    """The claim (and report group) of ``group``'s window runs: one at a time, and never the
    incremental group itself, whose committed offsets a backfill must not move."""
    return f"{group}.backfill"


def lanes(group: str) -> tuple[str, str]:
    """A group and its backfill lane, from either name: the runs ``status`` and the trend show together."""
    base = group.removesuffix(backfill_lane(""))
    return base, backfill_lane(base)


def offsets_for_time(
    settings: Settings, topic: str, partitions: list[int], when: datetime, ends: dict[int, int]
) -> dict[int, int]:
    """Per partition, the first offset whose record timestamp is at or after ``when`` (Kafka's
    offsets-for-times lookup); ``ends[p]`` where no record is that late yet."""
    ms = int(when.timestamp() * 1000)
    found = list_offsets(settings, topic, partitions, OffsetSpec.for_timestamp(ms))
    return {p: ends[p] if found[p] < 0 else min(found[p], ends[p]) for p in partitions}


def plan_window_run(
    settings: Settings,
    run_id: str,
    *,
    start: datetime,
    end: datetime,
    topic: str | None = None,
    group: str | None = None,
) -> RunPlan:
    """The frozen plan of a time-window run (a backfill of ``[start, end)``).

    Per partition the window is ``[offsets_for_time(start), offsets_for_time(end))``: adjacent
    windows tile the partition, so every record belongs to exactly one. A waveform belongs to the
    window holding its first chunk (``wp-seq`` 0). The range read starts at the window's first
    offset (chunks there of a waveform begun earlier belong to the previous window and are set
    aside) and ends past the window's end offset, where the waveforms begun inside the window
    have all their chunks (``scan_boundaries``; at most ``incomplete_after_offsets`` further).

    Claims ``backfill_lane(group)``, not the group: the incremental runs go on meanwhile, and the
    window run never commits offsets.
    """

    store = RunStore(settings)
    start, end = as_utc(start), as_utc(end)
    existing = store.load_plan(run_id)
    if existing is not None:
        _same_window_or_refuse(existing, start, end)
        store.claim_group(existing.group, run_id)
        log.info("run %s: reusing its frozen window plan", run_id)
        return existing
    _closed_window_or_refuse(start, end)
    topic = topic or settings.topic
    lane = backfill_lane(group or settings.group)
    release_stale_claim(store, lane, run_id)
    store.claim_group(lane, run_id)
    try:
        plan = _plan_window(settings, run_id, topic, lane, start, end)
        store.save_plan(plan)
    except BaseException:
        store.release_group(lane, run_id)
        raise
    log.info(
        "run %s: window [%s, %s) is offsets %s; reading %s",
        run_id,
        start.isoformat(),
        end.isoformat(),
        plan.window["offsets"],
        {r.partition: [r.start, r.end] for r in plan.ranges},
    )
    return plan


def _same_window_or_refuse(existing: RunPlan, start: datetime, end: datetime) -> None:
    if existing.window is None or [existing.window["start"], existing.window["end"]] != [
        start.isoformat(),
        end.isoformat(),
    ]:
        planned = (
            "as an incremental run"
            if existing.window is None
            else f"for the window [{existing.window['start']}, {existing.window['end']})"
        )
        raise WindowError(f"run {existing.run_id} was planned {planned}; start a new run id for this window")


def _closed_window_or_refuse(start: datetime, end: datetime) -> None:
    if not start < end:
        raise WindowError(
            f"window [{start.isoformat()}, {end.isoformat()}) is empty: its start must be before its end. Nothing was read"
        )
    if end > datetime.now(UTC):
        raise WindowError(
            f"window [{start.isoformat()}, {end.isoformat()}) has not closed yet: only a window that has ended can be "
            "reprocessed (the incremental runs read the present). Backfill up to an earlier time, or wait until "
            f"{end.isoformat()} has passed. Nothing was read"
        )


def _plan_window(settings: Settings, run_id: str, topic: str, lane: str, start: datetime, end: datetime) -> RunPlan:
    """``plan_window_run``'s new plan, with the lane claimed: per partition the window's offsets,
    and the range read (to where the waveforms begun in it end: ``_window_read_end``)."""
    partitions = partitions_of(settings, topic)
    earliest = list_offsets(settings, topic, partitions, OffsetSpec.earliest())
    stable = list_offsets(settings, topic, partitions, OffsetSpec.latest())
    first = offsets_for_time(settings, topic, partitions, start, stable)
    last = offsets_for_time(settings, topic, partitions, end, stable)
    ranges, offsets, notes = [], {}, []
    for p in partitions:
        a, b = first[p], max(first[p], last[p])
        if 0 < earliest[p] == a < b:
            notes.append(
                f"{topic}[{p}]: the window starts at the earliest retained offset {a}; records "
                "before it were deleted by retention, so any of them in the window cannot be reprocessed"
            )
        read_end = _window_read_end(settings, topic, p, a, b, earliest[p], stable[p])
        offsets[str(p)] = [a, b]
        ranges.append(OffsetRange(topic, p, a, read_end))
    window = {"start": start.isoformat(), "end": end.isoformat(), "offsets": offsets, "notes": notes}
    for note in notes:
        log.warning("run %s: %s", run_id, note)
    return RunPlan.new(
        run_id,
        topic,
        lane,
        ranges,
        latest={p: stable[p] for p in partitions},
        window=window,
        txn_version=_next_txn(settings, lane, topic),
    )


def _window_read_end(settings: Settings, topic: str, p: int, a: int, b: int, low: int, high: int) -> int:
    """Where a window run reads partition ``p``'s window ``[a, b)`` to: past ``b`` while waveforms
    begun in the window go on after it (at most ``incomplete_after_offsets`` further)."""
    if not a < b < high:
        return b
    found = scan_boundaries(settings, topic, p, b, low=low, high=high, max_scan=settings.incomplete_after_offsets)
    return max(b, found.close_offset)
