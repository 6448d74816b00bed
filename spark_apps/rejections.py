"""Waveforms that failed a per-waveform expectation: quarantined with the expectation's name.

Great Expectations names the failing rows of each expectation (``INDEX_COLUMNS`` of each); a
waveform that fails one is taken out of what the run publishes and written to the quarantine
table instead, with the first expectation it failed (in the suite's order) as its reason and
every failure in its detail. Its records are accounted as quarantined (``steps.settled``). It
never fails the run: one producer's bad waveforms cannot stall a group.

``named`` names, for the run's report and page, what the run sets aside for any reason: the first
few of its quarantine rows (every reason, not only the expectations') and of its dead letters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from wavepipe.contracts.protocol import H_ID, H_SOURCE
from wavepipe.contracts.steps import NAMED_CAP, Named, NamedReject, ValidationQuarantine
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


#: Characters of a named reject's text (id, source, detail) kept in the report: a producer's
#: header can be long, the table holds it whole.
NAMED_CHARS = 300


def _short(value) -> str | None:
    if value is None:
        return None
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= NAMED_CHARS else text[: NAMED_CHARS - 1] + "\u2026"


def _header(headers, name: str) -> str | None:
    """The (first) header ``name`` of a dead letter's headers (``[{key, value}]``), as text."""
    for h in headers or ():
        if h.get("key") == name:
            return _short(h.get("value"))
    return None


def named(quarantine: pa.Table | None, dead_letter: pa.Table | None, cap: int = NAMED_CAP) -> Named:
    """The run's quarantined waveforms and dead letters by name (``steps.Named``), from its rows
    of the quarantine and dead-letter tables (``classify.QUARANTINE_SCHEMA``, the readers'
    ``DEAD_LETTER_SCHEMA``; None: none), as they are published: no Spark job, nothing read."""
    out = Named()
    if quarantine is not None and quarantine.num_rows:
        q = quarantine.select([c for c in QUARANTINE_NAMED if c in quarantine.column_names]).to_pandas()
        q = q.sort_values(["partition", "first_offset", "waveform_id", "reason"], na_position="last", kind="stable")
        first = q.drop_duplicates("waveform_id")  # one row per waveform and reason: count a waveform once
        out.quarantined_total = len(first)
        for p, n in first.groupby("partition", sort=True).size().items():
            out.quarantined_waveforms[int(p)] = int(n)
        for (p, reason), n in q.groupby(["partition", "reason"], sort=True).size().items():
            out.quarantined_reasons.setdefault(int(p), {})[str(reason)] = int(n)
        out.quarantined = [
            NamedReject(
                reason=str(r["reason"]),
                detail=_short(r.get("detail")),
                waveform_id=_short(r.get("waveform_id")),
                source=_short(r.get("source")),
                topic=_short(r.get("topic")),
                partition=_int(r.get("partition")),
                first_offset=_int(r.get("first_offset")),
                last_offset=_int(r.get("last_offset")),
                chunks=_int(r.get("records")),
                total_size=_int(r.get("total_size")),
            )
            for r in q.head(cap).to_dict("records")
        ]
    if dead_letter is not None and dead_letter.num_rows:
        columns = [
            c for c in ("topic", "partition", "offset", "reason", "detail", "headers") if c in dead_letter.column_names
        ]
        rows = sorted(
            dead_letter.select(columns).to_pylist(), key=lambda r: (r.get("partition") or 0, r.get("offset") or 0)
        )
        out.dead_letter_total = len(rows)
        out.dead_letter = [
            NamedReject(
                reason=str(r.get("reason")),
                detail=_short(r.get("detail")),
                waveform_id=_header(r.get("headers"), H_ID),
                source=_header(r.get("headers"), H_SOURCE),
                topic=_short(r.get("topic")),
                partition=_int(r.get("partition")),
                first_offset=_int(r.get("offset")),
                last_offset=_int(r.get("offset")),
            )
            for r in rows[:cap]
        ]
    return out


#: The quarantine table's columns a named waveform is made of.
QUARANTINE_NAMED = (
    "waveform_id",
    "reason",
    "detail",
    "source",
    "topic",
    "partition",
    "first_offset",
    "last_offset",
    "records",
    "total_size",
)


def _int(value) -> int | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return int(value)
