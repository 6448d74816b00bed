"""One configuration model for the CLI, the DAGs and the tests.

Precedence, lowest first: the documented defaults below, a TOML file (``WAVEPIPE_CONFIG`` or
``wavepipe.toml`` in the project root / current directory), then environment variables
``WAVEPIPE_<FIELD>`` (upper case, e.g. ``WAVEPIPE_HOME``, ``WAVEPIPE_BOOTSTRAP_SERVERS``), then
explicit overrides passed by the caller (CLI flags, DAG params).

All local state lives under ``home``; moving that one setting moves Kafka's data, plans,
staging, output and reports together.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Settings:
    """Every knob wavepipe has, with its default."""

    #: Folder for all local state (git-ignored). Default: ``<project root>/.wavepipe``.
    home: Path = PROJECT_ROOT / ".wavepipe"
    #: Kafka bootstrap servers. The local broker started by ``wavepipe kafka up`` listens here.
    bootstrap_servers: str = "127.0.0.1:9092"
    #: Extra librdkafka properties for every client (TLS, SASL, ...), as a JSON object or table.
    kafka_client_config: Mapping[str, Any] = field(default_factory=dict)
    #: Topic holding the chunked waveforms, and how many partitions it is created with.
    topic: str = "waveforms"
    partitions: int = 4
    #: When wavepipe creates the topic (``produce``, ``demo``): its replication factor (-1: the
    #: cluster's ``default.replication.factor``) and topic configs, e.g. ``{"min.insync.replicas":
    #: "2"}`` on a 3-broker cluster. An existing topic is used as it is.
    topic_replication_factor: int = -1
    topic_config: Mapping[str, Any] = field(default_factory=dict)
    #: Consumer group whose committed offsets are the progress of the ingest.
    group: str = "wavepipe-ingest"
    #: Caps on the records new to a run, per partition. 0 means no cap. ``max_bytes_per_partition``
    #: is converted to a record cap at ``chunk_size`` bytes per record. When a waveform longer
    #: than the cap is pending, the next run's range grows by the cap beyond the last run's end.
    max_records_per_partition: int = 0
    max_bytes_per_partition: int = 0
    #: Payload bytes per chunk produced by the chunking producer.
    chunk_size: int = 64 * 1024
    #: Producer batching.
    linger_ms: int = 20
    batch_size: int = 1024 * 1024
    #: Spark master for the reassembly app; extra ``--conf`` pairs for spark-submit.
    spark_master: str = "local[2]"
    spark_driver_memory: str = "2g"
    spark_conf: Mapping[str, Any] = field(default_factory=dict)
    #: A run whose staged chunk files total at most this many bytes starts its Spark app's driver
    #: JVM for a short life (``SMALL_RUN_JAVA_OPTIONS``: no C2 JIT, serial GC): on a run of a few
    #: waveforms that halves the CPU the app burns. 0 turns it off; larger runs keep the defaults.
    spark_small_run_bytes: int = 64 * 1024 * 1024
    #: Rows per Parquet row group while staging (bounds the reader's memory).
    staging_flush_bytes: int = 64 * 1024 * 1024
    #: Seconds a reader may see no progress before it gives up with an error.
    reader_stall_timeout_s: float = 60.0
    #: Partitions read at once (one process each) by ``wavepipe run``, and by one consume task of
    #: the DAG that holds several partitions (``consume_tasks``). How many mapped consume tasks run
    #: together is Airflow's parallelism.
    consume_parallelism: int = 2
    #: In the DAG, how many mapped consume tasks a run's partitions are spread over (each task reads
    #: its partition group with ``consume_parallelism`` processes). 0: one task per partition. Set it
    #: near the number of Airflow worker slots when a topic has many more partitions than workers.
    consume_tasks: int = 0
    #: A waveform still missing chunks is quarantined as ``incomplete`` once its partition has
    #: moved this many offsets, or this many seconds of record time, past its newest chunk (so it
    #: cannot hold the partition's commit back forever). 0 turns a limit off. Record time is what
    #: producers stamp (CreateTime) unless the topic uses LogAppendTime: a producer replaying old
    #: recordings with their own timestamps would age its waveforms at once, so the time limit
    #: is off by default; turn it on where timestamps are send times.
    incomplete_after_offsets: int = 100_000
    incomplete_after_s: float = 0.0
    #: Waveforms larger than this (by their header or by their chunks) are quarantined as
    #: ``too_large`` from their metadata alone, never assembled. At most 1 GiB (a Spark row).
    max_waveform_bytes: int = 256 * 1024 * 1024
    #: Also publish each run's dead letters to this Kafka topic (original key, value and headers,
    #: plus ``wp-dlq-*`` headers with the reason), in one transaction with the run's offset commit.
    #: Empty: the dead-letter Delta table only (which is always written).
    dead_letter_topic: str = ""
    #: Thresholds of the validation gate (the suites are code: ``wavepipe/expectations.py``). A run
    #: whose output breaks one is not published and commits nothing until it passes (after the data
    #: is fixed, or a threshold here is relaxed, the validate step is retried).
    #: Sample rate bounds in Hz, inclusive.
    validate_sample_rate_min: float = 1e-3
    validate_sample_rate_max: float = 1e9
    #: Start-time bounds: not before this ISO-8601 UTC instant, and not more than this many seconds
    #: after the moment of validation (clock skew of the producers).
    validate_start_time_min: str = "1900-01-01T00:00:00Z"
    validate_start_time_max_ahead_s: float = 86_400.0
    #: |duration_s - n_samples / sample_rate| allowed, in seconds.
    validate_duration_tolerance_s: float = 1e-6
    #: Fraction of rows that must meet each row-level expectation (1.0: every row). Uniqueness,
    #: checksums and planned offset ranges are always required of every row.
    validate_mostly: float = 1.0
    #: Runs shown in the validation trend (report page and ``wavepipe status``).
    report_trend_runs: int = 20
    #: ``wavepipe airflow up``: the Airflow API server (UI and REST API) listens on 127.0.0.1 here.
    airflow_port: int = 8080

    # --- derived locations -------------------------------------------------------------------
    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def groups_dir(self) -> Path:
        return self.home / "groups"

    @property
    def staging_dir(self) -> Path:
        return self.home / "staging"

    @property
    def tables_dir(self) -> Path:
        return self.home / "tables"

    @property
    def output_table(self) -> Path:
        return self.tables_dir / "waveforms"

    @property
    def quarantine_table(self) -> Path:
        return self.tables_dir / "quarantine"

    @property
    def dead_letter_table(self) -> Path:
        return self.tables_dir / "dead_letter"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    @property
    def gx_dir(self) -> Path:
        """Great Expectations' file context: suites as stored by GX, results, Data Docs."""
        return self.home / "gx"

    @property
    def audit_dir(self) -> Path:
        """Append-only audit records of operations on offsets (``rewinds.jsonl``)."""
        return self.home / "audit"

    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def jars_dir(self) -> Path:
        """Maven-resolved jars (Kafka broker, Delta Lake); a cache that survives ``home`` moves."""
        return Path(os.environ.get("WAVEPIPE_JARS", PROJECT_ROOT / ".cache" / "jars"))

    def kafka_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka properties shared by every client, plus ``extra``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.kafka_client_config)
        conf.update(extra)
        return conf

    def replace(self, **changes: Any) -> "Settings":
        """A copy with ``changes`` applied; ``None`` values are ignored (unset CLI flags)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **_coerce_all(changes))

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _coerce(name: str, value: Any) -> Any:
    if name not in _FIELDS:
        raise ValueError(f"unknown wavepipe setting {name!r}; known: {', '.join(sorted(_FIELDS))}")
    default = _FIELDS[name].default
    if default is dataclasses.MISSING:  # mappings
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        if not isinstance(value, Mapping):
            raise ValueError(f"setting {name} must be a JSON object / TOML table, got {value!r}")
        return dict(value)
    if isinstance(default, Path):
        return Path(value).expanduser().resolve()
    if isinstance(default, bool):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
    if isinstance(default, int):
        return int(value)
    if isinstance(default, float):
        return float(value)
    return str(value)


def _coerce_all(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _coerce(k, v) for k, v in values.items()}


def _config_file() -> Path | None:
    explicit = os.environ.get("WAVEPIPE_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise FileNotFoundError(f"WAVEPIPE_CONFIG points to {path}, which does not exist")
        return path
    for candidate in (Path.cwd() / "wavepipe.toml", PROJECT_ROOT / "wavepipe.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_settings(**overrides: Any) -> Settings:
    """Defaults < config file < ``WAVEPIPE_*`` environment < ``overrides``."""
    values: dict[str, Any] = {}
    path = _config_file()
    if path is not None:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
        values.update(data.get("wavepipe", data))
    for name in _FIELDS:
        env = os.environ.get(f"WAVEPIPE_{name.upper()}")
        if env is not None:
            values[name] = env
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**_coerce_all(values))
