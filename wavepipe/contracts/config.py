"""One configuration model for the CLI, the DAGs and the tests.

Precedence, lowest first: the documented defaults below, a TOML file (``WAVEPIPE_CONFIG`` or
``wavepipe.toml`` in the project root / current directory), then environment variables
``WAVEPIPE_<FIELD>`` (upper case, e.g. ``WAVEPIPE_HOME``, ``WAVEPIPE_BOOTSTRAP_SERVERS``), then
explicit overrides passed by the caller (CLI flags, DAG params).

All local state lives under ``home``; moving that one setting moves Kafka's data, plans,
staging, output and reports together.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from wavepipe.contracts.errors import UsageError, did_you_mean
from wavepipe.contracts.kafka_callbacks import refused_callbacks
from wavepipe.contracts.quality import DEFAULT_RULES, QualityRule, parse_rules

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def source_checkout() -> Path | None:
    """The wavepipe source checkout this code runs from (an editable install, or the tests), or
    None when wavepipe is installed as a package (``pip install wavepipe``: the code then lives in
    site-packages, and nothing may be written next to it)."""
    if (PROJECT_ROOT / "pyproject.toml").is_file() and (
        PROJECT_ROOT / "wavepipe" / "contracts" / "config.py"
    ).is_file():
        return PROJECT_ROOT
    return None


def _user_dir(variable: str, fallback: str) -> Path:
    """An XDG base folder (``$XDG_DATA_HOME``, ``$XDG_CACHE_HOME``) + ``wavepipe``."""
    return Path(os.environ.get(variable) or Path.home() / fallback) / "wavepipe"


def default_home() -> Path:
    """``<checkout>/.wavepipe`` in a source checkout, else ``$XDG_DATA_HOME/wavepipe``
    (``~/.local/share/wavepipe``); ``WAVEPIPE_HOME`` or the config file's ``home`` set it."""
    root = source_checkout()
    return root / ".wavepipe" if root else _user_dir("XDG_DATA_HOME", ".local/share")


def default_jars_dir() -> Path:
    """``<checkout>/.cache/jars`` in a source checkout, else ``$XDG_CACHE_HOME/wavepipe/jars``
    (``~/.cache/wavepipe/jars``); ``WAVEPIPE_JARS`` sets it."""
    root = source_checkout()
    return root / ".cache" / "jars" if root else _user_dir("XDG_CACHE_HOME", ".cache") / "jars"


#: Parts of a setting's key that mark its value as a secret (``sasl.password``, ``ssl.key.pem``,
#: ``sasl.oauthbearer.client.secret``, ``...token``): masked wherever settings are shown or written.
SECRET_WORDS = ("password", "secret", "key", "token", "credential")
MASK = "*****"


def is_secret(key: str) -> bool:
    return any(word in part for part in re.split(r"[._\-\s]+", str(key).lower()) for word in SECRET_WORDS)


_CONNECT_URL = re.compile(
    r"sc://(?P<host>[^\s/;:\[\]]+|\[[0-9a-fA-F:.]+\])(:(?P<port>\d{1,5}))?/?(?P<params>(;[^\s;=]+=[^\s;=]*)*)"
)


def valid_connect_url(url: str) -> bool:
    """Whether ``url`` is a Spark Connect URL pyspark accepts: ``sc://host[:port][/;k=v...]``, a
    port in 1-65535, parameter values without ``=`` or ``;`` (URL-encode them), and a
    ``session_id``, if given, that is a UUID."""
    import uuid

    found = _CONNECT_URL.fullmatch(url)
    if not found or (found["port"] is not None and not 1 <= int(found["port"]) <= 65535):
        return False
    params = dict(p.split("=", 1) for p in found["params"].split(";") if p)
    if "session_id" in params:
        try:
            uuid.UUID(params["session_id"])
        except ValueError:
            return False
    return True


def redact_url(url: str) -> str:
    """A Spark Connect URL with the values of its secret-like parameters (``;token=...``) masked."""
    return re.sub(r";([^;=]+)=([^;]*)", lambda m: f";{m[1]}={MASK if is_secret(m[1]) else m[2]}", url)


def redact_secrets(value: Any) -> Any:
    """``value`` with the values of secret-like keys masked, at any depth (dicts and lists)."""
    if isinstance(value, Mapping):
        return {k: (MASK if is_secret(k) and v not in (None, "") else redact_secrets(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_secrets(v) for v in value]
    return value


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _topic_name(text: str) -> bool:
    return bool(_TOPIC.match(text))


def _valid_instant(text: str) -> bool:
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _valid_start(text: str) -> bool:
    return text in ("", "earliest", "latest") or _valid_instant(text)


def _servers(text: str) -> bool:
    return bool(text) and all(
        re.fullmatch(r"[^\s,:]+:\d{1,5}|\[[0-9a-fA-F:]+\]:\d{1,5}|[A-Za-z]+://[^\s,]+", s.strip())
        for s in text.split(",")
    )


_REMOTE_RULE = (
    "must be empty (this home's own server) or a Spark Connect URL, sc://host:port[/;param=value...] "
    "(port 1-65535; values URL-encoded, no '=' or ';' in them; session_id a UUID)"
)


@dataclass(frozen=True)
class Rule:
    """A setting's rule in words: the error for any value of the right type that breaks the
    setting's constraints (``Field(ge=...)``) or its check (``_check``)."""

    words: str


def _check(test: Callable[[Any], bool]) -> AfterValidator:
    """A check of a setting's value beyond pydantic's constraints; the words are the ``Rule``'s."""

    def run(value: Any) -> Any:
        if not test(value):
            raise ValueError("breaks the setting's rule")
        return value

    return AfterValidator(run)


def _not_a_bool(value: Any) -> Any:
    """``true`` is not a count: pydantic's lax mode would read it as 1."""
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "a boolean is not a number")
    return value


def _table(value: Any) -> Any:
    """A JSON object given as text (an environment variable, a flag) read as a mapping; an empty
    text is an empty one."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            raise PydanticCustomError("json_invalid", "not JSON") from None
    return value


def _callbacks_import(value: dict[str, Any]) -> dict[str, Any]:
    """Kafka callbacks given by dotted path import to callables here (else refused, naming them)."""
    why = refused_callbacks(value)
    if why:
        raise PydanticCustomError("kafka_callback", why)
    return value


def _rules(value: Any) -> Any:
    """The quality rules (``contracts.quality``) given as JSON text (an environment variable)
    read as a list; each entry checked, a wrong one refused with what is wrong with it."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            raise PydanticCustomError("json_invalid", "not JSON") from None
    if not isinstance(value, list):
        raise PydanticCustomError("quality_rules", "must be a list of rules (TOML: [[quality_rules]] tables)")
    try:
        parse_rules(value)
    except ValueError as exc:
        raise PydanticCustomError("quality_rules", str(exc)) from None
    return [dict(entry) for entry in value]


#: The bucket (container) names of each object store's URI schemes: S3's, GCS's (also ``_``),
#: Azure's (letters, digits, single hyphens), and ``abfs[s]``'s ``container@account.dfs.core.windows.net``.
_BUCKETS = {
    ("s3", "s3a"): r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]",
    ("gs",): r"[a-z0-9][a-z0-9._\-]{1,61}[a-z0-9]",
    ("az",): r"[a-z0-9](?!.*--)[a-z0-9\-]{1,61}[a-z0-9]",
    ("abfs", "abfss"): r"[a-z0-9](?!.*--)[a-z0-9\-]{1,61}[a-z0-9]@[a-z0-9]{3,24}\.dfs\.core\.windows\.net",
}
#: What a location may be (the rule's words).
LOCATION_RULE = "must be empty, an absolute path, s3://bucket[/prefix], gs://bucket[/prefix] or az://container[/prefix]"


def _location(text: str) -> bool:
    """An empty text, an absolute local path, or an object store's ``scheme://bucket[/prefix]``
    (a valid bucket or container name for that store)."""
    scheme, sep, rest = text.partition("://")
    if sep:
        pattern = next((p for schemes, p in _BUCKETS.items() if scheme in schemes), None)
        return pattern is not None and re.fullmatch(pattern, rest.split("/", 1)[0]) is not None
    return text == "" or Path(text).is_absolute()


def _endpoint(text: str, *, path: bool = False) -> bool:
    """An object store's API: empty (the cloud's own), ``local`` (this home's server) or
    http(s)://host[:port] (``path``: and one path segment, an emulator's account)."""
    segment = r"(/[^\s/]+)?" if path else ""
    return text in ("", "local") or re.fullmatch(rf"https?://[^\s/]+(:\d+)?{segment}/?", text) is not None


def _instant_text(value: Any) -> Any:
    """A TOML date-time written without quotes (``2026-01-01T00:00:00Z``) as the text it stands for."""
    return value.isoformat() if isinstance(value, (datetime, date)) else value


#: The kinds of values settings take.
Count = Annotated[int, BeforeValidator(_not_a_bool)]
Number = Annotated[float, BeforeValidator(_not_a_bool), Field(allow_inf_nan=False)]
Table = Annotated[dict[str, Any], BeforeValidator(_table)]
HomePath = Annotated[Path, AfterValidator(lambda p: p.expanduser().resolve())]
#: What a value of the wrong type is told it must be, by the setting's type.
_KIND = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    Path: "a string",
    dict[str, Any]: "a JSON object or TOML table",
    list[dict[str, Any]]: "a list of tables (JSON or TOML)",
}
#: pydantic errors for a value of the right type that breaks the setting's rule.
_RULE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "finite_number",
    "string_pattern_mismatch",
    "string_too_short",
    "string_too_long",
    "value_error",
}


class Settings(BaseModel):
    """Every knob wavepipe has, with its default and its rule (pydantic checks both the type and
    the rule wherever a value is read; ``load_settings`` turns a refusal into a ``SettingsError``
    that names the source: the file and key, the variable, the flag or the DAG's argument)."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    #: Folder for all local state. Default: ``.wavepipe`` in a source checkout (git-ignored), else
    #: ``~/.local/share/wavepipe`` (``default_home``).
    home: HomePath = Field(default_factory=default_home, validate_default=True)
    #: Kafka bootstrap servers. The local broker started by ``wavepipe kafka up`` listens here.
    bootstrap_servers: Annotated[str, _check(_servers), Rule("must be host:port[,host:port...]")] = "127.0.0.1:9092"
    #: Extra librdkafka properties for every client (TLS, SASL, ...), as a JSON object or table.
    #: A callback (``oauth_cb``, ``error_cb``, ...) is named by dotted path, imported by each
    #: process that makes a client (``contracts.kafka_callbacks``).
    kafka_client_config: Annotated[dict[str, Any], BeforeValidator(_table), AfterValidator(_callbacks_import)] = {}
    #: Topic holding the chunked waveforms, and how many partitions it is created with.
    topic: Annotated[str, _check(_topic_name), Rule("must be a Kafka topic name: 1-249 of A-Z a-z 0-9 . _ -")] = (
        "waveforms"
    )
    partitions: Annotated[Count, Field(ge=1), Rule("must be at least 1")] = 4
    #: When wavepipe creates the topic (``produce``, ``demo``): its replication factor (-1: the
    #: cluster's ``default.replication.factor``) and topic configs, e.g. ``{"min.insync.replicas":
    #: "2"}`` on a 3-broker cluster. An existing topic is used as it is.
    topic_replication_factor: Annotated[
        Count, _check(lambda v: v == -1 or v >= 1), Rule("must be -1 (the cluster's default) or at least 1")
    ] = -1
    topic_config: Table = {}
    #: Consumer group whose committed offsets are the progress of the ingest.
    group: Annotated[str, Field(min_length=1, max_length=249), Rule("must be a non-empty consumer group name")] = (
        "wavepipe-ingest"
    )
    #: Where a group with no committed offsets on the topic starts: ``earliest``, ``latest`` or an
    #: ISO-8601 instant (the first record at or after it). Empty: such a run is refused and names
    #: the groups that do have offsets there, so a typo'd group never reads the whole topic. Also
    #: ``wavepipe run --new-group-start`` and the DAG param ``new_group_start``.
    new_group_start: Annotated[
        str,
        BeforeValidator(_instant_text),
        _check(_valid_start),
        Rule("must be earliest, latest, an ISO-8601 instant, or empty (refuse)"),
    ] = ""
    #: Caps on the records new to a run, per partition. 0 means no cap. ``max_bytes_per_partition``
    #: is converted to a record cap at ``chunk_size`` bytes per record. When a waveform longer
    #: than the cap is pending, the next run's range grows by the cap beyond the last run's end.
    max_records_per_partition: Annotated[
        Count, Field(ge=0), Rule("must be 0 (no cap) or a positive number of records")
    ] = 0
    max_bytes_per_partition: Annotated[Count, Field(ge=0), Rule("must be 0 (no cap) or a positive number of bytes")] = 0
    #: Payload bytes per chunk produced by the chunking producer.
    chunk_size: Annotated[Count, Field(ge=1), Rule("must be at least 1 byte")] = 64 * 1024
    #: Producer batching.
    linger_ms: Annotated[Count, Field(ge=0), Rule("must be 0 or more milliseconds")] = 20
    batch_size: Annotated[Count, Field(ge=1), Rule("must be at least 1 byte")] = 1024 * 1024
    #: Where a run's Spark work runs. ``connect``: attached to a long-lived Spark Connect server
    #: (``spark_remote``, or this home's own server, started on demand: ``wavepipe spark up``);
    #: ``submit``: a spark-submit app per step (a cold JVM each time; the fallback).
    spark_engine: Annotated[str, _check(lambda v: v in ("connect", "submit")), Rule("must be connect or submit")] = (
        "connect"
    )
    #: The Spark Connect server to attach to (``sc://host:15002``, with ``;token=...`` etc. as
    #: Spark Connect URLs allow). Empty: this home's local server on ``spark_connect_port``.
    spark_remote: Annotated[str, _check(lambda v: v == "" or valid_connect_url(v)), Rule(_REMOTE_RULE)] = ""
    #: The web UI of the ``spark_remote`` server (``http://host:4040``): runs list the Spark jobs
    #: they started from its REST API (``/api/v1``), in their reports. Empty: none listed for a
    #: remote server (this home's own server's UI is found by itself).
    spark_ui: Annotated[
        str,
        _check(lambda v: v == "" or re.fullmatch(r"https?://[^\s/]+(:\d+)?/?", v) is not None),
        Rule("must be empty or the engine's web UI as http(s)://host:port"),
    ] = ""
    #: The port of this home's local Spark Connect server (loopback only); 0: any free port.
    spark_connect_port: Annotated[Count, Field(ge=0, le=65535), Rule("must be a TCP port, or 0 for any free port")] = (
        15002
    )
    #: The S3 port of this home's local object store (SeaweedFS on loopback, ``wavepipe objectstore
    #: up``), for trying wavepipe's storage on S3 on one machine.
    object_store_port: Annotated[Count, Field(ge=1, le=65535), Rule("must be a TCP port")] = 8333
    #: This home's local Spark Connect server is restarted between steps (when no step uses it)
    #: once its JVM and Python workers hold more than this many MB of memory; 0: never.
    spark_engine_max_rss_mb: Annotated[Count, Field(ge=0), Rule("must be 0 (never restart) or a number of MB")] = 6144
    #: Spark master of the engine (the local server's, or each spark-submit app's).
    spark_master: Annotated[
        str, Field(min_length=1), Rule("must name a Spark master, e.g. local[2] or spark://host:7077")
    ] = "local[2]"
    #: The driver JVM's heap (in local mode all of Spark's). 3g holds two waveforms of the default
    #: ``max_waveform_bytes`` written at once (``local[2]``); docs/deployment.md, "Memory".
    spark_driver_memory: Annotated[
        str, Field(pattern=r"^\d+[kmgtKMGT]?$"), Rule("must be a JVM size such as 2g or 512m")
    ] = "3g"
    spark_conf: Table = {}
    #: A run whose staged chunk files total at most this many bytes starts its Spark app's driver
    #: JVM for a short life (``SMALL_RUN_JAVA_OPTIONS``: no C2 JIT, serial GC): on a run of a few
    #: waveforms that halves the CPU the app burns. 0 turns it off; larger runs keep the defaults.
    spark_small_run_bytes: Annotated[Count, Field(ge=0), Rule("must be 0 (off) or a number of bytes")] = (
        64 * 1024 * 1024
    )
    #: Rows per Parquet row group while staging (bounds the reader's memory).
    staging_flush_bytes: Annotated[Count, Field(ge=1), Rule("must be at least 1 byte")] = 64 * 1024 * 1024
    #: Payload bytes of assembled waveforms a Spark Python worker hands to the output's writer at
    #: once (one Arrow batch; at least one waveform): bounds a worker's memory while it assembles.
    output_batch_bytes: Annotated[Count, Field(ge=1), Rule("must be at least 1 byte")] = 32 * 1024 * 1024
    #: Measure each waveform's quality (per channel statistics, dead channel, clipping, spikes;
    #: its gap to its source's previous waveform and its latency) as its row is written, into the
    #: row's ``qc_*``, ``gap_s`` and ``latency_s`` columns. Off: they are null (payloads that are
    #: not samples; the benchmark's comparison).
    quality_metrics: bool = True
    #: What flags a measured waveform (its row's ``qc_flags``): tables of ``name``, ``metric`` (a
    #: quality column), ``above`` and/or ``below`` (a true/false metric takes neither) and
    #: ``sources`` (a pattern, default all), ``action`` (``flag``, or ``quarantine``: the row goes
    #: to the quarantine table instead); docs/quality.md. Neither ever fails a run.
    quality_rules: Annotated[list[dict[str, Any]], BeforeValidator(_rules)] = Field(
        default_factory=lambda: [dict(rule) for rule in DEFAULT_RULES]
    )
    #: Seconds a reader may see no progress before it gives up with an error.
    reader_stall_timeout_s: Annotated[Number, Field(gt=0), Rule("must be a positive number of seconds")] = 60.0
    #: Partitions read at once (one process each) by ``wavepipe run``, and by one consume task of
    #: the DAG that holds several partitions (``consume_tasks``). How many mapped consume tasks run
    #: together is Airflow's parallelism.
    consume_parallelism: Annotated[Count, Field(ge=1), Rule("must be at least 1")] = 2
    #: A plan of at most this many records (over the partitions one call reads) is read by threads
    #: of the calling process instead: starting a reader process (``spawn`` and its imports) takes
    #: about a second, longer than such a read. 0: always processes.
    consume_in_process_max_records: Annotated[Count, Field(ge=0), Rule("must be 0 or more records")] = 2_000
    #: In the DAG, how many mapped consume tasks a run's partitions are spread over (each task reads
    #: its partition group with ``consume_parallelism`` processes). 0: one task per partition. Set it
    #: near the number of Airflow worker slots when a topic has many more partitions than workers.
    consume_tasks: Annotated[Count, Field(ge=0), Rule("must be 0 (one task per partition) or more")] = 0
    #: A waveform still missing chunks is quarantined as ``incomplete`` once its partition has
    #: moved this many offsets, or this many seconds of record time, past its newest chunk (so it
    #: cannot hold the partition's commit back forever). 0 turns a limit off. Record time is what
    #: producers stamp (CreateTime) unless the topic uses LogAppendTime: a producer replaying old
    #: recordings with their own timestamps would age its waveforms at once, so the time limit
    #: is off by default; turn it on where timestamps are send times.
    incomplete_after_offsets: Annotated[Count, Field(ge=0), Rule("must be 0 (off) or a number of offsets")] = 100_000
    incomplete_after_s: Annotated[Number, Field(ge=0), Rule("must be 0 (off) or a number of seconds")] = 0.0
    #: Waveforms larger than this (by their header or by their chunks) are quarantined as
    #: ``too_large`` from their metadata alone, never assembled. At most 1 GiB (a Spark row).
    #: Spark needs about 16 times this in heap per core writing a waveform, plus 0.5 GiB; raise
    #: ``spark_driver_memory`` with it (docs/deployment.md, "Memory").
    max_waveform_bytes: Annotated[
        Count, Field(ge=1, le=1024**3), Rule("must be 1 to 1073741824 bytes (a waveform is one Spark row)")
    ] = 64 * 1024 * 1024
    #: Also publish each run's dead letters to this Kafka topic (original key, value and headers,
    #: plus ``wp-dlq-*`` headers with the reason), in one transaction with the run's offset commit.
    #: Empty: the dead-letter Delta table only (which is always written).
    dead_letter_topic: Annotated[
        str, _check(lambda v: v == "" or _topic_name(v)), Rule("must be empty or a Kafka topic name")
    ] = ""
    #: Thresholds of the validation gate (the suites are code: ``wavepipe/expectations.py``). A
    #: waveform that breaks a per-waveform threshold is quarantined with the expectation's name; a
    #: run that breaks a run-level one is not published and commits nothing until it passes (after
    #: the data is fixed, or a threshold here is relaxed, the validate step is retried).
    #: Sample rate bounds in Hz, inclusive.
    validate_sample_rate_min: Annotated[Number, Field(gt=0), Rule("must be a positive number of Hz")] = 1e-3
    validate_sample_rate_max: Annotated[Number, Field(gt=0), Rule("must be a positive number of Hz")] = 1e9
    #: Start-time bounds: not before this ISO-8601 UTC instant, and not more than this many seconds
    #: after the moment of validation (clock skew of the producers).
    validate_start_time_min: Annotated[
        str,
        BeforeValidator(_instant_text),
        _check(_valid_instant),
        Rule("must be an ISO-8601 instant, e.g. 1900-01-01T00:00:00Z"),
    ] = "1900-01-01T00:00:00Z"
    validate_start_time_max_ahead_s: Annotated[Number, Field(ge=0), Rule("must be 0 or more seconds")] = 86_400.0
    #: Run level: a run of at least ``validate_quarantine_judged_from`` waveforms (new and
    #: quarantined) fails validation when more than this share of them was quarantined, for any
    #: reason: a broken producer fleet or a wrong threshold, not one bad source (1.0: never).
    validate_max_quarantined_share: Annotated[Number, Field(ge=0, le=1), Rule("must be a fraction in [0, 1]")] = 0.9
    validate_quarantine_judged_from: Annotated[Count, Field(ge=1), Rule("must be 1 or more waveforms")] = 100
    #: Runs shown in the validation trend (report page and ``wavepipe status``).
    report_trend_runs: Annotated[Count, Field(ge=0), Rule("must be 0 or more runs")] = 20
    #: Event-driven runs: an ingest DAG whose settings turn one of these on also runs when its
    #: group's lag on the topic (last stable offset minus committed offset) reaches this many
    #: records, about this many bytes, or when its oldest uncommitted record is this many seconds
    #: old (an Airflow asset watcher in the triggerer measures it when a record arrives and at
    #: least every ``watch_poll_s``; it never reads for the group or commits). 0 turns a threshold
    #: off; all 0: the schedule only.
    watch_records: Annotated[Count, Field(ge=0), Rule("must be 0 (off) or a number of records")] = 0
    watch_bytes: Annotated[Count, Field(ge=0), Rule("must be 0 (off) or a number of bytes")] = 0
    watch_max_delay_s: Annotated[Number, Field(ge=0), Rule("must be 0 (off) or a number of seconds")] = 0.0
    watch_poll_s: Annotated[Number, Field(ge=0.1, le=3600), Rule("must be 0.1 to 3600 seconds")] = 2.0
    #: Runs as a follow loop: the ingest DAG's one task runs micro-batches back to back (``wavepipe
    #: follow``) for up to this many seconds from each DAG run's start (the lag watcher's or the
    #: schedule's), waking on each new record (the lag measured at least every ``watch_poll_s``).
    #: 0: one run per DAG run.
    follow_s: Annotated[Number, Field(ge=0, le=86_400), Rule("must be 0 (off) to 86400 seconds")] = 0.0
    #: ``wavepipe table vacuum`` (and the maintenance DAG) keeps the files an output table no
    #: longer uses for this many hours, for readers outside wavepipe still on an older version;
    #: under 168 (Delta's own safety check) such a reader can fail. wavepipe's runs never do: the
    #: vacuum waits for their Spark steps (docs/operations.md, "Table maintenance").
    table_retention_hours: Annotated[Number, Field(ge=0, le=87_600), Rule("must be 0 to 87600 hours")] = 168.0
    #: After a run's commit, a partition of a table the run wrote to that holds this many files
    #: under 64 MiB has them rewritten into few (delta-rs, no Spark job; ``maintenance.compact_small``),
    #: so that micro-batches keep a run's reads of its tables from growing with the files they
    #: add. 0: off (only ``wavepipe table optimize`` and the maintenance DAG compact).
    compact_after_files: Annotated[Count, Field(ge=0, le=100_000), Rule("must be 0 (off) or a number of files")] = 16
    #: Where the output tables live: empty for ``<home>/tables``, or ``s3://bucket/prefix`` (an object
    #: store, reached as ``s3_endpoint`` says). Readers (Spark, delta-rs, Trino) open the tables there.
    tables_uri: Annotated[str, _check(_location), Rule(LOCATION_RULE)] = ""
    #: Where readers stage a run's chunks and its candidate tables are kept until it commits: empty
    #: for ``<home>/staging``, or ``s3://bucket/prefix``, so that an engine (and a worker) on other
    #: hosts read them there. Staged files are written locally first and put whole under names a
    #: retry reproduces.
    staging_uri: Annotated[str, _check(_location), Rule(LOCATION_RULE)] = ""
    #: Where the run state is kept (plans, group claims, step records and locks, the dead-letter
    #: ledger, report records): empty for ``<home>``, a folder every worker mounts, or
    #: ``s3://bucket/prefix``, so that Airflow workers that share no disk resume each other's runs.
    #: On an object store a claim is a conditional create and a step lock a lease (``state_lease_s``).
    state_uri: Annotated[str, _check(_location), Rule(LOCATION_RULE)] = ""
    #: How long a step lock on an object store (``state_uri``) outlives a holder that stops renewing
    #: it (killed, or cut off): a retry on another host waits this long; on the holder's own host, a
    #: retry takes over the lock of a process that is gone at once.
    state_lease_s: Annotated[Number, Field(ge=3, le=3600), Rule("must be 3 to 3600 seconds")] = 30.0
    #: The S3 API of ``s3://`` locations: empty for AWS's own (in ``s3_region``), ``local`` for this
    #: home's object store (``wavepipe objectstore up``, its own credentials), or http(s)://host:port.
    s3_endpoint: Annotated[
        str,
        _check(_endpoint),
        Rule("must be empty (AWS), local (this home's object store) or http(s)://host:port"),
    ] = ""
    #: The S3 region (AWS: where the bucket is; other stores take any name).
    s3_region: str = ""
    #: S3 credentials; both empty: the environment's (an instance or pod role, AWS_* variables).
    s3_access_key: str = ""
    s3_secret_key: str = ""
    #: The GCS API of ``gs://`` locations: empty for Google's, ``local`` for this home's emulator
    #: (``wavepipe emulator up gcs``), or an emulator's http(s)://host:port (unauthenticated).
    gcs_endpoint: Annotated[
        str, _check(_endpoint), Rule("must be empty (Google), local (this home's emulator) or http(s)://host:port")
    ] = ""
    #: A GCS service account's key file; empty: the environment's credentials
    #: (``GOOGLE_APPLICATION_CREDENTIALS``, a workload identity, the metadata server).
    gcs_service_account: Annotated[
        str, _check(lambda v: v == "" or Path(v).is_absolute()), Rule("must be empty or a key file's absolute path")
    ] = ""
    #: The port of this home's GCS emulator (fake-gcs-server on loopback), for ``gcs_endpoint = "local"``.
    gcs_emulator_port: Annotated[Count, Field(ge=1, le=65535), Rule("must be a TCP port")] = 4443
    #: The Azure storage account of ``az://`` locations (an ``abfss://`` location names the same one).
    azure_account: Annotated[
        str,
        _check(lambda v: re.fullmatch(r"([a-z0-9]{3,24})?", v) is not None),
        Rule("must be 3-24 lowercase letters or digits"),
    ] = ""
    #: The account's key; empty: the environment's credentials (``AZURE_*`` variables, a managed identity).
    azure_key: str = ""
    #: The blob endpoint: empty for ``https://<azure_account>.blob.core.windows.net``, ``local`` for
    #: this home's emulator (``wavepipe emulator up azure``, its account and well-known key), or a URL.
    azure_endpoint: Annotated[
        str,
        _check(lambda v: _endpoint(v, path=True)),
        Rule("must be empty (Azure), local (this home's emulator) or http(s)://host:port[/account]"),
    ] = ""
    #: The blob port of this home's Azure emulator (Azurite on loopback), for ``azure_endpoint = "local"``.
    azure_emulator_port: Annotated[Count, Field(ge=1, le=65535), Rule("must be a TCP port")] = 10000
    #: ``wavepipe airflow up``: the Airflow API server (UI and REST API) listens on 127.0.0.1 here.
    airflow_port: Annotated[Count, Field(ge=1, le=65535), Rule("must be a TCP port, 1-65535")] = 8080

    @model_validator(mode="after")
    def _rules_between_settings(self, info: ValidationInfo) -> Settings:
        # a part of the settings (``check_settings``: a DAG's) is held only to the rules between
        # settings it gives; the rest is checked with the whole set (``load_settings``)
        given = (info.context or {}).get("given")

        def applies(*names: str) -> bool:
            return given is None or set(names) <= given

        if applies("validate_sample_rate_min", "validate_sample_rate_max") and (
            self.validate_sample_rate_min > self.validate_sample_rate_max
        ):
            raise PydanticCustomError(
                "rule_between_settings",
                "validate_sample_rate_min ({low}) is above validate_sample_rate_max ({high})",
                {
                    "setting": "validate_sample_rate_min",
                    "low": f"{self.validate_sample_rate_min:g}",
                    "high": f"{self.validate_sample_rate_max:g}",
                },
            )
        if applies("s3_access_key", "s3_secret_key") and bool(self.s3_access_key) != bool(self.s3_secret_key):
            raise PydanticCustomError(
                "rule_between_settings",
                "s3_access_key and s3_secret_key go together: set both, or neither (the environment's)",
                {"setting": "s3_access_key"},
            )
        self._cloud_rules(applies)
        if applies("dead_letter_topic", "topic") and self.dead_letter_topic and self.dead_letter_topic == self.topic:
            raise PydanticCustomError(
                "rule_between_settings",
                "dead_letter_topic must not be the topic it collects dead letters of",
                {"setting": "dead_letter_topic"},
            )
        return self

    def _cloud_rules(self, applies: Callable[..., bool]) -> None:
        """The GCS and Azure settings agree with each other and with the locations."""
        if applies("gcs_endpoint", "gcs_service_account") and self.gcs_endpoint and self.gcs_service_account:
            raise PydanticCustomError(
                "rule_between_settings",
                "gcs_service_account is for Google's own API: an emulator at gcs_endpoint takes no credentials; "
                "set one of them",
                {"setting": "gcs_service_account"},
            )
        names = ("tables_uri", "staging_uri", "state_uri", "azure_account", "azure_endpoint")
        if not applies(*names):
            return
        on_azure = [u for u in (self.tables_uri, self.staging_uri, self.state_uri) if u.startswith(("az:", "abfs"))]
        if on_azure and not self.azure_account and self.azure_endpoint != "local":
            raise PydanticCustomError(
                "rule_between_settings",
                "a location on Azure ({uri}) needs azure_account (or azure_endpoint = local, this home's emulator)",
                {"setting": "azure_account", "uri": on_azure[0]},
            )
        for uri in on_azure:
            named = uri.partition("@")[2].split(".", 1)[0]
            if named and self.azure_endpoint != "local" and named != self.azure_account:
                raise PydanticCustomError(
                    "rule_between_settings",
                    "{uri} names the storage account {named}, but azure_account is {account}: make them the same",
                    {"setting": "azure_account", "uri": uri, "named": named, "account": repr(self.azure_account)},
                )

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
    def staging_location(self) -> str:
        """Where runs are staged: ``staging_uri`` (an object store), else ``staging_dir``."""
        return self.staging_uri.rstrip("/") or str(self.staging_dir)

    @property
    def spool_dir(self) -> Path:
        """Where a reader writes a staged file before putting it on the object store (a folder
        per run, removed with the run's staging)."""
        return self.home / "spool"

    @property
    def tables_dir(self) -> Path:
        return self.home / "tables"

    @property
    def tables_location(self) -> str:
        """Where the output tables live: ``tables_uri`` (an object store), else ``tables_dir``."""
        return self.tables_uri.rstrip("/") or str(self.tables_dir)

    @property
    def output_table(self) -> str:
        return f"{self.tables_location}/waveforms"

    @property
    def quarantine_table(self) -> str:
        return f"{self.tables_location}/quarantine"

    @property
    def dead_letter_table(self) -> str:
        return f"{self.tables_location}/dead_letter"

    @property
    def qc_table(self) -> str:
        """Quality per source and hour (docs/quality.md), kept while ``quality_metrics`` is on."""
        return f"{self.tables_location}/qc"

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
        return Path(os.environ.get("WAVEPIPE_JARS") or default_jars_dir())

    @property
    def tools_dir(self) -> Path:
        """Servers built from source with Go (the local object store): beside the jars."""
        return self.jars_dir.parent / "go"

    def quality(self) -> tuple[QualityRule, ...] | None:
        """The rules measured waveforms are flagged by; None: quality is not measured at all."""
        return parse_rules(self.quality_rules) if self.quality_metrics else None

    def kafka_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka properties shared by every client, plus ``extra``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(self.kafka_client_config)
        conf.update(extra)
        return conf

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied, each checked against its rule; ``None`` values are
        ignored (unset CLI flags)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return _build({**dict(self), **changes}, {})

    def as_dict(self, *, redact: bool = False) -> dict[str, Any]:
        """Every setting; ``redact``: secret-like values masked (for anything shown or written)."""
        data = {name: _jsonable(value) for name, value in self}
        if not redact:
            return data
        data["spark_remote"] = redact_url(data["spark_remote"])
        return redact_secrets(data)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


class SettingsError(UsageError):
    """A setting that is unknown, of the wrong type or outside its rule; names where it was read."""


def _shown(name: str, value: Any) -> str:
    """A refused value as an error may show it: a secret masked, a URL's token redacted."""
    if is_secret(name):
        return MASK
    return repr(redact_url(value) if name == "spark_remote" and isinstance(value, str) else value)


#: Settings an earlier wavepipe had, and why they went: a config that still sets one is refused
#: with the reason, not with "unknown setting".
RETIRED = {
    "validate_mostly": "a waveform that fails a per-waveform expectation is quarantined now, never published "
    "(the run-level limit is validate_max_quarantined_share)",
    "validate_duration_tolerance_s": "duration_s is n_samples / sample_rate by definition; a waveform whose "
    "duration is not a finite number is quarantined",
}


def _refusal(error: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """One pydantic error as a line naming where the value was read, the setting and its rule."""
    loc = error["loc"]
    name = str(loc[0]) if loc else error.get("ctx", {}).get("setting", "")
    source = sources.get(name, name)
    where = "" if source == name else f"{source}: "
    if error["type"] == "extra_forbidden":
        if name in RETIRED:
            return f"{source}: {name!r} is no longer a wavepipe setting: {RETIRED[name]}; remove it"
        return (
            f"{source}: {name!r} is not a wavepipe setting{did_you_mean(name, Settings.model_fields)} "
            "(`wavepipe config` lists them)"
        )
    if not loc:  # a rule between settings
        return f"{where}{error['msg']}"
    spec = Settings.model_fields[name]
    rule = next((m for m in spec.metadata if isinstance(m, Rule)), None)
    if error["type"] in ("quality_rules", "kafka_callback"):
        return f"{where}{name}: {error['msg']}"
    words = rule.words if rule and error["type"] in _RULE_ERRORS else f"must be {_KIND[spec.annotation]}"
    return f"{where}{name} {words}, got {_shown(name, error['input'])}"


def _build(values: Mapping[str, Any], sources: Mapping[str, str], *, part: bool = False) -> Settings:
    """``Settings`` from ``values``; a refusal lists every bad value, each naming its source.
    ``part``: ``values`` are a part of the settings (the rest to come from elsewhere)."""
    try:
        return Settings.model_validate(values, context={"given": set(values)} if part else None)
    except ValidationError as exc:
        raise SettingsError("\n".join(_refusal(e, sources) for e in exc.errors())) from None


def check_settings(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` (setting name -> value, e.g. a DAG factory's ``settings``) checked and coerced
    as ``load_settings`` would (a None is not a value: it is left out, as ``load_settings`` leaves
    out a None override); an error names ``where`` and the setting."""
    if not isinstance(values, Mapping):
        raise SettingsError(f"{where} must be a mapping of wavepipe settings, got {type(values).__name__}")
    given = {k: v for k, v in values.items() if v is not None}
    settings = _build(given, {k: f"{where}[{k!r}]" for k in given}, part=True)
    return {k: getattr(settings, k) for k in given}


def _config_file() -> Path | None:
    explicit = os.environ.get("WAVEPIPE_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise SettingsError(f"WAVEPIPE_CONFIG points to {path}, which is not a file")
        return path
    root = source_checkout()
    for candidate in (Path.cwd() / "wavepipe.toml", *([root / "wavepipe.toml"] if root else [])):
        if candidate.is_file():
            return candidate
    return None


#: ``WAVEPIPE_*`` variables that are not settings (so an unknown one is worth a warning).
OTHER_VARIABLES = {
    "WAVEPIPE_CONFIG",
    "WAVEPIPE_JARS",
    "WAVEPIPE_FAILPOINTS",
    "WAVEPIPE_CHAOS_SEED",
    "WAVEPIPE_CHAOS_ROUNDS",
    "WAVEPIPE_AIRFLOW_SERVICES",
    "WAVEPIPE_AIRFLOW_SUPERVISED",
    "WAVEPIPE_SPARK_APP",
}
_warned: set[str] = set()


def load_settings(**overrides: Any) -> Settings:
    """Defaults < config file < ``WAVEPIPE_*`` environment < ``overrides``; every value is checked
    where it is read, and an error names its source (file and key, or variable) and the rule."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = _config_file()
    if path is not None:
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{path}: not valid TOML ({exc})") from None
        table = data.get("wavepipe", data)
        if not isinstance(table, Mapping):
            raise SettingsError(f"{path}: [wavepipe] must be a table of settings")
        for name, value in table.items():
            values[name], sources[name] = value, f"{path}, key {name}"
    for name in Settings.model_fields:
        env = os.environ.get(f"WAVEPIPE_{name.upper()}")
        if env is not None:
            values[name], sources[name] = env, f"WAVEPIPE_{name.upper()}"
    known = {f"WAVEPIPE_{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    for var in sorted(v for v in os.environ if v.startswith("WAVEPIPE_") and v not in known and v not in _warned):
        _warned.add(var)
        logging.getLogger(__name__).warning(
            "%s is not a wavepipe setting and is ignored%s", var, did_you_mean(var, known)
        )
    for name, value in overrides.items():
        if value is not None:
            values[name], sources[name] = value, name
    return _build(values, sources)
