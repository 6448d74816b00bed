"""Delta tables every reader can open: the types the Delta protocol defines, and the in-place repair
of a table whose log holds others.

Over the Spark Connect engine (pyspark 4.2), wavepipe up to 77ad3ff wrote every string column of
its tables into the log as ``string collate UTF8_BINARY``: no Delta type, so delta-rs, Polars and
Trino refuse the table while Spark reads it (``spark_apps/tables.protocol_types`` keeps new writes
right). ``repair_schema`` writes one commit that carries the same
metadata with ``string`` instead (UTF8_BINARY is plain byte-wise comparison: the same column). No
data file is touched, the history stays (time travel, ``DESCRIBE HISTORY``), and so do the
tables' transaction ids, which make a run's publish idempotent.

The commit is made as Delta's own local log store makes one: written beside the log, then linked
to the next version's name, which fails if any writer committed that version first (then the
metadata is read again). Callers hold the output tables' lock, so no wavepipe run writes
meanwhile. A writer outside wavepipe whose transaction read the old metadata meets Delta's rule
for a concurrent metadata change (its commit is refused); that is Delta's behaviour, not something
wavepipe's tests exercise. Local tables only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from pathlib import Path

import tenacity

from wavepipe import storage
from wavepipe.contracts.errors import StepFailedError

log = logging.getLogger("wavepipe.delta_protocol")

#: The protocol's primitive types (PROTOCOL.md, "Primitive Types"); ``decimal(p,s)`` below.
PRIMITIVE_TYPES = frozenset(
    {"string", "long", "integer", "short", "byte", "float", "double", "boolean", "binary", "date", "timestamp"}
)
#: Types the protocol defines behind a table feature, and that feature's name.
FEATURE_TYPES = {"timestamp_ntz": "timestampNtz", "variant": "variantType"}
_DECIMAL = re.compile(r"decimal\(\s*\d+\s*,\s*\d+\s*\)")
#: What Spark Connect wrote for a plain string: the default, byte-wise collation, named.
_BINARY_COLLATED = re.compile(r"string\s+collate\s+(?:[\w]+\.)*utf8_binary", re.IGNORECASE)


class RepairError(StepFailedError):
    """A table's log cannot be repaired here (what to do is in the message)."""


def type_errors(schema: dict, features: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Every column (``a.b``, ``a[]``, ``m{key}``) of the Delta ``schema`` (its ``schemaString``,
    parsed) whose type the protocol does not define, with that type; ``features``: the table's
    reader and writer features (a feature type is valid only with its feature)."""
    errors: list[str] = []

    def walk(kind, where: str) -> None:
        if isinstance(kind, str):
            if kind in PRIMITIVE_TYPES or _DECIMAL.fullmatch(kind) or FEATURE_TYPES.get(kind) in features:
                return
            errors.append(f"{where or '<schema>'}: {kind!r}")
        elif isinstance(kind, dict) and kind.get("type") == "struct":
            for f in kind.get("fields") or []:
                walk(f.get("type"), f"{where}.{f.get('name')}" if where else str(f.get("name")))
        elif isinstance(kind, dict) and kind.get("type") == "array":
            walk(kind.get("elementType"), f"{where}[]")
        elif isinstance(kind, dict) and kind.get("type") == "map":
            walk(kind.get("keyType"), f"{where}{{key}}")
            walk(kind.get("valueType"), f"{where}{{value}}")
        else:
            errors.append(f"{where or '<schema>'}: {json.dumps(kind)}")

    walk(schema, "")
    return errors


def fixed_schema(schema: dict) -> dict:
    """``schema`` with every ``string collate UTF8_BINARY`` as ``string`` (the same values and
    comparisons); anything else is kept as it is."""
    if isinstance(schema, str):
        return "string" if _BINARY_COLLATED.fullmatch(schema.strip()) else schema
    if isinstance(schema, dict):
        return {
            k: fixed_schema(v) if k in ("type", "elementType", "keyType", "valueType", "fields") else v
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [fixed_schema(v) for v in schema]
    return schema


def table_features(protocol: dict) -> set[str]:
    return set(protocol.get("readerFeatures") or []) | set(protocol.get("writerFeatures") or [])


def _versions(log_dir: str, pattern: re.Pattern) -> list[int]:
    return sorted({int(m.group(1)) for f in storage.list_names(log_dir) if (m := pattern.fullmatch(f))})


_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.\d{10}\.\d{10}|\.[0-9a-fA-F-]{36})?\.(?:parquet|json)")


def _checkpoint_actions(log_dir: str, version: int) -> dict[str, dict]:
    """The ``metaData`` and ``protocol`` of the checkpoint at ``version`` (classic, multi-part or
    v2: they are in its top-level files)."""
    import pyarrow.parquet as pq

    found: dict[str, dict] = {}
    for name in storage.list_names(log_dir):
        if not (name.startswith(f"{version:020d}.checkpoint") and _CHECKPOINT.fullmatch(name)):
            continue
        where = storage.join(log_dir, name)
        if name.endswith(".json"):
            rows = [json.loads(line) for line in storage.read_text(where).splitlines() if line.strip()]
        else:
            with storage.open_file(where) as file:
                columns = [c for c in ("metaData", "protocol") if c in pq.read_schema(file).names]
                rows = pq.read_table(file, columns=columns).to_pylist()
        for row in rows:
            found.update({k: v for k, v in row.items() if k in ("metaData", "protocol") and v})
    return found


def latest_metadata(path: Path) -> tuple[int, dict, dict]:
    """(the table's latest version, its ``metaData`` action, its ``protocol`` action), read from
    the newest commits back to the newest checkpoint (the two actions only: this reads tables that
    no protocol-following reader opens)."""
    log_dir = storage.join(str(path), "_delta_log")
    commits = _versions(log_dir, _COMMIT)
    if not commits:
        raise RepairError(f"{path} is not a Delta table (no commits in {log_dir})")
    latest = commits[-1]
    checkpoints = [v for v in _versions(log_dir, _CHECKPOINT) if v <= latest]
    floor = checkpoints[-1] if checkpoints else -1
    found: dict[str, dict] = {}
    for version in (v for v in reversed(commits) if v > floor):
        for line in storage.read_text(storage.join(log_dir, f"{version:020d}.json")).splitlines():
            action = json.loads(line) if line.strip() else {}
            for kind in ("metaData", "protocol"):
                if kind in action:
                    found.setdefault(kind, action[kind])
        if len(found) == 2:
            break
    if len(found) < 2 and floor >= 0:
        for kind, action in _checkpoint_actions(log_dir, floor).items():
            found.setdefault(kind, action)
    if len(found) < 2:
        raise RepairError(
            f"{path}: its log's metadata or protocol is missing (commits cleaned up without a checkpoint)"
        )
    return latest, found["metaData"], found["protocol"]


def schema_problems(path: Path) -> list[str]:
    """The columns of the table at ``path`` whose logged types the protocol does not define."""
    _, meta, protocol = latest_metadata(path)
    return type_errors(json.loads(meta["schemaString"]), table_features(protocol))


def _commit_next(log_dir: Path, version: int, actions: list[dict]) -> bool:
    """Write ``actions`` as commit ``version`` if no writer has: False if one has."""
    tmp = log_dir / f".{version:020d}.json.{uuid.uuid4().hex}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions))
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, log_dir / f"{version:020d}.json")
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def repair_schema(path: Path, *, dry_run: bool = False, attempts: int = 3) -> dict | None:
    """Make the table at ``path`` readable by every Delta reader, in one metadata-only commit;
    None when it already is. Returns what was (or, ``dry_run``, would be) changed. Another writer's
    commit in between makes it read the table again, up to ``attempts`` times.

    A table on an object store needs none: only a local table written by wavepipe up to 77ad3ff
    can hold the types this repairs, and object stores came later."""
    if storage.is_remote(str(path)):
        return None

    def given_up(state: tenacity.RetryCallState) -> None:
        raise RepairError(f"{path}: other writers kept committing; stop them and repair again")

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        retry=tenacity.retry_if_result(lambda outcome: outcome is _LOST_RACE),
        retry_error_callback=given_up,
    )
    return retrying(_repair_at_latest, path, dry_run)


#: What ``_repair_at_latest`` returns when another writer took the version it was to commit.
_LOST_RACE = object()


def _repair_at_latest(path: Path, dry_run: bool) -> dict | object | None:
    """One ``repair_schema`` attempt on the table's latest version (``_LOST_RACE``: another
    commit took the next version first)."""
    version, meta, protocol = latest_metadata(path)
    schema = json.loads(meta["schemaString"])
    problems = type_errors(schema, table_features(protocol))
    if not problems:
        return None
    fixed = fixed_schema(schema)
    left = type_errors(fixed, table_features(protocol))
    if left:
        raise RepairError(
            f"{path}: types wavepipe did not write and cannot repair: {'; '.join(left)}; "
            "rewrite the table with the engine that wrote it"
        )
    if "inCommitTimestamp" in table_features(protocol):
        raise RepairError(f"{path}: has in-commit timestamps, which this repair does not write")
    result = {"version_before": version, "columns": problems, "dry_run": dry_run}
    if dry_run:
        return result
    info = {
        "timestamp": int(time.time() * 1000),
        "operation": "REPAIR SCHEMA",
        "operationParameters": {"columns": json.dumps(problems)},
        "readVersion": version,
        "isBlindAppend": False,
        "engineInfo": "wavepipe delta_protocol.repair_schema",
    }
    repaired = {**meta, "schemaString": json.dumps(fixed, separators=(",", ":"))}
    if not _commit_next(Path(path) / "_delta_log", version + 1, [{"commitInfo": info}, {"metaData": repaired}]):
        return _LOST_RACE
    log.info("repaired %s: %d column type(s) in commit %d (no data file rewritten)", path, len(problems), version + 1)
    return {**result, "version": version + 1}
