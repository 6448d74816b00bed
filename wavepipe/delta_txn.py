"""Exactly once at the table: each publish carries the run's transaction in the Delta log.

As kafka-delta-ingest keeps Kafka offsets in Delta transactions, every commit a run makes to a
published table carries

* a transaction id that is stable per (group, topic) and table (``app_id``: Delta's ``txnAppId``;
  the table is the log it is written to), and a ``txnVersion`` that grows by one with every run
  of the group, frozen in the run's plan (``next_version``). Delta skips a write whose version the
  table already holds for that id and refuses a concurrent twin, so a retried publish adds
  nothing, and the table's state keeps one entry per group, however many runs there are (a new
  id per run would add an entry to every checkpoint forever);
* the run's planned ranges and safe offsets in the commit's ``userMetadata`` (``commit_metadata``),
  so what was published, and up to where, is recorded where it was published
  (``published_runs``): after a crash between the table commit and the Kafka commit, the next run
  finds it in the log, not in files under the home.

Read with delta-rs (no Spark).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from wavepipe import storage
from wavepipe.contracts.errors import BUGS
from wavepipe.contracts.plan import RunPlan

log = logging.getLogger("wavepipe.delta_txn")

#: The ``userMetadata`` of a wavepipe publish starts with this (then JSON).
METADATA_KEY = "wavepipe_run"
#: How many of a table's newest commits ``published_runs`` reads (one file each).
HISTORY_COMMITS = 200


def app_id(group: str, topic: str) -> str:
    """The transaction id of ``group``'s runs on ``topic`` (a window run's group is its backfill
    lane: its own id). Topic names hold no ``:``, so the id splits back unambiguously."""
    return f"wavepipe:{group}:{topic}"


@dataclass(frozen=True)
class Txn:
    """A publish's Delta transaction: ``app_id``, ``version`` and the commit's ``metadata``."""

    app_id: str
    version: int
    metadata: str


def txn_version(path: str, txn_app_id: str) -> int:
    """The highest ``txnVersion`` table ``path`` holds for ``txn_app_id`` (0: none, or no table)."""
    if not storage.has_table(path):
        return 0
    return storage.delta_table(path).transaction_version(txn_app_id) or 0


def next_version(paths: Iterable[str], txn_app_id: str) -> int:
    """The ``txnVersion`` of the next run: one above the highest any of ``paths`` holds. A table
    delta-rs cannot open (``wavepipe table repair``) raises, naming it."""
    versions = []
    for path in paths:
        try:
            versions.append(txn_version(path, txn_app_id))
        except BUGS:
            raise
        except Exception as exc:  # delta-rs's or the store's: translated by storage
            raise storage.delta_error(exc, str(path), "reading the group's last transaction") from exc
    return max(versions, default=0) + 1


def commit_metadata(plan: RunPlan, safe_offsets: dict[int, int]) -> str:
    """The ``userMetadata`` of run ``plan``'s publish: ``METADATA_KEY`` and JSON of the run id,
    its transaction, its planned ranges ``[start, end)``, where the group stood when it was
    planned (``committed`` offsets and the runs that committed them, ``committed_by``) and the
    safe offsets its commit moves the group to."""
    data = {
        "run_id": plan.run_id,
        "app_id": app_id(plan.group, plan.topic),
        "txn_version": plan.txn_version,
        "ranges": {str(r.partition): [r.start, r.end] for r in plan.ranges},
        "committed": {str(r.partition): plan.committed.get(r.partition) for r in plan.ranges},
        "committed_by": {str(r.partition): plan.committed_by.get(r.partition) for r in plan.ranges},
        "safe_offsets": {str(p): int(o) for p, o in sorted(safe_offsets.items())},
    }
    return f"{METADATA_KEY} {json.dumps(data, separators=(',', ':'))}"


def parse_metadata(text: str | None) -> dict | None:
    """A publish's ``userMetadata`` back as a dict (partitions as ints); None if not wavepipe's."""
    if not text or not text.startswith(METADATA_KEY + " "):
        return None
    try:
        data = json.loads(text[len(METADATA_KEY) + 1 :])
        for key in ("ranges", "committed", "committed_by", "safe_offsets"):
            data[key] = {int(p): v for p, v in data.get(key, {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return data


def published_runs(path: str, txn_app_id: str, commits: int = HISTORY_COMMITS) -> list[dict]:
    """The publishes of ``txn_app_id`` among the table's newest ``commits``, newest first: each
    ``parse_metadata`` with the table ``version`` it made. Empty when there is no table."""
    if not storage.has_table(path):
        return []
    found = []
    for info in storage.delta_table(path).history(commits):
        data = parse_metadata(info.get("userMetadata"))
        if data is not None and data.get("app_id") == txn_app_id:
            found.append({**data, "table_version": info.get("version")})
    return found


def lost_commit(published: dict | None, positions: dict[int, tuple[int | None, str | None]]) -> dict | None:
    """Whether the group's newest publish (``published_runs``'s first) never reached Kafka:
    the group is still exactly where that run found it when it was planned (every partition's
    committed offset and the run id in its metadata, ``positions``: partition -> (offset, run id))
    and its safe offsets are elsewhere. Then the run's commit was lost (a crash between the table
    commit and the Kafka commit) and the next run goes on from there: ``{"run_id",
    "table_version", "offsets": {partition: [from, to]}, "ranges": its planned ranges}``.
    Anything else (the commit went through, the group was rewound or reset since, a partition
    not in that run) is None: Kafka is the visible progress, and a move of it is honoured.

    One case looks the same and is taken as lost: a reset, by a tool that writes no run id, to
    exactly the offsets that run started from. That run's rows are in the tables already, so the
    reset re-reads nothing there instead of finding them already written."""
    if not published:
        return None
    offsets = {}
    for p, safe in published["safe_offsets"].items():
        if p not in positions or positions[p] != (published["committed"].get(p), published["committed_by"].get(p)):
            return None
        if positions[p][0] != safe:
            offsets[p] = [positions[p][0], safe]
    if not offsets:
        return None
    return {
        "run_id": published["run_id"],
        "table_version": published["table_version"],
        "offsets": offsets,
        "ranges": {p: list(r) for p, r in published["ranges"].items()},
    }


def dead_letters_of(path: str, run_id: str):
    """The dead-letter table's rows that run ``run_id`` published, one batch in memory at a time
    (delta-rs): for a lost commit's dead letters, which its Kafka commit would have sent."""
    import pyarrow.compute as pc

    if not storage.has_table(path):
        return
    dataset = storage.delta_table(path).to_pyarrow_dataset()
    for batch in dataset.to_batches(filter=pc.field("run_id") == run_id, batch_size=256):
        yield from batch.to_pylist()
