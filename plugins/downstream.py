"""What a DAG scheduled on a wavepipe table gets from the events that started it: the runs that
published (each event's extra, ``wavepipe.plugins.assets.published_extra``) and the rows each one
put in the table, read with delta-rs at the version its event names (the rows stay the run's
even after later runs or a compaction: ``run_id`` is a column); for a DAG scheduled on the quality
asset, the runs whose waveforms broke quality rules (``quality_breaches``, ``alert``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from wavepipe import storage
from wavepipe.contracts.config import Settings

log = logging.getLogger("wavepipe.downstream")

#: The waveforms' columns a summary reads (never ``payload``: the samples stay where they are).
SUMMARY_COLUMNS = ["waveform_id", "source", "sample_rate", "duration_s", "run_id"]


def published_runs(events: Mapping[Any, Iterable[Any]] | None) -> list[dict[str, Any]]:
    """The wavepipe runs among a DAG run's triggering asset events (``context
    ["triggering_asset_events"]``: asset -> its events; Airflow lists an event that came through
    an alias under the alias too, so each is taken once), each event's extra with the table's
    asset URI, oldest table version first; events that are not a wavepipe publish are left out."""
    found: dict[tuple, dict[str, Any]] = {}
    for key, asset_events in (events or {}).items():
        for event in asset_events:
            extra = dict(getattr(event, "extra", None) or {})
            if not (extra.get("run_id") and "rows" in extra):
                continue
            uri = getattr(getattr(event, "asset", None), "uri", None) or getattr(key, "uri", str(key))
            found.setdefault((uri, extra["run_id"]), {**extra, "uri": uri})
    return sorted(found.values(), key=lambda e: (e.get("table_version") is None, e.get("table_version") or 0))


def run_rows(settings: Settings, run: Mapping[str, Any], columns: list[str] | None = None):
    """The rows run ``run`` (a ``published_runs`` entry for the waveforms table) put in it, as a
    pyarrow Table: the table as of the event's version (its latest when none), filtered on the
    run id (delta-rs skips the files whose statistics rule it out)."""
    import pyarrow.compute as pc

    storage.configure(settings)
    version = run.get("table_version")
    table = storage.delta_table(settings.output_table, **({"version": version} if version is not None else {}))
    dataset = table.to_pyarrow_dataset()
    return dataset.to_table(filter=pc.field("run_id") == run["run_id"], columns=columns or SUMMARY_COLUMNS)


def summarize(settings: Settings, events) -> list[dict[str, Any]]:
    """Per wavepipe run that started this DAG run: its id, the rows its event announced and the
    rows read back (they must agree), the sources, and the seconds of signal."""
    summaries = []
    for run in published_runs(events):
        rows = run_rows(settings, run)
        summaries.append(
            {
                "run_id": run["run_id"],
                "table_version": run.get("table_version"),
                "announced": run["rows"],
                "read": rows.num_rows,
                "sources": sorted(set(rows.column("source").to_pylist())),
                "seconds": round(sum(d or 0.0 for d in rows.column("duration_s").to_pylist()), 3),
            }
        )
    return summaries


def quality_breaches(events: Mapping[Any, Iterable[Any]] | None) -> list[dict[str, Any]]:
    """The runs among a DAG run's triggering asset events that published waveforms breaking a
    quality rule (each event's extra, ``wavepipe.plugins.assets.quality_extra``), each once,
    oldest waveforms table version first."""
    found: dict[str, dict[str, Any]] = {}
    for asset_events in (events or {}).values():
        for event in asset_events:
            extra = dict(getattr(event, "extra", None) or {})
            if extra.get("run_id") and "by_rule" in extra:
                found.setdefault(extra["run_id"], extra)
    return sorted(found.values(), key=lambda e: (e.get("table_version") is None, e.get("table_version") or 0))


def alert(events: Mapping[Any, Iterable[Any]] | None, say=log.warning) -> list[str]:
    """One line per run that broke quality rules (``quality_breaches``), said with ``say`` (a
    warning in the task's log; a pager's client in a team's own copy). Returns the lines."""
    lines = [
        f"run {b['run_id']} ({b.get('topic')}, group {b.get('group')}): {b['flagged']} waveforms flagged "
        + ", ".join(f"{rule} {n}" for rule, n in b["by_rule"].items())
        + (f"; most flagged: {', '.join(b['sources'])}" if b.get("sources") else "")
        for b in quality_breaches(events)
    ]
    for line in lines:
        say("%s", line)
    return lines
