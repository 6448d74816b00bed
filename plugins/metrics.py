"""A run's numbers through Airflow's metrics layer (``[metrics]``: StatsD, or OpenTelemetry, as
the Airflow it runs in configures them; with neither, nothing is sent). The commit task (``run``,
``follow``: per micro-batch) sends them once the run is committed; a failed validation sends
``validation_failed``.

Each metric goes out twice, as Airflow sends its own: ``wavepipe.<metric>`` with the tags
``dag_id``, ``topic`` and ``group`` (OpenTelemetry, Datadog, InfluxDB keep them), and
``wavepipe.<dag_id>.<metric>`` for a plain StatsD server, which drops tags. Names and meanings
are in docs/install-into-airflow.md, "Metrics".
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

#: counters: the report's totals and outcome they come from
COUNTERS = {
    "records_read": lambda r: r["totals"]["records_read"],
    "bytes_read": lambda r: r["totals"]["payload_bytes_read"],
    "waveforms_published": lambda r: (
        (r.get("outcome") or {}).get("new", 0) + (r.get("outcome") or {}).get("rewritten", 0)
    ),
    "waveforms_quarantined": lambda r: (r.get("outcome") or {}).get("quarantined", 0),
    "records_dead_lettered": lambda r: r["totals"]["dead_letter"],
    # waveforms published with a quality rule's flag (docs/quality.md)
    "waveforms_flagged": lambda r: (r.get("quality") or {}).get("flagged", 0),
}


def run_metrics(report: Mapping[str, Any]) -> dict[str, tuple[str, float]]:
    """The metrics of one committed run, by name: (kind, value), kind one of ``count``,
    ``gauge``, ``timing`` (milliseconds). An idle run counts as a run and its lag, nothing else."""
    out: dict[str, tuple[str, float]] = {"runs": ("count", 1)}
    parts = (report.get("partitions") or {}).values()
    if report.get("partitions"):
        out.update({name: ("count", float(value(report))) for name, value in COUNTERS.items()})
    for edge in ("lag_before", "lag_after"):
        known = [p.get(edge) for p in parts if p.get(edge) is not None]
        if known:
            out[edge] = ("gauge", float(sum(known)))
    validation = report.get("validation")
    if validation is not None:
        out["validation_passed" if validation.get("success") else "validation_failed"] = ("count", 1)
    seconds = _seconds(report.get("planned_at"), report.get("reported_at"))
    if seconds is not None:
        out["run_duration"] = ("timing", seconds * 1000.0)
    return out


def _seconds(start: str | None, end: str | None) -> float | None:
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError):
        return None


def stat_names(dag_id: str, metric: str) -> tuple[str, str]:
    """The tagged name and the plain StatsD name of ``metric`` of DAG ``dag_id``."""
    return f"wavepipe.{metric}", f"wavepipe.{dag_id.replace('.', '__')}.{metric}"


def send(metrics: Mapping[str, tuple[str, float]], *, dag_id: str, topic: str | None, group: str | None, log) -> None:
    """Send ``metrics`` through Airflow's metrics layer. Describing a run never fails it: an
    error is logged."""
    try:
        from airflow.sdk.observability import stats

        tags = {"dag_id": dag_id, "topic": topic or "", "group": group or ""}
        for metric, (kind, value) in metrics.items():
            for name, with_tags in zip(stat_names(dag_id, metric), (tags, None), strict=True):
                if kind == "count":
                    stats.incr(name, count=int(value), tags=with_tags)
                elif kind == "gauge":
                    stats.gauge(name, value, tags=with_tags)
                else:
                    stats.timing(name, value, tags=with_tags)
    except Exception as exc:  # metrics only describe the run
        log.warning("could not send the run's metrics: %s", exc)
