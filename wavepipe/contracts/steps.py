"""What a run's steps record, typed: read by the steps after them and merged into the run's report.

Each record is saved as ``runs/<run_id>/<step>.json`` (``RunStore.save_result``) once its step is
done, and read back as the same type (``RunStore.load_result``): JSON's string keys become the
partition numbers again, and a record that is not what this wavepipe writes is refused with the
step to run again, never half read.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import TypeAdapter

T = TypeVar("T")


@dataclass
class ReadStats:
    """The ``consume`` record of one offset range: what its reader read and staged."""

    topic: str
    partition: int
    start: int
    end: int
    records: int = 0
    chunks: int = 0
    dead_letters: int = 0
    payload_bytes: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    #: Newest record timestamp read (ms): how far the partition's record time has moved.
    max_timestamp_ms: int | None = None
    seconds: float = 0.0

    @property
    def gap_offsets(self) -> int:
        """Offsets in the range Kafka delivered no record for (transaction markers, aborted or
        compacted records)."""
        return (self.end - self.start) - self.records


@dataclass(kw_only=True)
class PartitionAccount:
    """Where the records a reassembly read of one partition went, and the partition's safe offset:
    the commit moves the group's offset there (before the first chunk of a pending waveform)."""

    safe_offset: int
    #: Records (chunks) of waveforms in the output, and of those the ones an earlier run wrote.
    output: int = 0
    output_already_written: int = 0
    output_bytes: int = 0
    #: Records of waveforms still missing chunks: read again by the next run.
    pending: int = 0
    pending_bytes: int = 0
    #: Records of quarantined waveforms, counted by reason as well.
    quarantined: int = 0
    quarantined_bytes: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    #: Records that break the chunk protocol (the dead-letter table's rows).
    dead_letter: int = 0
    dead_letter_bytes: int = 0
    #: A window run: records of waveforms (chunks) and dead letters that are another window's.
    other_window: int = 0
    other_window_bytes: int = 0
    other_window_chunks: int = 0


@dataclass(kw_only=True)
class WindowRows:
    """What a window run's publish replaces beyond the rows whose first offset is in the window
    (``spark_apps.reassemble.window_rows``): ids it keeps, and per table the ids it owns outside."""

    keep: list[str]
    extra: dict[str, list[str]]


@dataclass(kw_only=True)
class Reassembled:
    """The ``reassemble`` record: the run's accounting and what its candidate tables hold."""

    run_id: str
    finished_at: str
    partitions: dict[int, PartitionAccount]
    #: waveforms by outcome: ``output_new``, ``output_already_written``, ``pending``,
    #: ``quarantined:<reason>``, ...
    waveforms: dict[str, int]
    timings: dict[str, float]
    #: rows each candidate table must hold (validation refuses tables that do not)
    candidates: dict[str, int] = field(default_factory=dict)
    #: how the new waveforms were verified: ``while_read``, ``from_one_staged_file``, ``by_a_shuffle``
    verified: dict[str, int] = field(default_factory=dict)
    window_rows: WindowRows | None = None
    #: the output table's version at which the run's ids were looked up in it (None: no table, or
    #: an earlier wavepipe's record); none of the new waveforms had a row there then
    output_version: int | None = None


@dataclass(kw_only=True)
class ValidationQuarantine:
    """Waveforms the validate step quarantined because they failed a per-waveform expectation, or
    the publish step because they broke a quarantining quality rule: per reason (the
    expectation's or the rule's), and their records per partition and reason as
    ``[records, payload bytes]``. The reassembly had counted them as output (``settled``)."""

    waveforms: dict[str, int] = field(default_factory=dict)
    records: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    def plus(self, other: ValidationQuarantine) -> ValidationQuarantine:
        """Both quarantines' waveforms and records, added up."""
        out = copy.deepcopy(self)
        for reason, n in other.waveforms.items():
            out.waveforms[reason] = out.waveforms.get(reason, 0) + n
        for partition, reasons in other.records.items():
            mine = out.records.setdefault(partition, {})
            for reason, (records, nbytes) in reasons.items():
                was = mine.get(reason, [0, 0])
                mine[reason] = [was[0] + records, was[1] + nbytes]
        return out


#: How many quarantined waveforms and dead letters a run names (``Named``); the rest are counted.
NAMED_CAP = 20


@dataclass(kw_only=True)
class NamedReject:
    """One quarantined waveform (a quarantine table row) or dead-lettered record (a dead-letter
    table row) as the run's page names it: what the producer sent (id, source; a dead letter's
    from its headers, None where it sent none) and why it was set aside. ``first_offset`` and
    ``last_offset`` are the same record's for a dead letter; ``chunks``: a waveform's records."""

    reason: str
    detail: str | None = None
    waveform_id: str | None = None
    source: str | None = None
    topic: str | None = None
    partition: int | None = None
    first_offset: int | None = None
    last_offset: int | None = None
    chunks: int | None = None
    total_size: int | None = None


@dataclass(kw_only=True)
class Named:
    """The waveforms a run quarantined and the records it dead-lettered, by name: the first
    ``NAMED_CAP`` of each in offset order (the tables hold them all), how many there are, and
    per partition (of a waveform's first chunk) the quarantined waveforms, in all and by reason."""

    quarantined: list[NamedReject] = field(default_factory=list)
    quarantined_total: int = 0
    quarantined_waveforms: dict[int, int] = field(default_factory=dict)
    quarantined_reasons: dict[int, dict[str, int]] = field(default_factory=dict)
    dead_letter: list[NamedReject] = field(default_factory=list)
    dead_letter_total: int = 0


@dataclass(kw_only=True)
class ValidatedRows:
    waveforms: int
    waveform_bytes: int
    staged_records: int


@dataclass(kw_only=True)
class Validated:
    """The ``validate`` record: the suites' outcome (a run may be published only if it passed)."""

    run_id: str
    group: str
    topic: str
    checked_at: str
    suite_version: int
    success: bool
    #: per suite: its name, counts and failed expectations as Great Expectations described them
    suites: list[dict[str, Any]]
    data_docs_index: str | None
    rows: ValidatedRows
    thresholds: dict[str, Any]
    plot: str | None = None
    #: the plot of the published waveforms a quality rule flagged (made after the commit)
    flagged_plot: str | None = None
    #: the output table's version the validation checked against
    output_table_version: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    #: what could not be described (the plot, Data Docs, the trend): never a failure
    notes: list[str] = field(default_factory=list)
    #: the new waveforms a per-waveform expectation quarantined instead of publishing
    quarantined: ValidationQuarantine = field(default_factory=ValidationQuarantine)
    #: a run that failed validation: the waveforms and dead letters it would have set aside, by
    #: name (a published run's are its ``Published.named``); None: not known
    named: Named | None = None


@dataclass(kw_only=True)
class Published:
    """The ``publish`` record: what the run's publish committed, recorded once its commits are
    done (a publish that died before it is done again: its commits carry the group's
    transaction, so nothing is added twice)."""

    run_id: str
    #: the output table's version after the run's commit
    output_table_version: int | None
    #: each published table's version after the publish (what an asset event names)
    table_versions: dict[str, int | None] = field(default_factory=dict)
    #: a window run: the output table's rows its window's commit replaced (None: Delta did not say)
    replaced_rows: int | None = None
    #: the ``qc`` table's rows the run wrote (None: an earlier attempt of the run wrote them)
    qc_hours: int | None = 0
    #: the waveforms a quarantining quality rule held back, and where their records went
    held: ValidationQuarantine = field(default_factory=ValidationQuarantine)
    #: the quarantined waveforms and dead letters the run published, by name (None: not known)
    named: Named | None = None
    #: what the published waveforms' measured quality says (``spark_apps.quality.summarize``);
    #: None: not measured
    quality: dict[str, Any] | None = None
    #: ``total_s`` (the publish, the ``qc`` table's update within it: ``qc_table_s``), then
    #: ``quality_summary_s``
    timings: dict[str, float] = field(default_factory=dict)


def settled(reassembled: Reassembled | None, moved: ValidationQuarantine | None) -> Reassembled | None:
    """The run's accounting once validation has quarantined the new waveforms that failed a
    per-waveform expectation: their records move from output to quarantined (the same
    partitions, the safe offsets unchanged), their waveforms from ``output_new`` to
    ``quarantined:<expectation>``. ``moved``: a validation's ``quarantined``. ``reassembled``
    itself is left as it was recorded."""
    if reassembled is None or moved is None or not moved.waveforms:
        return reassembled
    out = copy.deepcopy(reassembled)
    for partition, reasons in moved.records.items():
        part = out.partitions[partition]
        for reason, (records, nbytes) in reasons.items():
            part.output -= records
            part.output_bytes -= nbytes
            part.quarantined += records
            part.quarantined_bytes += nbytes
            part.quarantine_reasons[reason] = part.quarantine_reasons.get(reason, 0) + records
    for reason, n in moved.waveforms.items():
        out.waveforms["output_new"] = out.waveforms.get("output_new", 0) - n
        key = f"quarantined:{reason}"
        out.waveforms[key] = out.waveforms.get(key, 0) + n
    if out.waveforms.get("output_new") == 0:
        del out.waveforms["output_new"]
    return out


@functools.cache
def _adapter(kind: type) -> TypeAdapter:
    return TypeAdapter(kind)


def to_record(result: Any) -> dict[str, Any]:
    """``result`` as the JSON object its step record holds: plain dicts, lists and numbers (a NaN
    stays a NaN, as ``json`` writes it: a failed expectation's example may be one)."""
    return _adapter(type(result)).dump_python(result)


def from_record(kind: type[T], data: Any) -> T:
    """A step record read back as ``kind``; pydantic's ``ValidationError`` when it is not one."""
    return _adapter(kind).validate_python(data)
