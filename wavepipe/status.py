"""``wavepipe status`` as a document: what the group has committed, its lag, what waits, its runs
and its validations. ``--json`` prints it as is (keys in docs/operations.md, "Scripting"); the
text form is rendered from it, so both always say the same."""

from __future__ import annotations

from typing import Any

from wavepipe.contracts.config import Settings, redact_url
from wavepipe.contracts.errors import UsageError
from wavepipe.contracts.report import validation_trend
from wavepipe.contracts.runfiles import html_path

#: The document's version: a key is only ever added; a removed or renamed one bumps it.
STATUS_VERSION = 1
#: The home's last refused runs the status shows.
REFUSALS_SHOWN = 8


def group_status(settings: Settings, topic: str, group: str) -> dict[str, Any]:
    """The group's status on ``topic``; a group with nothing committed and no run is refused."""
    from confluent_kafka.admin import OffsetSpec

    from wavepipe.consumers.kafka_admin import committed_positions, list_offsets, partitions_of
    from wavepipe.consumers.planner import lanes as lanes_of
    from wavepipe.consumers.planner import new_group_message, offsets_moved
    from wavepipe.run_store import RunStore

    store = RunStore(settings)
    parts = partitions_of(settings, topic)
    positions = committed_positions(settings, group, topic, parts)
    committed = {p: offset for p, (offset, _) in positions.items()}
    if all(offset is None for offset in committed.values()) and store.active_run(group) is None:
        raise UsageError(new_group_message(settings, group, topic))
    ends = list_offsets(settings, topic, parts, OffsetSpec.latest())
    lanes = lanes_of(group)
    reports = [rep for rep in store.reports() if rep.get("group") in lanes and rep.get("topic", topic) == topic]
    # pending waveforms wait right after the committed offset: the last committed run's report
    # names them, if the group is still where that run left it (else a rewind or another tool
    # moved it and they are unknown until the next run)
    last = store.last_committed(group, topic)
    moved = offsets_moved(store, store.previous_ranges(group, topic), positions)
    return {
        "status_version": STATUS_VERSION,
        "topic": topic,
        "group": group,
        "bootstrap_servers": settings.bootstrap_servers,
        "partitions": {str(p): _partition(p, committed[p], ends[p], last, moved.get(p)) for p in parts},
        "pending_waveforms": (last or {}).get("waveforms", {}).get("pending", 0),
        "last_committed_run": last["run_id"] if last else None,
        "active_runs": {lane: store.active_run(lane) for lane in lanes},
        "runs": last_runs(settings, reports, [f for lane in lanes for f in store.failures(lane)]),
        "idle_runs": store.idle_runs(group),
        # every group's and topic's: a refused run may name a group or topic that does not exist
        "refused_runs": store.refusals()[-REFUSALS_SHOWN:],
        "validation_trend": validation_trend(settings, groups=lanes),
        "spark": engine_line(settings),
    }


def engine_line(settings: Settings) -> str:
    """Where the runs' Spark work goes, and this home's engine's state (no call to a remote one)."""
    if settings.spark_engine == "submit":
        return f"Spark: a spark-submit app per step, master {settings.spark_master}"
    if settings.spark_remote:
        return f"Spark: the Spark Connect server {redact_url(settings.spark_remote)}"
    from wavepipe.local.engine_server import LocalEngine

    return LocalEngine(settings).status()


def _partition(p: int, committed: int | None, end: int, last: dict | None, move: dict | None) -> dict[str, Any]:
    part = (last or {}).get("partitions", {}).get(str(p), {})
    after = (last or {}).get("commit", {}).get(str(p), {}).get("after")
    return {
        "committed": committed,
        "end": end,
        "lag": None if committed is None else end - committed,
        # None: unknown (the group moved since the last committed run)
        "pending_chunks": part.get("pending", 0) if last and after == committed else None,
        "moved": move,
    }


def last_runs(settings: Settings, reports: list[dict], failures: list[dict], last: int = 8) -> list[dict[str, Any]]:
    """The ``last`` runs, oldest first, each by its latest outcome: its report (committed, or a
    window replaced) or the step that failed and why."""
    latest: dict[str, dict[str, Any]] = {}
    entries = [(rep.get("reported_at", ""), rep["run_id"], _from_report(rep)) for rep in reports]
    entries += [
        (f["at"], f["run_id"], {"outcome": "failed", "step": f["step"], "reason": f["reason"]}) for f in failures
    ]
    for at, run_id, entry in sorted(entries, key=lambda e: (e[0], e[1])):
        latest[run_id] = {"run_id": run_id, "at": at, **entry}
    for entry in latest.values():
        if entry["outcome"] != "failed":
            page = html_path(settings, entry["run_id"])
            entry["page"] = str(page) if page.exists() else None  # None: on the worker that ran it
    return sorted(latest.values(), key=lambda e: e["at"])[-last:]


def _from_report(rep: dict) -> dict[str, Any]:
    totals = rep["totals"]
    return {
        "outcome": rep.get("status") or ("committed" if rep.get("commit") else "?"),
        "window": rep.get("window"),
        "chunks_out": totals["output"],
        "pending": totals["pending"],
        "quarantined": totals["quarantined"],
        "dead_letter": totals["dead_letter"],
        "waveforms": rep.get("outcome"),
    }


def run_line(run: dict[str, Any]) -> str:
    """One ``last_runs`` entry in words."""
    if run["outcome"] == "failed":
        return f"{run['run_id']}: FAILED at {run['step']}: {run['reason']}"
    outcome = run["outcome"] + (f" [{run['window']['start']}, {run['window']['end']})" if run.get("window") else "")
    return (
        f"{run['run_id']}: {outcome}; {run['chunks_out']} chunks out, {run['pending']} pending, "
        f"{run['quarantined']} quarantined, {run['dead_letter']} dead-lettered; "
        + (f"file://{run['page']}" if run.get("page") else "its page is on the worker that ran it")
    )


def describe_move(move: dict) -> str:
    """One moved partition in words: from where to where, by whom, what is skipped or re-read."""
    what = (
        f"offsets [{move['skipped'][0]}, {move['skipped'][1]}) were skipped here"
        if move.get("skipped")
        else f"offsets [{move['reread'][0]}, {move['reread'][1]}) are read again"
        if move.get("reread")
        else "its committed offset was removed"
    )
    return f"from {move['from']} to {move['to']} by {move['by']}; {what}"


def status_lines(doc: dict[str, Any]) -> list[str]:
    """The document as ``wavepipe status`` prints it (like ``kafka-consumer-groups --describe``)."""
    out = [f"group {doc['group']!r} on {doc['topic']} ({doc['bootstrap_servers']})"]
    rows = [("PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "PENDING-CHUNKS", "MOVED-BY")]
    for p, part in doc["partitions"].items():
        dash = ["-" if v is None else str(v) for v in (part["committed"], part["end"], part["lag"])]
        pending = "?" if part["pending_chunks"] is None else str(part["pending_chunks"])
        rows.append((p, *dash, pending, (part["moved"] or {}).get("by", "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows]
    for p, part in doc["partitions"].items():
        if part["moved"]:
            out.append(f"moved since this home's last commit: {doc['topic']}[{p}] {describe_move(part['moved'])}")
    if doc["pending_waveforms"]:
        out.append(f"pending waveforms after run {doc['last_committed_run']}: {doc['pending_waveforms']}")
    for lane, active in doc["active_runs"].items():
        out.append(f"active {'backfill ' if lane != doc['group'] else ''}run: {active or 'none'}")
    if doc["runs"]:
        out += ["last runs:", *(f"  {run_line(run)}" for run in doc["runs"])]
    out.append(doc["spark"])
    idle = doc["idle_runs"]
    if idle:
        out.append(
            f"idle runs (nothing new to read) since the last run that read something: {idle['count']}, "
            f"from {idle['first_at']} to {idle['last_at']} (last: {idle['last_run_id']})"
        )
    return out + _refusal_lines(doc.get("refused_runs") or []) + _trend_lines(doc["validation_trend"])


def _refusal_lines(refused: list[dict]) -> list[str]:
    if not refused:
        return []
    return ["refused runs in this home (nothing read or committed; any topic or group):"] + [
        f"  {r['at']} {r['run_id']}: topic {r['topic']!r}, group {r['group']!r}: {r['reason']}" for r in refused
    ]


def _trend_lines(trend: list[dict]) -> list[str]:
    if not trend:
        return []
    passed = sum(1 for e in trend if e["success"])
    out = [
        f"validation, last {len(trend)} attempts: {passed} passed, {len(trend) - passed} failed "
        f"(oldest first: {''.join('+' if e['success'] else 'x' for e in trend)})"
    ]
    for e in trend[-5:]:
        failed = f"; failed: {', '.join(e['failed_expectations'])}" if e["failed_expectations"] else ""
        out.append(
            f"  {e['checked_at']} {e['run_id']}: {'passed' if e['success'] else 'FAILED'}, "
            f"{e['waveforms']} waveforms, {e['evaluated']} expectations{failed}"
        )
    return out
