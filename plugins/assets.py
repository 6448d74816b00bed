"""The Airflow assets of a pipeline: the topic it reads (named as the apache-kafka provider names a
topic, ``kafka://<bootstrap server>/<topic>``) and the three Delta tables it publishes to (named
by their location: ``file:///...`` or ``s3://...``). A downstream DAG schedules on a table::

    from wavepipe.plugins.assets import table_assets

    @dag(schedule=[table_assets(settings={"home": "/data/wavepipe/seismic"})["waveforms"]])
    def seismic_features(): ...

The ingest DAG's commit (``CommitOperator``, ``RunOperator``, ``FollowOperator``) emits an event
for each table a run put rows in, once its offsets are committed, with ``published_extra`` as the
event's extra; a run that read nothing, or put nothing in a table, emits none for it. A run whose
waveforms broke a quality rule also emits one for ``quality_asset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.providers.apache.kafka.assets.kafka import create_asset
from airflow.sdk import Asset

from wavepipe.contracts.config import Settings, load_settings
from wavepipe.maintenance import table_paths


def location_uri(location: str) -> str:
    """A table's location as a URI: an object store's as it is, a local path as ``file://``."""
    return location if "://" in location else Path(location).resolve().as_uri()


def table_assets(settings: Settings | Mapping[str, Any] | None = None) -> dict[str, Asset]:
    """The pipeline's output tables as assets, by table name (``waveforms``, ``quarantine``,
    ``dead_letter``). ``settings``: the pipeline's (a DAG factory's ``settings``, over the config
    file and ``WAVEPIPE_*``), or resolved ``Settings``."""
    resolved = settings if isinstance(settings, Settings) else load_settings(**dict(settings or {}))
    return {
        name: Asset(uri=location_uri(path), extra={"table": name, "format": "delta"})
        for name, path in table_paths(resolved).items()
    }


def quality_asset(settings: Settings | Mapping[str, Any] | None = None) -> Asset:
    """The quality breaches of the pipeline's waveforms: an event for each committed run that
    published waveforms breaking a quality rule (docs/quality.md), so an alert DAG scheduled on it
    runs only then (its extra: ``quality_extra``)::

        @dag(schedule=[quality_asset(settings={"home": "/data/wavepipe/seismic"})])
        def page_the_on_call(): ...
    """
    waveforms = table_assets(settings)["waveforms"]
    return Asset(uri=f"{waveforms.uri}?wavepipe=quality", extra={"table": "waveforms", "about": "quality breaches"})


def quality_extra(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """A committed run's quality breaches as its event's extra (None: none): run id, topic,
    group, the waveforms flagged, per rule, and the most flagged sources (up to 10)."""
    quality = report.get("quality") or {}
    if not quality.get("flagged"):
        return None
    return {
        "run_id": report["run_id"],
        "topic": report.get("topic"),
        "group": report.get("group"),
        "flagged": quality["flagged"],
        "by_rule": quality.get("by_rule", {}),
        "sources": [s["source"] for s in quality.get("sources", []) if s.get("flagged")][:10],
        "table_version": (report.get("table_versions") or {}).get("waveforms"),
    }


def topic_asset(servers: str, topic: str, group: str | None = None) -> Asset:
    """The topic as the apache-kafka provider names it (its first bootstrap server); with
    ``group``: the topic as that consumer group reads it (``?group=``), a distinct asset."""
    server = servers.split(",")[0].strip()
    if group is None:
        return create_asset(server=server, topic=topic)
    return Asset(uri=f"kafka://{server}/{topic}?group={group}")


def table_rows(report: Mapping[str, Any]) -> dict[str, int]:
    """The rows a run put in each table (from its report's outcome): the waveforms it wrote (new,
    or rewritten into its window), the waveforms it quarantined, the dead-letter records, the
    `qc` table's hours it recomputed."""
    outcome = report.get("outcome") or {}
    return {
        "waveforms": int(outcome.get("new") or 0) + int(outcome.get("rewritten") or 0),
        "quarantine": int(outcome.get("quarantined") or 0),
        "dead_letter": int(outcome.get("dead_letter_records") or 0),
        "qc": int((report.get("quality") or {}).get("qc_hours") or 0),
    }


def published_extra(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per table a committed run put rows in: its asset event's extra (run id, topic, group, the
    rows, the table's version after the run's commit, the window of a window run)."""
    versions = report.get("table_versions") or {}
    return {
        table: {
            "run_id": report["run_id"],
            "topic": report.get("topic"),
            "group": report.get("group"),
            "rows": rows,
            "table_version": versions.get(table),
            "window": report.get("window"),
        }
        for table, rows in table_rows(report).items()
        if rows > 0
    }
