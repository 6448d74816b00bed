"""Waveforms that failed a per-waveform expectation: quarantined with the expectation's name.

Great Expectations names the failing rows of each expectation (``INDEX_COLUMNS`` of each); a
waveform that fails one is taken out of what the run publishes and written to the quarantine
table instead, with the first expectation it failed (in the suite's order) as its reason and
every failure in its detail. Its records are accounted as quarantined (``steps.settled``). It
never fails the run: one producer's bad waveforms cannot stall a group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from wavepipe.contracts.steps import ValidationQuarantine
from wavepipe.expectations import quarantine_reason
from wavepipe.spark_apps.classify import QUARANTINED, accounting, quarantine_rows, read_meta

#: What GX lists of each failing row: enough to find the waveform's chunks and its place.
INDEX_COLUMNS = ("waveform_id", "checksum", "partition", "first_offset")


def _shown(value) -> str:
    if hasattr(value, "item"):  # a numpy scalar, from a pandas frame
        value = value.item()
    return f"{value:g}" if isinstance(value, float) else str(value)


def rejected_waveforms(result) -> dict[str, dict]:
    """Waveform id -> ``reason`` (the first expectation it failed), ``detail`` (each failure:
    what the expectation checks and the row's values) and its ``INDEX_COLUMNS``, from a GX
    validation result made with ``unexpected_index_column_names`` = ``INDEX_COLUMNS``."""
    rejected: dict[str, dict] = {}
    for r in result.results:
        if r.success:
            continue
        config = r.expectation_config
        reason = quarantine_reason(config.type, config.kwargs.get("column") or config.kwargs.get("column_A"))
        for row in (r.result or {}).get("unexpected_index_list") or []:
            values = ", ".join(f"{k}={_shown(v)}" for k, v in row.items() if k not in INDEX_COLUMNS)
            entry = rejected.setdefault(
                str(row["waveform_id"]), {"reason": reason, "failures": [], **{k: row[k] for k in INDEX_COLUMNS}}
            )
            entry["failures"].append(f"{config.description} ({values})" if values else config.description)
    for entry in rejected.values():
        entry["detail"] = "; ".join(entry.pop("failures"))
        entry["partition"], entry["first_offset"] = int(entry["partition"]), int(entry["first_offset"])
    return rejected


@dataclass
class Rejection:
    """The run's rejected waveforms (``rejected_waveforms``), their quarantine table rows (None:
    none rejected) and where their records go in the run's accounting."""

    rejected: dict[str, dict] = field(default_factory=dict)
    rows: pa.Table | None = None
    moved: ValidationQuarantine = field(default_factory=ValidationQuarantine)

    @property
    def ids(self) -> list[str]:
        return sorted(self.rejected)

    def outside(self, window: dict[int, tuple[int, int]]) -> list[str]:
        """The rejected waveforms whose row lies outside a window run's ``[from, to)`` offsets per
        partition: its quarantine commit must replace their rows too."""
        return [
            wid
            for wid, r in sorted(self.rejected.items())
            if not window.get(r["partition"], (0, 0))[0] <= r["first_offset"] < window.get(r["partition"], (0, 0))[1]
        ]


def rejection(chunk_files: list[str], rejected: dict[str, dict], run_id: str) -> Rejection:
    """The quarantine table's rows of the ``rejected`` waveforms (``rejected_waveforms``), and
    where their records go in the run's accounting: their staged chunks (the ones with their
    checksum), counted per partition and reason from the chunks' metadata (read here: no Spark
    job; nothing read when nothing was rejected)."""
    if not rejected:
        return Rejection()
    status = pd.DataFrame(
        [(wid, QUARANTINED, r["reason"], r["detail"], False, None) for wid, r in sorted(rejected.items())],
        columns=["waveform_id", "status", "reason", "detail", "already_written", "output_checksum"],
    )
    meta = read_meta(chunk_files)
    keys = pd.DataFrame([(wid, r["checksum"]) for wid, r in rejected.items()], columns=["waveform_id", "checksum"])
    meta = meta.merge(keys, on=["waveform_id", "checksum"])
    moved = ValidationQuarantine()
    for r in rejected.values():
        moved.waveforms[r["reason"]] = moved.waveforms.get(r["reason"], 0) + 1
    for row in accounting(meta, status):
        moved.records.setdefault(int(row["partition"]), {})[row["reason"]] = [row["records"], row["bytes"] or 0]
    return Rejection(rejected, quarantine_rows(meta, status, run_id), moved)
