"""Keeping the output tables fast under many small runs: compaction, clustering and VACUUM.

Every run appends its own few files to each table it publishes to; after hundreds of
micro-batches a source's hour is spread over hundreds of small files. ``optimize`` rewrites them
into few large ones (Delta ``OPTIMIZE``), optionally clustered by ``source`` and ``start_time``
within each ``date`` partition (``ZORDER BY``, so a read of one source over one hour opens only the
files whose statistics cover that source and hour). ``vacuum`` deletes the files no version within the
retention uses any more. ``status`` reads each table's log (no Spark).

Both commands hold the output tables' lock (``output_lock``) while they change a table, the lock
every run's Spark step holds: no step of a run is writing or reading a table version meanwhile,
so a run in flight never meets a half-compacted table or a file VACUUM deleted (a publish after
an OPTIMIZE sees a newer version and checks its keys against it; nothing is doubled). The
retention (``table_retention_hours``, 168 by default, Delta's own safety check) protects readers
outside wavepipe that still read an older version.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

from wavepipe import delta_protocol, engine_client, storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import UsageError, did_you_mean
from wavepipe.delta_protocol import RepairError
from wavepipe.run_store import RunStore
from wavepipe.spark_apps.app import output_lock

log = logging.getLogger("wavepipe.maintenance")

#: The output tables, as ``wavepipe table ... --table`` names them.
TABLES = ("waveforms", "quarantine", "dead_letter", "qc")
#: ``optimize --zorder``: the waveforms table's rows are clustered by these within each ``date``
#: partition (Z-order: files then cover few sources and a short time each).
CLUSTER_BY = ("source", "start_time")
#: Delta refuses a VACUUM retention shorter than this (``retentionDurationCheck``) unless told.
DELTA_SAFE_RETENTION_H = 168.0
#: Between two tables, maintenance leaves the tables' lock free this long, so that a run's step
#: waiting for it (it tries once a second) goes first instead of waiting for every table.
LOCK_YIELD_S = 1.5


def table_paths(settings: Settings) -> dict[str, str]:
    return {
        "waveforms": settings.output_table,
        "quarantine": settings.quarantine_table,
        "dead_letter": settings.dead_letter_table,
        "qc": settings.qc_table,
    }


def pick_tables(names: list[str] | None) -> list[str]:
    """The tables ``names`` (all when empty), refused before anything runs if one is unknown."""
    for name in names or ():
        if name not in TABLES:
            raise UsageError(f"no table {name!r}{did_you_mean(name, TABLES)} (tables: {', '.join(TABLES)})")
    return [t for t in TABLES if not names or t in names]


def table_list(text) -> list[str] | None:
    """A comma-separated list of table names (a DAG param) as a list; None when empty."""
    if text in (None, ""):
        return None
    if not isinstance(text, str):
        raise UsageError(f"tables {text!r}: must be table names separated by commas")
    names = [n.strip() for n in text.split(",") if n.strip()]
    return names or None


def since_date(since: str | None = None, days: int | None = None, *, today: date | None = None) -> date | None:
    """The first ``date`` partition to optimize: ``since`` (YYYY-MM-DD) or ``days`` back from today
    (UTC; 0: today only); None: every partition. Refused when it cannot be read or both are given."""
    if since not in (None, "") and days is not None:
        raise UsageError("give --since or --days, not both")
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, int) or days < 0:
            raise UsageError(f"days {days!r}: must be 0 (today) or more days back")
        return (today or datetime.now(UTC).date()) - timedelta(days=days)
    if since in (None, ""):
        return None
    try:
        return date.fromisoformat(str(since))
    except ValueError:
        raise UsageError(f"since {since!r}: must be a date, YYYY-MM-DD") from None


def check_retention(hours) -> float:
    """``hours`` as a VACUUM retention, or refused (a number, 0 or more)."""
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not hours >= 0 or hours == float("inf"):
        raise UsageError(f"retention {hours!r}: must be 0 or more hours")
    return float(hours)


@dataclass
class TableStatus:
    """One table as its log and its folder say. ``files_per_partition_max``: the most data files
    one partition holds (1 after a full compaction); ``unreferenced_*``: files on disk no version
    of the table uses now (removed by a compaction, an overwrite or a failed write): VACUUM
    deletes those older than the retention."""

    table: str
    path: str
    version: int | None = None
    rows: int | None = None
    partition_columns: list[str] | None = None
    files: int = 0
    bytes: int = 0
    partitions: int = 0
    files_per_partition_max: int = 0
    #: partitions holding more than one file: what ``optimize`` compacts
    partitions_to_compact: int = 0
    unreferenced_files: int = 0
    unreferenced_bytes: int = 0
    last_optimize: str | None = None
    last_vacuum: str | None = None
    note: str | None = None


def _data_files(path: str) -> dict[str, tuple[int, float]]:
    """The table's data files in its folder (relative path -> (bytes, modified at)), not its log."""
    if storage.is_remote(path):
        return {
            f.path: (f.size, f.modified_ms / 1000)
            for f in storage.written_files(path, "")
            if not f.path.startswith(("_", ".")) and "/_" not in f.path and "/." not in f.path
        }
    found = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in names:
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                full = Path(root) / name
                with contextlib.suppress(FileNotFoundError):
                    st = full.stat()
                    found[str(full.relative_to(path))] = (st.st_size, st.st_mtime)
    return found


def _when(ms: int | None) -> str | None:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds") if ms else None


def _last(state, operation: str) -> str | None:
    """When ``operation`` last committed; None if never, or how far back that was looked for."""
    from wavepipe.spark_apps.tables import HISTORY_COMMITS

    if operation in state.last:
        return _when(state.last[operation])
    return f"not in the last {HISTORY_COMMITS} commits" if state.version + 1 > HISTORY_COMMITS else None


def _unreadable_note(path: str) -> str:

    try:
        problems = delta_protocol.schema_problems(path)
    except (delta_protocol.RepairError, OSError, ValueError) as exc:
        return f"its log cannot be read ({exc})"
    if problems:
        return (
            f"delta-rs, Polars and Trino cannot open it: {len(problems)} column type(s) the Delta protocol does "
            f"not define ({', '.join(problems[:3])}{', ...' if len(problems) > 3 else ''}); run `wavepipe table repair`"
        )
    return "delta-rs cannot read its log (see the warning above); Spark may still read it"


def files_per_partition(state) -> dict[str, int]:
    """Live data files per partition (``date=2026-11-25``; ``""`` for an unpartitioned table), by
    their partition values, wherever their folder is (each append writes a folder of its own)."""
    counts: dict[str, int] = {}
    for p in state.files:
        partition = state.partition_of[p]
        counts[partition] = counts.get(partition, 0) + 1
    return counts


def _partition_values(folder: str) -> dict[str, str]:
    """``source=a/date=2026-11-25`` -> ``{"source": "a", "date": "2026-11-25"}``."""
    return dict(part.split("=", 1) for part in folder.split("/") if "=" in part)


def compaction_plan(state, since: date | None = None) -> tuple[list[str], list[str]]:
    """The partition folders ``optimize`` rewrites (those holding more than one file, with a
    ``date`` from ``since`` on when given) and those it leaves for being older than ``since``."""
    crowded = sorted(f for f, n in files_per_partition(state).items() if n > 1)
    if since is None:
        return crowded, []
    recent = [f for f in crowded if _partition_values(f).get("date", "9999-12-31") >= since.isoformat()]
    return recent, [f for f in crowded if f not in recent]


def partition_predicate(folders: list[str]) -> str:
    """An OPTIMIZE ``WHERE`` selecting exactly these partition folders ("" for the whole table)."""
    terms = []
    for folder in folders:
        values = _partition_values(folder)
        if not values:
            return ""
        quoted = " AND ".join(f"`{k}` = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in values.items())
        terms.append(f"({quoted})")
    return " OR ".join(terms)


def table_status(name: str, path: str) -> TableStatus:
    from wavepipe.spark_apps.tables import delta_log

    status = TableStatus(table=name, path=str(path))
    if not storage.has_table(path):
        status.note = "no table yet (no run has published to it)"
        return status
    state = delta_log(path, history=True)
    if state is None:
        status.note = _unreadable_note(path)
        return status
    live = {unquote(p): size for p, (size, _) in state.files.items()}
    per_partition = files_per_partition(state)
    on_disk = _data_files(path)
    extra = {p: v for p, v in on_disk.items() if p not in live}
    status.version, status.rows = state.version, state.rows
    status.partition_columns = state.partition_columns
    status.files, status.bytes = len(live), sum(live.values())
    status.partitions = len(per_partition)
    status.files_per_partition_max = max(per_partition.values(), default=0)
    status.partitions_to_compact = sum(n > 1 for n in per_partition.values())
    status.unreferenced_files, status.unreferenced_bytes = len(extra), sum(size for size, _ in extra.values())
    status.last_optimize = _last(state, "OPTIMIZE")
    status.last_vacuum = _last(state, "VACUUM END")
    if name == "waveforms" and state.partition_columns != layout():
        status.note = (
            f"partitioned by {', '.join(state.partition_columns) or 'nothing'}: each run writes a file per source it "
            f"carries; `wavepipe table repair` lays it out by {', '.join(layout())}"
        )
    return status


def status(settings: Settings, tables: list[str] | None = None) -> list[TableStatus]:
    """Each output table's version, rows, live files and bytes, how scattered its partitions are,
    what VACUUM could delete, and when it was last compacted and vacuumed; no Spark."""
    paths = table_paths(settings)
    return [table_status(name, paths[name]) for name in pick_tables(tables)]


#: ``compact_small``: a file under this size is small, and the rewritten ones are about this size.
SMALL_FILE_BYTES = 64 * 2**20


def small_files_per_partition(state, small_bytes: int = SMALL_FILE_BYTES) -> dict[str, int]:
    """Per partition (as ``files_per_partition``), its live files under ``small_bytes``."""
    counts: dict[str, int] = {}
    for p, (size, _) in state.files.items():
        if size < small_bytes:
            counts[state.partition_of[p]] = counts.get(state.partition_of[p], 0) + 1
    return counts


def crowded_partitions(state, min_files: int, small_bytes: int = SMALL_FILE_BYTES) -> list[str]:
    """The partitions holding ``min_files`` small files or more (none when ``min_files`` is 0)."""
    counts = small_files_per_partition(state, small_bytes)
    return sorted(p for p, n in counts.items() if min_files and n >= min_files)


def tables_written(outcome: dict) -> list[str]:
    """The tables a committed run's ``outcome`` (its report's) added rows to: its waveforms and
    their ``qc`` hours, its quarantined waveforms, its dead letters."""
    written = (outcome.get("new") or 0) + (outcome.get("rewritten") or 0)
    wrote = {
        "waveforms": written,
        "qc": written,
        "quarantine": outcome.get("quarantined") or 0,
        "dead_letter": outcome.get("dead_letter_records") or 0,
    }
    return [name for name in TABLES if wrote[name]]


def compact_small(settings: Settings, names: list[str]) -> list[dict]:
    """After a run's commit: in each table of ``names``, each partition holding
    ``compact_after_files`` small files or more has them rewritten into few (delta-rs's compaction:
    one commit per partition that changes no row, no Spark job). Only then is the tables' lock
    taken, and only if it is free at once (a run's step or the maintenance DAG holding it: nothing
    is done, the next run tries again), so no run writes meanwhile. Returns what each compaction did."""
    crowded = _crowded(settings, names)  # read from the logs, no lock: most runs stop here
    if not crowded:
        return []
    paths, done = table_paths(settings), []
    with output_lock(settings, RunStore(settings), wait_s=0.0, what="a run's compaction"):
        for name, folder in _crowded(settings, sorted({name for name, _ in crowded})):  # as they are now
            done.append({"table": name, "partition": folder, **_compact_partition(paths[name], folder)})
    return done


def _crowded(settings: Settings, names: list[str]) -> list[tuple[str, str]]:
    """``(table, partition)`` of each partition of tables ``names`` that ``compact_small`` rewrites."""
    from wavepipe.spark_apps.tables import delta_log

    if not settings.compact_after_files:
        return []
    paths, found = table_paths(settings), []
    for name in names:
        state = delta_log(paths[name])  # None: no table yet, or one delta-rs cannot read
        if state is not None:
            found += [(name, folder) for folder in crowded_partitions(state, settings.compact_after_files)]
    return found


def _compact_partition(path: str, folder: str) -> dict:
    """delta-rs's compaction of the partition ``folder`` of the table at ``path``, one task."""
    began = time.monotonic()
    values = _partition_values(folder)
    table = storage.delta_table(path)
    metrics = table.optimize.compact(
        partition_filters=[(k, "=", v) for k, v in values.items()] or None,
        target_size=SMALL_FILE_BYTES,
        max_concurrent_tasks=1,
    )
    return {
        "files_removed": int(metrics["numFilesRemoved"]),
        "files_added": int(metrics["numFilesAdded"]),
        "version": table.version(),
        "seconds": round(time.monotonic() - began, 3),
    }


@contextlib.contextmanager
def _writing(settings: Settings, what: str) -> Iterator[object]:
    """A Spark session that holds the output tables as their sole writer (as a run's Spark step
    does): waits for a run's step that holds them, interrupts what a dead one left running."""
    with output_lock(settings, RunStore(settings)):
        log.info("%s: holding the tables in %s", what, settings.tables_dir)
        with engine_client.table_session(settings) as spark, engine_client.sole_writer(spark, settings):
            yield spark
    time.sleep(LOCK_YIELD_S)


def _sql_path(path: str) -> str:
    return "delta.`" + storage.for_spark(path).replace("`", "``") + "`"


def _existing(settings: Settings, tables: list[str] | None, done: list[dict]) -> Iterator[tuple[str, str]]:
    """(name, path) of each chosen table that exists; the others are recorded in ``done`` as skipped."""
    paths = table_paths(settings)
    for name in pick_tables(tables):
        if not storage.has_table(paths[name]):
            done.append({"table": name, "skipped": "no table yet"})
            continue
        yield name, paths[name]


def optimize(
    settings: Settings, *, tables: list[str] | None = None, zorder: bool = False, since: date | None = None
) -> list[dict]:
    """Compact each table (``tables``: all when None) with Delta ``OPTIMIZE``, in the partitions
    that need it: those holding more than one file (read from the log, no Spark); a partition
    already in one file is left alone, and a table with none to compact is not touched.
    ``zorder``: those partitions' waveforms are also clustered by ``CLUSTER_BY``. ``since``: only
    the waveforms' ``date`` partitions from that day on (the result names the older ones left).
    Returns what each table's compaction did, or why it did nothing (``skipped``)."""
    from wavepipe.spark_apps.tables import delta_log

    done = []
    for name, path in _existing(settings, tables, done):
        state = delta_log(path)
        if state is None:
            done.append({"table": name, "skipped": _unreadable_note(path)})
            continue
        chosen, older = compaction_plan(state, since if name == "waveforms" else None)
        if not chosen:
            done.append(_nothing_to_compact(name, state, older, since))
            log.info("optimize %s: %s", name, done[-1]["skipped"])
            continue
        done.append(_compact(settings, name, path, chosen, zorder=zorder and name == "waveforms"))
        if older:
            done[-1]["left_older"] = len(older)
    return done


def _nothing_to_compact(name: str, state, older: list[str], since: date | None) -> dict:
    counts = files_per_partition(state)
    what = f"{len(counts)} partition(s), {sum(counts.values())} file(s)"
    if older:
        why = (
            f"the {len(older)} partition(s) with several files are dated before {since.isoformat()} "
            f"({', '.join(older[:3])}{', ...' if len(older) > 3 else ''}): compact them with no day limit "
            "(DAG param days empty, or `wavepipe table optimize` without --days)"
        )
    else:
        why = "each holds one file, nothing to compact"
    return {"table": name, "skipped": f"{what}: {why}", "files_before": sum(counts.values()), "left_older": len(older)}


def _compact(settings: Settings, name: str, path: str, folders: list[str], *, zorder: bool) -> dict:
    """``OPTIMIZE`` of ``folders`` of one table, under the tables' lock."""
    sql = f"OPTIMIZE {_sql_path(path)}"
    where = partition_predicate(folders)
    if where:
        sql += f" WHERE {where}"
    if zorder:
        sql += f" ZORDER BY ({', '.join(CLUSTER_BY)})"
    with _writing(settings, f"optimize {name}") as spark:
        before = table_status(name, path)  # under the lock: no run adds files meanwhile
        began = time.monotonic()
        metrics = spark.sql(sql).collect()[0]["metrics"]
        seconds = time.monotonic() - began
        after = table_status(name, path)
    result = {
        "table": name,
        "sql": sql,
        "seconds": round(seconds, 2),
        "files_removed": int(metrics["numFilesRemoved"]),
        "files_added": int(metrics["numFilesAdded"]),
        "bytes_removed": int(metrics["filesRemoved"]["totalSize"] or 0),
        "bytes_added": int(metrics["filesAdded"]["totalSize"] or 0),
        "partitions_optimized": int(metrics["partitionsOptimized"]),
        "files_before": before.files,
        "files_after": after.files,
        "version": after.version,
    }
    log.info(
        "optimize %s: %d files -> %d (%d rewritten into %d, %d partition(s) of %d) in %.1fs%s",
        name,
        before.files,
        after.files,
        result["files_removed"],
        result["files_added"],
        result["partitions_optimized"],
        before.partitions,
        seconds,
        f", clustered by {', '.join(CLUSTER_BY)}" if zorder else "",
    )
    return result


@contextlib.contextmanager
def _retention_check_off(spark, hours: float) -> Iterator[None]:
    """Delta refuses a retention under ``DELTA_SAFE_RETENTION_H``: with the user's shorter one,
    its check is turned off for this command only (wavepipe's own runs are safe under the lock)."""
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    if hours >= DELTA_SAFE_RETENTION_H:
        yield
        return
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        spark.conf.unset(key)


def vacuum(
    settings: Settings,
    *,
    tables: list[str] | None = None,
    retention_hours: float | None = None,
    dry_run: bool = False,
) -> list[dict]:
    """Delete each table's files that no version within ``retention_hours`` (default: the setting
    ``table_retention_hours``) uses (Delta ``VACUUM``); ``dry_run``: only count them. A retention
    under 168 hours is allowed (and logged): a reader outside wavepipe still reading a version
    older than that may then fail; wavepipe's runs never do (they wait for the lock). A table
    whose folder holds no file outside its current version is skipped, without a Spark job (an
    empty one, or one vacuumed since its last change)."""
    hours = check_retention(settings.table_retention_hours if retention_hours is None else retention_hours)
    names = pick_tables(tables)
    if hours < DELTA_SAFE_RETENTION_H:
        log.warning(
            "vacuum with a retention of %g h (under Delta's %g h): a query outside wavepipe reading a "
            "version older than that can fail; wavepipe's own runs are not affected",
            hours,
            DELTA_SAFE_RETENTION_H,
        )
    done = []
    for name, path in _existing(settings, names, done):
        if not table_status(name, path).unreferenced_files:  # read from its log and folder: no Spark job
            done.append(
                {"table": name, "skipped": "every file in its folder is in its current version: nothing to delete"}
            )
            continue
        sql = f"VACUUM {_sql_path(path)} RETAIN {hours:g} HOURS" + (" DRY RUN" if dry_run else "")
        with _writing(settings, f"vacuum {name}") as spark, _retention_check_off(spark, hours):
            before = _data_files(path)  # under the lock: no run adds files meanwhile
            began = time.monotonic()
            rows = spark.sql(sql).collect()
            seconds = time.monotonic() - began
            after = _data_files(path)
        if dry_run:
            doomed = {storage.for_clients(str(r[0]).removeprefix("file:")) for r in rows}
            gone = {p: v for p, v in before.items() if storage.join(storage.for_clients(path), p) in doomed}
        else:
            gone = {p: v for p, v in before.items() if p not in after}
        result = {
            "table": name,
            "sql": sql,
            "seconds": round(seconds, 2),
            "dry_run": dry_run,
            "retention_hours": hours,
            "files_deleted": len(gone),
            "bytes_deleted": sum(size for size, _ in gone.values()),
            "unreferenced_left": table_status(name, path).unreferenced_files,
        }
        log.info(
            "vacuum %s: %s %d file(s), %.1f MB, older than %g h, in %.1fs (%d unreferenced left, newer)",
            name,
            "would delete" if dry_run else "deleted",
            result["files_deleted"],
            result["bytes_deleted"] / 1e6,
            hours,
            seconds,
            result["unreferenced_left"],
        )
        done.append(result)
    return done


def as_dicts(statuses: list[TableStatus]) -> list[dict]:
    return [asdict(s) for s in statuses]


#: A re-layout writes files of about this size (payloads; Delta's own OPTIMIZE target is 1 GB).
RELAYOUT_FILE_BYTES = 256 * 1024 * 1024


def layout() -> list[str]:
    """The waveforms table's partition columns, as runs create it (``TABLE_KEYS``)."""
    from wavepipe.spark_apps.tables import TABLE_KEYS

    return list(TABLE_KEYS["waveforms"][1])


def _relayout(spark, path: str) -> dict:
    """Rewrite the waveforms table partitioned by ``layout()`` in one commit, clustered by
    ``CLUSTER_BY`` within each day (the rows, their columns and the history are kept)."""
    from wavepipe.spark_apps.tables import delta_log, delta_writer, read_delta

    before = delta_log(path)
    if before is None:
        raise RepairError(f"{path}: delta-rs cannot read its log (see the warning above); nothing was rewritten")
    by = layout()
    frame = read_delta(spark, path, before.version)
    files = max(1, -(-sum(size for size, _ in before.files.values()) // RELAYOUT_FILE_BYTES))
    began = time.monotonic()
    (
        delta_writer(frame.repartitionByRange(files, *by, *CLUSTER_BY).sortWithinPartitions(*by, *CLUSTER_BY))
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .partitionBy(*by)
        .save(storage.for_spark(path))
    )
    after = delta_log(path)
    return {
        "relaid_from": before.partition_columns,
        "files_before": len(before.files),
        "files_after": len(after.files),
        "rows": after.rows,
        "relayout_s": round(time.monotonic() - began, 2),
        "version": after.version,
    }


def repair(settings: Settings, *, tables: list[str] | None = None, dry_run: bool = False) -> list[dict]:
    """Make each table readable by every Delta reader (``delta_protocol.repair_schema``: one
    metadata-only commit), add the columns this wavepipe writes that it lacks (``_add_columns``:
    another), and lay the waveforms table out by day (``_relayout``: its rows rewritten once, in
    one commit) if an earlier wavepipe partitioned it by source and day. What an earlier wavepipe
    left is mended here, never by a run (a run meeting it is refused, naming this command).
    Holds the tables' lock as optimize does: safe beside runs. ``dry_run``: only say what it would do."""
    done = []
    for name, path in _existing(settings, tables, done):
        with output_lock(settings, RunStore(settings)):
            result = {"table": name, "dry_run": dry_run, "schema": delta_protocol.repair_schema(path, dry_run=dry_run)}
            result["columns"] = _add_columns(name, path, dry_run)
            was = _partition_columns(path)
            if name == "waveforms" and was != layout():
                result["layout"] = {"relaid_from": was, "dry_run": True}
        if "layout" in result and not dry_run:
            with _writing(settings, f"repair {name}") as spark:
                result["layout"] = _relayout(spark, path)
        log.info("repair %s: %s", name, repair_line(result))
        done.append(result)
    return done


def _add_columns(name: str, path: str, dry_run: bool) -> list[str]:
    """The columns table ``name`` at ``path`` lacks of those this wavepipe writes into it, added
    (unless ``dry_run``) in one metadata-only commit."""
    from wavepipe.spark_apps.publish import EMPTY_TABLES
    from wavepipe.spark_apps.tables import add_columns

    if not dry_run:  # its types are the protocol's by now: delta-rs opens it
        return add_columns(storage.delta_table(path), EMPTY_TABLES[name])
    if storage.is_remote(path):
        have = set(storage.delta_table(path).schema().to_arrow().names)
    else:  # read from the log: a table still to be repaired does not open in delta-rs
        have = {f["name"] for f in json.loads(delta_protocol.latest_metadata(path)[1]["schemaString"])["fields"]}
    return [f.name for f in EMPTY_TABLES[name] if f.nullable and f.name not in have]


def _partition_columns(path: str) -> list[str]:

    if storage.is_remote(path):  # written with the protocol's types: delta-rs reads it
        return list(storage.delta_table(path).metadata().partition_columns)
    return list(delta_protocol.latest_metadata(path)[1].get("partitionColumns") or [])


def repair_line(result: dict) -> str:
    parts = []
    if result.get("schema"):
        fixed = result["schema"]
        verb = "would repair" if fixed["dry_run"] else f"repaired in commit {fixed['version']}"
        parts.append(f"{verb} {len(fixed['columns'])} column type(s) ({', '.join(fixed['columns'])})")
    if result.get("columns"):
        verb = "would add" if result.get("dry_run") else "added"
        parts.append(f"{verb} {len(result['columns'])} column(s) ({', '.join(result['columns'])})")
    if result.get("layout"):
        lay = result["layout"]
        if lay.get("dry_run"):
            parts.append(f"would lay it out by {', '.join(layout())} (partitioned by {', '.join(lay['relaid_from'])})")
        else:
            parts.append(
                f"laid out by {', '.join(layout())} (was {', '.join(lay['relaid_from'])}): {lay['files_before']} files -> "
                f"{lay['files_after']}, {lay['rows']} rows, in {lay['relayout_s']}s (commit {lay['version']})"
            )
    return "; ".join(parts) or "nothing to do (readable by every Delta reader, every column, laid out by date)"
