"""The describe step: what only describes a published run, made once nothing waits for it.

A run's rows are readable once its publish commits, and its offsets move at its Kafka commit; its
plot, the plot of its flagged waveforms and its Data Docs only describe it, so neither waits for
them. A ``Description`` holds what they need (the plot's waveforms, read from the staged files
beside the publish, before the commit removes them); ``make`` makes the descriptions of one run or
of several at once: a follow loop's micro-batches since the last, with one Data Docs build (the
site's index once) and the plots of the last of them. Whatever fails here becomes a line in the
run's notes, never an error of the run.

A run whose steps run in one process (``pipeline.run_steps``) leaves its description here
(``defer``) from its publish to its commit, where the same process ``take``\\ s it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from wavepipe import plots
from wavepipe.contracts.config import Settings
from wavepipe.contracts.report import describe_safely
from wavepipe.contracts.steps import Published, Validated
from wavepipe.spark_apps.validate import DataDocs, build_data_docs


@dataclass
class Description:
    """What describes run ``result.run_id`` (its validation record, and what it published): the waveforms
    its plot draws, its Data Docs to build and its ``notes``, which the record keeps."""

    settings: Settings
    result: Validated
    #: its publish (None: nothing published)
    published: Published | None
    picked: plots.Picked
    docs: DataDocs
    notes: list[str]


def make(descriptions: list[Description]) -> list[Validated]:
    """Make each description: the Data Docs of all in one build, the plot and the flagged plot of
    the last (the earlier ones' notes say that run's plots show them), and each record's notes
    and timings; returns the records, described."""
    if not descriptions:
        return []
    t = time.monotonic()
    for d, index in zip(descriptions, build_data_docs([d.docs for d in descriptions]), strict=True):
        d.result.data_docs_index = index
        d.result.timings["data_docs_s"] = time.monotonic() - t
    last = descriptions[-1]
    for d in descriptions[:-1]:
        d.notes.append(f"described with run {last.result.run_id}: its plots show that run's waveforms, not this one's")
    t = time.monotonic()
    last.result.plot = plots.plot_picked(last.picked, last.settings, last.result.run_id, last.notes)
    last.result.timings["plot_s"] = time.monotonic() - t
    _flagged_plot(last)
    for d in descriptions:
        d.result.notes = d.notes
        d.result.timings = {k: round(v, 3) for k, v in d.result.timings.items()}
    return [d.result for d in descriptions]


def _flagged_plot(d: Description) -> None:
    """The plot of the waveforms the run published flagged, when there are any (``flagged_plot``)."""
    quality = d.published.quality if d.published else None
    version = d.published.output_table_version if d.published else None
    if not (d.settings.quality_metrics and quality and quality.get("flagged") and version is not None):
        return
    t = time.monotonic()
    what = "the plot of the flagged waveforms"
    d.result.flagged_plot = describe_safely(d.notes, what, plots.plot_flagged, d.settings, d.result.run_id, version)
    d.result.timings["flagged_plot_s"] = time.monotonic() - t


_PENDING: dict[str, Description] = {}
_LOCK = threading.Lock()


def defer(description: Description) -> None:
    """Keep ``description`` until this process's commit of its run takes it (``take``)."""
    with _LOCK:
        _PENDING[description.result.run_id] = description


def take(run_id: str) -> Description | None:
    """The description of run ``run_id`` that waits in this process, handed over once (None: none)."""
    with _LOCK:
        return _PENDING.pop(run_id, None)
