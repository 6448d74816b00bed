"""Where wavepipe keeps things, named by a URI: a local folder or an object store's bucket.

A location is a local path, ``s3://bucket/prefix`` (S3 and S3-compatible stores),
``gs://bucket/prefix`` (Google Cloud Storage) or ``az://container/prefix`` (Azure Blob Storage;
``abfss://container@account.dfs.core.windows.net/prefix`` is the same place). Each client reaches
it its own way, from one set of options per store (``S3Options``, ``GCSOptions``, ``AzureOptions``):
- Python (run state, staged chunks): ``open_store``, Rust's object_store through obstore, with
  each store's own conditional writes: ``put_if`` creates only what is absent, or replaces only
  the version a ``get_tagged`` read (S3 and Azure: ``If-Match`` its ETag; GCS:
  ``ifGenerationMatch`` its generation);
- delta-rs (the publish's commit, every read of a table): ``delta_storage_options``;
- pyarrow (a Spark worker's reads of staged files): ``arrow_filesystem``;
- Spark (the engine's reads and writes of tables): ``s3a://`` through Hadoop's S3A connector,
  configured by ``spark_confs``; ``gs://`` through Google's connector, by ``gcs_spark_confs``
  (Azure's ABFS is not put on the engine: a cluster brings its own).

An object store has no rename and no lock; what needs one is a conditional write instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

from wavepipe import cloud_access, objectstore_access
from wavepipe.contracts.errors import BUGS, StepFailedError, UnavailableError, WavepipeError, first_line

#: URI schemes of object stores, and which store each names (Spark names S3 ``s3a``, every other
#: client ``s3``; Azure's Data Lake URIs ``abfs``/``abfss``, obstore's and delta-rs's ``az``).
STORE_KINDS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}
REMOTE_SCHEMES = tuple(STORE_KINDS)
#: The settings each store is configured by (for messages).
KIND_SETTINGS = {"s3": "s3_*", "gcs": "gcs_*", "azure": "azure_*"}


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3 API. Empty ``endpoint``: AWS's own, for ``region``. Empty keys: the
    environment's credentials (an instance or pod role, ``AWS_*`` variables, a profile)."""

    endpoint: str = ""
    region: str = ""
    access_key: str = ""
    secret_key: str = ""

    @property
    def plain_http(self) -> bool:
        return self.endpoint.startswith("http://")


@dataclass(frozen=True)
class GCSOptions:
    """How to reach Google Cloud Storage. ``endpoint``: an emulator's API (unauthenticated);
    empty: Google's. ``service_account``: a key file's path; empty: the environment's credentials
    (``GOOGLE_APPLICATION_CREDENTIALS``, a workload identity, the metadata server)."""

    endpoint: str = ""
    service_account: str = ""


@dataclass(frozen=True)
class AzureOptions:
    """How to reach Azure Blob Storage: the storage ``account`` and its ``key`` (empty: the
    environment's credentials, ``AZURE_*`` variables or a managed identity); ``endpoint`` empty:
    ``https://<account>.blob.core.windows.net``, else a blob endpoint such as an emulator's."""

    account: str = ""
    key: str = ""
    endpoint: str = ""

    @property
    def plain_http(self) -> bool:
        return self.endpoint.startswith("http://")


#: The options of one store.
StoreOptions = S3Options | GCSOptions | AzureOptions


def store_kind(uri: str) -> str | None:
    """Which store ``uri`` names (``s3``, ``gcs``, ``azure``); None: a local path."""
    return STORE_KINDS.get(urlparse(str(uri)).scheme)


def gcs_options(settings) -> GCSOptions:
    """The GCS options ``settings`` give: this home's emulator's (``gcs_endpoint = "local"``), or
    the settings' own."""
    if settings.gcs_endpoint == "local":
        return GCSOptions(cloud_access.gcs_endpoint(settings.gcs_emulator_port))
    return GCSOptions(settings.gcs_endpoint.rstrip("/"), settings.gcs_service_account)


def azure_options(settings) -> AzureOptions:
    """The Azure options ``settings`` give: this home's emulator's (``azure_endpoint = "local"``:
    its account and well-known key), or the settings' own."""
    if settings.azure_endpoint == "local":
        endpoint = cloud_access.azure_endpoint(settings.azure_emulator_port)
        return AzureOptions(cloud_access.AZURITE_ACCOUNT, cloud_access.AZURITE_KEY, endpoint)
    return AzureOptions(settings.azure_account, settings.azure_key, settings.azure_endpoint.rstrip("/"))


def options_for(settings, kind: str) -> StoreOptions:
    """The options ``settings`` give for store ``kind`` (``store_kind``)."""
    return {"s3": s3_options, "gcs": gcs_options, "azure": azure_options}[kind](settings)


def locations(settings) -> tuple[str, str, str]:
    """The locations of ``settings`` a run writes: tables, staging, run state."""
    return (settings.tables_uri, settings.staging_uri, settings.state_uri)


def s3_options(settings) -> S3Options:
    """The S3 options ``settings`` give: this home's object store's (``s3_endpoint = "local"``:
    its endpoint and credentials), or the settings' own."""
    if settings.s3_endpoint == "local":
        folder = objectstore_access.store_folder(settings.home)
        return S3Options(**objectstore_access.client_options(folder, settings.object_store_port))
    return S3Options(settings.s3_endpoint, settings.s3_region, settings.s3_access_key, settings.s3_secret_key)


def uses_object_store(settings) -> bool:
    """Whether any location of ``settings`` is on an object store."""
    return any(is_remote(uri) for uri in locations(settings))


def reaches_s3(settings) -> bool:
    """Whether the Spark engine of ``settings`` must reach S3: the tables or the staging are
    there (the run state is never the engine's), or an S3 endpoint is set (an engine shared by
    runs with local and S3 locations)."""
    engine_kinds = (store_kind(settings.tables_uri), store_kind(settings.staging_uri))
    return "s3" in engine_kinds or bool(settings.s3_endpoint)


def s3_reach(settings) -> str:
    """Which object store the Spark engine of ``settings`` reaches, and with which keys, as a
    fingerprint ("": none): an engine started for another one must be started again."""
    if not reaches_s3(settings):
        return ""
    import hashlib

    return hashlib.sha256(repr(s3_options(settings)).encode()).hexdigest()[:16]


def engine_reach(settings) -> str:
    """Which object stores the Spark engine of ``settings`` reaches, and how, as a fingerprint
    ("": none): S3's (``s3_reach``), and GCS's when the tables or staging are there."""
    import hashlib

    gcs = repr(gcs_options(settings)) if reaches_gcs(settings) else ""
    if not gcs:
        return s3_reach(settings)
    return hashlib.sha256(f"{s3_reach(settings)}|{gcs}".encode()).hexdigest()[:16]


class StorageUnavailableError(UnavailableError):
    """The object store a step reads or writes did not answer; the message says what to check."""


class TableNeedsRepairError(StepFailedError):
    """A table an earlier wavepipe wrote, in a form this one does not read or write (types the
    Delta protocol does not define, columns it lacks): ``wavepipe table repair`` mends it."""


#: What reading or writing a location is expected to raise when the storage fails: the run
#: state's object store not answering (``wavepipe.state``, in one line) or a local disk's error.
STORAGE_ERRORS: tuple[type[Exception], ...] = (StorageUnavailableError, OSError)


#: What a failure from an object store says (delta-rs and obstore, S3A and the AWS SDK).
_STORAGE_MARKERS = (
    "Generic S3 error",
    "Generic GCS error",
    "Generic MicrosoftAzure error",
    "s3a://",
    "S3AFileSystem",
    "software.amazon.awssdk",
    "Unable to execute HTTP request",
    "AWSClientIOException",
)


def store_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the storage failing (an object store not answering, a local disk's
    error), not another service that is also unavailable (a broker, the engine)."""
    own = isinstance(exc, StorageUnavailableError) or not isinstance(exc, WavepipeError)
    return own and (isinstance(exc, STORAGE_ERRORS) or is_storage_error(exc))


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is an object store's failure."""
    seen = exc
    while seen is not None:
        if any(marker in f"{seen!r} {seen}" for marker in _STORAGE_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unreachable(settings) -> str | None:
    """Why the tables' object store cannot be used now, in one line (``store_down``); None when
    it answers (or the tables are local)."""
    if not uses_object_store(settings):
        return None
    where = next(uri for uri in locations(settings) if is_remote(uri))
    try:
        open_store(where, options_for(settings, store_kind(where))).list_keys(".wavepipe-probe")
    except BUGS:
        raise
    except Exception as exc:  # any failure to answer: said in one line
        return store_down(where, exc, settings)
    return None


#: Where each store of the process's settings is, and the command that checks it (``configure``).
_reach: dict[str, tuple[str, str]] = {}

_CLOUDS = {"s3": "AWS S3", "gcs": "Google Cloud Storage", "azure": "Azure Blob Storage"}


def store_down(uri: str, exc: BaseException, settings=None, what: str = "the object store") -> str:
    """One line for ``what`` (the object store of ``uri``) failing on ``uri`` with ``exc``: where
    the store is, what it said (``said_by_store``), the command that checks it, and how to go on.
    ``settings``: the settings that reach it (default: the ones this process was configured with)."""
    kind = store_kind(uri)
    if kind is None:  # a local path: its disk's own error says what happened
        return f"{uri} failed: {first_line(exc)}. Check that it is writable and has room, then run again"
    where, check = _reach_of(settings, kind) if settings is not None else _reach.get(kind, (_CLOUDS[kind], ""))
    return (
        f"{what} at {where} failed on {uri} ({said_by_store(exc)}). Check it with {check or '`wavepipe check`'}, "
        "and that the bucket exists, then run again: the run resumes where it stopped and still publishes each "
        "waveform once (`wavepipe run`; in Airflow, clear the failed task)"
    )


class DiskFullError(UnavailableError):
    """A local disk a run writes to is full; the message names it, its free space and what to do."""


#: How a full disk reads in an error's text: Python's ``OSError``, pyarrow's, the JVM's ``IOException``.
_NO_SPACE = ("No space left on device", "[Errno 28]", "[errno 28]")


def no_space(exc: BaseException) -> bool:
    """Whether ``exc``, or what it was raised from, is a full local disk."""
    seen = exc
    while seen is not None and not any(marker in f"{seen}" for marker in _NO_SPACE):
        seen = seen.__cause__ or seen.__context__
    return seen is not None


def disk_full(settings, needed: int | None = None) -> DiskFullError:
    """One line for a full local disk (``no_space``): of the disks the run's local locations are
    on, the one with the least free space (named by its first location), that space, what the
    step writes (``needed`` bytes, when known), the settings that move what is on it, and how to go on."""
    import os
    import shutil

    by_disk: dict[int, list[tuple[str, str]]] = {}
    for path, setting in _local_places(settings):
        by_disk.setdefault(os.stat(_existing(path)).st_dev, []).append((path, setting))
    usage, places = min(
        ((shutil.disk_usage(_existing(on_disk[0][0])), on_disk) for on_disk in by_disk.values()),
        key=lambda found: found[0].free,
    )
    names = [setting for _, setting in places]
    moved = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    need = f"; this step writes about {_mib(needed)} there" if needed else ""
    return DiskFullError(
        f"no space left on the disk of {places[0][0]} ({_mib(usage.free)} free of {_mib(usage.total)}{need}). "
        f"Free space there, or give {moved} a location with room, then run again: the run resumes where it "
        "stopped and still publishes each waveform once"
    )


def _local_places(settings) -> list[tuple[str, str]]:
    """Each local location a run writes, with the setting that moves it (the home holds the rest)."""
    places = [
        (settings.tables_location, "tables_uri"),
        (settings.staging_location, "staging_uri"),
        (settings.state_uri or str(settings.home), "state_uri"),
        (str(settings.home), "the home (--home)"),
    ]
    return [(path, setting) for path, setting in places if not is_remote(path)]


def _existing(path: str) -> str:
    """``path``, or its nearest folder that exists (what ``shutil.disk_usage`` can ask)."""
    from pathlib import Path

    found = Path(path)
    while not found.exists() and found != found.parent:
        found = found.parent
    return str(found)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _reach_of(settings, kind: str) -> tuple[str, str]:
    """Where ``settings``' store of ``kind`` is (its endpoint, or the cloud's name) and the command that checks it."""
    endpoint = getattr(options_for(settings, kind), "endpoint", "") or _CLOUDS[kind]
    own = own_command(settings, kind)
    return endpoint, f"`{own}`" if own else f"`wavepipe check` and the {KIND_SETTINGS[kind]} settings"


_OBJECT_STORE_SAID = re.compile(
    r"Error performing (?P<method>[A-Z]+) (?P<url>\S+) in [\d.]+\w*(?:, after (?P<tries>\d+) retries)?[^-]*(?:- (?P<why>.*))?$"
)


def said_by_store(exc: BaseException) -> str:
    """What an object store's client said in ``exc``, in a few words: obstore's and delta-rs's
    "Error performing GET http://... in 515ms, after 3 retries, max_retries: 3, ... - HTTP error:
    error sending request" becomes "GET /bucket/key: HTTP error: error sending request (3 retries)"."""
    line = first_line(exc, limit=None)  # whole: a long key must not cut off what the store said
    found = _OBJECT_STORE_SAID.search(line)
    if found is None:
        return line[:200]
    tries = f" ({found['tries']} retries)" if found["tries"] else ""
    return f"{found['method']} {urlparse(found['url']).path}: {(found['why'] or 'no answer').strip()}{tries}"


def briefly(exc: BaseException) -> str:
    """``exc`` in a few words, for a warning beside a failure that says the rest: a store that did
    not answer is "the object store did not answer" (the failure's own line says where and what to
    do), anything else its first line."""
    return "the object store did not answer" if isinstance(exc, StorageUnavailableError) else first_line(exc)


def own_command(settings, kind: str) -> str:
    """The command that checks this home's own server of store ``kind``, when the settings use it ("": they don't)."""
    if kind == "s3" and settings.s3_endpoint == "local":
        return "wavepipe objectstore status"
    if {"gcs": settings.gcs_endpoint, "azure": settings.azure_endpoint}.get(kind) == "local":
        return f"wavepipe emulator status {kind}"
    return ""


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names an object store (else a local path)."""
    return urlparse(str(uri)).scheme in REMOTE_SCHEMES


def for_spark(uri: str) -> str:
    """``uri`` as Spark opens it: ``s3://`` through Hadoop's S3A connector (``s3a://``)."""
    text = str(uri)
    return "s3a://" + text.removeprefix("s3://") if text.startswith("s3://") else text


def for_clients(uri: str) -> str:
    """``uri`` as delta-rs and obstore open it: ``s3://``, ``gs://``, ``az://container/path``
    (an ``abfs[s]://container@account.../path``'s account is the settings' ``azure_account``)."""
    text = str(uri)
    if text.startswith("s3a://"):
        return "s3://" + text.removeprefix("s3a://")
    parsed = urlparse(text)
    if parsed.scheme in ("abfs", "abfss"):
        return f"az://{parsed.netloc.partition('@')[0]}{parsed.path}"
    return text


def abfss_account(uri: str) -> str | None:
    """The storage account an ``abfs[s]://container@account.dfs.core.windows.net`` URI names
    (None: another URI, or none named)."""
    parsed = urlparse(str(uri))
    if parsed.scheme not in ("abfs", "abfss") or "@" not in parsed.netloc:
        return None
    return parsed.netloc.partition("@")[2].split(".", 1)[0] or None


def arrow_path(uri: str) -> str:
    """``uri`` as pyarrow's filesystems name it: ``bucket/path`` (a local path as it is)."""
    text = for_clients(uri)
    return text.split("://", 1)[1] if is_remote(text) else text


#: How long a client waits for an object store that does not answer: a few tries over about 20 s,
#: then the step fails and says so (the clients' defaults retry for minutes, the run looks hung).
CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, MAX_RETRIES, RETRY_TIMEOUT_S = 5, 120, 3, 20
DELTA_RS_PATIENCE = {
    "connect_timeout": f"{CONNECT_TIMEOUT_S}s",
    "timeout": f"{REQUEST_TIMEOUT_S}s",
    "max_retries": str(MAX_RETRIES),
    "retry_timeout": f"{RETRY_TIMEOUT_S}s",
}


def delta_storage_options(options: StoreOptions) -> dict[str, str]:
    """delta-rs's storage options. Commits are conditional puts of the next log entry (S3,
    Azure: ``If-None-Match``; GCS: ``ifGenerationMatch=0``), so concurrent writers need no lock
    table."""
    if not isinstance(options, S3Options):
        config, client = _cloud_config(options)
        return {**config, **client, **DELTA_RS_PATIENCE}
    found = {
        "AWS_ENDPOINT_URL": options.endpoint,
        "AWS_REGION": options.region,
        "AWS_ACCESS_KEY_ID": options.access_key,
        "AWS_SECRET_ACCESS_KEY": options.secret_key,
    }
    extra = {"AWS_ALLOW_HTTP": "true"} if options.plain_http else {}
    path_style = {"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false"} if options.endpoint else {}
    return {
        **{k: v for k, v in found.items() if v},
        **extra,
        **path_style,
        "conditional_put": "etag",
        **DELTA_RS_PATIENCE,
    }


#: wavepipe's Delta LogStore for object stores (resources/logstore/): a commit is one
#: ``If-None-Match`` put, so Spark's commits and delta-rs's exclude each other.
LOGSTORE_CLASS = "io.wavepipe.delta.ConditionalPutLogStore"


def spark_confs(options: S3Options) -> dict[str, str]:
    """The Spark engine's S3A and Delta settings. A custom endpoint (an S3-compatible store) is
    addressed path-style; ``fs.s3a.create.conditional.enabled`` lets a create be
    ``If-None-Match``, which ``LOGSTORE_CLASS`` makes of every new log entry."""
    prefix = "spark.hadoop.fs.s3a."
    confs = {f"{prefix}create.conditional.enabled": "true", f"{prefix}fast.upload": "true"}
    confs |= {  # as DELTA_RS_PATIENCE: a store that does not answer fails the step in seconds
        f"{prefix}connection.establish.timeout": f"{CONNECT_TIMEOUT_S}s",
        f"{prefix}retry.limit": str(MAX_RETRIES),
        f"{prefix}attempts.maximum": str(MAX_RETRIES),
    }
    confs |= {"spark.delta.logStore.s3a.impl": LOGSTORE_CLASS, "spark.delta.logStore.s3.impl": LOGSTORE_CLASS}
    if options.endpoint:
        confs |= {f"{prefix}endpoint": options.endpoint, f"{prefix}path.style.access": "true"}
        confs[f"{prefix}connection.ssl.enabled"] = "false" if options.plain_http else "true"
    if options.region:
        confs[f"{prefix}endpoint.region"] = options.region
    if options.access_key:  # the keys travel in the environment (credentials_env), not on a command line
        confs[f"{prefix}aws.credentials.provider"] = ENV_CREDENTIALS
    return confs


def reaches_gcs(settings) -> bool:
    """Whether the Spark engine of ``settings`` must reach GCS: the tables or the staging are there."""
    return "gcs" in (store_kind(settings.tables_uri), store_kind(settings.staging_uri))


def gcs_spark_confs(options: GCSOptions) -> dict[str, str]:
    """The Spark engine's settings of Google's Hadoop connector (``gcs_jars``). An emulator's API is
    reached unauthenticated; Delta commits through its own ``GCSLogStore`` (a create-if-absent)."""
    prefix = "spark.hadoop.fs.gs."
    confs = {
        f"{prefix}impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
        f"{prefix}block.size": str(64 * 1024 * 1024),  # Hadoop 3.5's "64m" is not a number to the connector
    }
    if options.endpoint:
        return confs | {f"{prefix}storage.root.url": options.endpoint, f"{prefix}auth.type": "UNAUTHENTICATED"}
    if options.service_account:
        keyfile = {f"{prefix}auth.service.account.json.keyfile": options.service_account}
        return confs | {f"{prefix}auth.type": "SERVICE_ACCOUNT_JSON_KEYFILE", **keyfile}
    return confs  # the connector's default: Application Default Credentials


#: The AWS SDK's provider that reads ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``.
ENV_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"


def credentials_env(options: S3Options) -> dict[str, str]:
    """The environment a Spark process reads the settings' S3 keys from (none: its own)."""
    if not options.access_key:
        return {}
    return {"AWS_ACCESS_KEY_ID": options.access_key, "AWS_SECRET_ACCESS_KEY": options.secret_key}


#: The options this process reaches each store with (``configure``), by ``store_kind``.
_configured: dict[str, StoreOptions] = {}


def configure(settings) -> None:
    """Let this process reach the locations of ``settings``: every later ``delta_table``,
    ``has_table`` and ``open_store`` of a location on an object store uses the options of its
    store. A run's entry points call it (the CLI, the operators, a Spark app's main) before any
    table is read. A store no location of ``settings`` is on keeps the options it had."""
    kinds = {store_kind(uri) for uri in locations(settings)} - {None}
    _configured.update({kind: options_for(settings, kind) for kind in kinds})
    _reach.update({kind: _reach_of(settings, kind) for kind in kinds})


def configured_options(uri: str) -> StoreOptions | None:
    """The options ``uri`` is reached with: None for a local path; for an object store the
    configured ones, or an error that says what is missing."""
    kind = store_kind(uri)
    if kind is None:
        return None
    if kind not in _configured:
        raise RuntimeError(
            f"{uri} is on an object store, but this process was not given its settings (storage.configure)"
        )
    return _configured[kind]


def join(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended, ``/``-separated (a local path stays a local path)."""
    return "/".join([str(uri).rstrip("/"), *(p.strip("/") for p in parts)])


def read_text(uri: str) -> str:
    """The text of the file or object at ``uri``."""
    if not is_remote(uri):
        from pathlib import Path

        return Path(uri).read_text()
    parent, _, name = for_clients(uri).rpartition("/")
    return open_store(parent).get_bytes(name).decode()


def list_names(uri: str) -> list[str]:
    """The names of the files directly in folder ``uri`` (none when there is no such folder)."""
    if not is_remote(uri):
        import os

        return sorted(os.listdir(uri)) if os.path.isdir(uri) else []
    return sorted({key.split("/", 1)[0] for key in open_store(uri).list_keys()})


def open_file(uri: str):
    """A seekable binary file object reading the file or object at ``uri`` (an object is read
    whole: for small files, such as a log's checkpoint)."""
    import io

    if not is_remote(uri):
        return open(uri, "rb")
    parent, _, name = for_clients(uri).rpartition("/")
    return io.BytesIO(open_store(parent).get_bytes(name))


def exists(uri: str) -> bool:
    """Whether a file or object is at ``uri``."""
    if not is_remote(uri):
        import os

        return os.path.isfile(uri)
    parent, _, name = for_clients(uri).rpartition("/")
    return open_store(parent).head(name) is not None


def files(uri: str, suffix: str = "") -> list[str]:
    """The files (objects) directly in folder ``uri`` whose names end in ``suffix``, as locations,
    sorted by name."""
    return [join(uri, name) for name in list_names(uri) if name.endswith(suffix) and not name.startswith(".")]


def total_bytes(uris: list[str]) -> int:
    """The summed size of the files or objects at ``uris`` (one listing per folder on a store)."""
    if not uris:
        return 0
    if not is_remote(uris[0]):
        import os

        return sum(os.path.getsize(u) for u in uris)
    sizes = {}
    for folder in {u.rpartition("/")[0] for u in uris}:
        sizes |= {join(folder, m["path"]): m["size"] for m in open_store(folder).list_meta()}
    return sum(sizes.get(for_clients(u), 0) for u in uris)


def delete_tree(uri: str) -> None:
    """Delete everything at or under ``uri`` (nothing there: nothing to do)."""
    if not is_remote(uri):
        import shutil

        shutil.rmtree(uri, ignore_errors=True)
        return
    store = open_store(uri)
    for key in store.list_keys():
        store.delete(key)


def upload(parts, uri: str) -> None:
    """Put ``parts`` (an iterable of bytes, ``PART_BYTES`` each but the last) at ``uri`` as one
    object, a multipart upload visible only once complete: one cut short leaves no object, only
    parts the store discards (a bucket's lifecycle rule for incomplete uploads)."""
    parent, _, name = for_clients(uri).rpartition("/")
    open_store(parent).put_parts(name, parts)


def arrow_filesystem(options: StoreOptions):
    """pyarrow's filesystem for ``options``; empty keys: the environment's (an engine's Python
    workers get them so, never in a task)."""
    from pyarrow import fs

    if isinstance(options, GCSOptions):
        if not options.endpoint:  # the environment's credentials (GOOGLE_APPLICATION_CREDENTIALS)
            return fs.GcsFileSystem(retry_time_limit=RETRY_TIMEOUT_S)
        endpoint = urlparse(options.endpoint)
        return fs.GcsFileSystem(anonymous=True, scheme=endpoint.scheme, endpoint_override=endpoint.netloc)
    if isinstance(options, AzureOptions):
        kwargs: dict = {"account_name": options.account, "account_key": options.key or None}
        if options.endpoint:
            endpoint = urlparse(options.endpoint)
            kwargs |= {"blob_storage_authority": endpoint.netloc, "blob_storage_scheme": endpoint.scheme}
        return fs.AzureFileSystem(**kwargs)

    kwargs: dict = {
        "region": options.region or None,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "request_timeout": REQUEST_TIMEOUT_S,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=MAX_RETRIES),
    }
    if options.endpoint:
        endpoint = urlparse(options.endpoint)
        kwargs |= {"endpoint_override": endpoint.netloc, "scheme": endpoint.scheme}
    if options.access_key:
        kwargs |= {"access_key": options.access_key, "secret_key": options.secret_key}
    return fs.S3FileSystem(**kwargs)


def open_input(uri: str, options: StoreOptions | None = None):
    """What pyarrow reads file ``uri`` from: a local path as it is, an object as a random-access
    file of ranged reads (``options``: how to reach it, default the configured ones)."""
    if not is_remote(uri):
        return uri
    filesystem = arrow_filesystem(options or configured_options(uri))
    return filesystem.open_input_file(arrow_path(uri))


def read_parquet(uri: str, columns: list[str] | None = None):
    """The Parquet file at ``uri`` as a pyarrow table (only ``columns``, when given)."""
    import pyarrow.parquet as pq

    return pq.read_table(open_input(uri), columns=columns)


def parquet_rows(uri: str) -> int:
    """The rows of the Parquet file at ``uri``, from its footer."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_input(uri)).metadata.num_rows


def parquet_dataset(source: str | list[str]):
    """pyarrow's dataset of the Parquet files at ``source``: a folder (its files, those whose
    names start with ``_`` or ``.`` left out) or a list of files, all local or all on one store."""
    import pyarrow.dataset as pads

    first = source if isinstance(source, str) else (source[0] if source else "")
    if not is_remote(first):
        return pads.dataset(source, format="parquet")
    filesystem = arrow_filesystem(configured_options(first))
    paths = [arrow_path(u) for u in ([source] if isinstance(source, str) else source)]
    return pads.dataset(paths[0] if isinstance(source, str) else paths, format="parquet", filesystem=filesystem)


def worker_options(uri: str) -> StoreOptions | None:
    """How an engine's Python worker reaches ``uri``: the configured endpoint (and S3's region,
    Azure's account), no keys (the worker reads them from its environment). None: a local path."""
    options = configured_options(uri)
    if isinstance(options, S3Options):
        return S3Options(options.endpoint, options.region)
    if isinstance(options, AzureOptions):
        return AzureOptions(options.account, "", options.endpoint)
    return options  # GCS: an endpoint and a key file's path, no secret


def write_delta(uri: str, data, mode: str = "overwrite") -> None:
    """Write ``data`` (Arrow) as the Delta table at ``uri`` with delta-rs."""
    from deltalake import write_deltalake

    write_deltalake(for_clients(uri), data, mode=mode, storage_options=delta_write_options(uri))


def has_table(uri: str) -> bool:
    """Whether a Delta table is at ``uri`` (its log holds an entry)."""
    return bool(log_versions(uri))


def log_versions(uri: str) -> list[int]:
    """The versions of the table's log entries (``_delta_log/<version>.json``), from their names:
    a listing, where asking Delta replays the log."""
    names = list_names(join(uri, "_delta_log"))
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def delta_error(exc: Exception, uri: str, doing: str) -> Exception:
    """delta-rs's (or the object store's) ``exc`` while ``doing`` at table ``uri``, as one of
    wavepipe's kinds: the store not answering (``StorageUnavailableError``, saying what to check),
    a table to repair as it was; anything else a step failure naming the table and the repair."""
    if isinstance(exc, WavepipeError):
        return exc
    if is_storage_error(exc):
        return StorageUnavailableError(f"{doing} at {uri}: {store_down(uri, exc)}")
    return StepFailedError(f"{doing} at {uri} failed ({first_line(exc)}); run `wavepipe table repair`, then retry")


def delta_table(uri: str, **kwargs):
    """delta-rs's ``DeltaTable`` at ``uri``, reached with the configured options."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    options = configured_options(str(uri))
    try:
        return DeltaTable(
            for_clients(str(uri)), storage_options=delta_storage_options(options) if options else None, **kwargs
        )
    except DeltaError as exc:  # the one place delta-rs's refusal of a legacy schema is told apart
        if "Unsupported Delta table type" not in str(exc):
            raise
        raise TableNeedsRepairError(
            f"{uri}: an earlier wavepipe wrote types the Delta protocol does not define "
            f"({str(exc).splitlines()[0]}); run `wavepipe table repair`, then retry"
        ) from None


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is delta-rs refusing a commit because another writer committed first: the
    same transaction, or the table's creation."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    # A commit that lost to another is typed (CommitFailedError). A table created by another
    # writer since this one found none is not: delta-rs (1.x) raises its generic DeltaTableError
    # ("A Delta Lake table already exists at that location."), which the Python binding turns into
    # a plain DeltaError (only "not a table", protocol and commit errors get their own types), so
    # that one is told by its text.
    return isinstance(exc, CommitFailedError) or (isinstance(exc, DeltaError) and "already exists" in str(exc))


def delta_write_options(uri: str) -> dict[str, str] | None:
    """``storage_options`` for delta-rs's writers at ``uri`` (None: a local path)."""
    options = configured_options(str(uri))
    return delta_storage_options(options) if options else None


def written_files(uri: str, folder: str, suffix: str = ".parquet"):
    """The files under ``folder`` of table ``uri`` (a path relative to it) that end in ``suffix``,
    as ``delta_files.WrittenFile``s (paths relative to the table), sorted by path."""
    from wavepipe.delta_files import WrittenFile

    if not is_remote(uri):
        from pathlib import Path

        found = sorted(p for p in (Path(uri) / folder).rglob(f"*{suffix}") if p.is_file())
        return [
            WrittenFile(p.relative_to(uri).as_posix(), p.stat().st_size, int(p.stat().st_mtime * 1000)) for p in found
        ]
    store = open_store(uri)
    metas = [m for m in store.list_meta(folder) if m["path"].endswith(suffix)]
    return sorted(
        (WrittenFile(m["path"], m["size"], int(m["last_modified"].timestamp() * 1000)) for m in metas),
        key=lambda f: f.path,
    )


#: A Parquet file's last bytes read at once for its footer (most footers fit; a longer one costs
#: a second read of exactly its length).
FOOTER_GUESS = 64 * 1024


def parquet_metadata(uri: str, written):
    """The footer of Parquet file ``written`` (a ``delta_files.WrittenFile``) of table ``uri``, as
    pyarrow's ``FileMetaData``: on an object store one or two ranged reads of the file's end."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_remote(uri):
        return pq.read_metadata(join(uri, written.path))
    store = open_store(uri)
    tail = store.get_range(written.path, max(0, written.size - FOOTER_GUESS), written.size)
    needed = int.from_bytes(tail[-8:-4], "little") + 8
    if needed > len(tail):
        tail = store.get_range(written.path, written.size - needed, written.size)
    return pq.read_metadata(pa.BufferReader(tail))


#: A multipart upload's part size and parts in flight (a staged file is tens of MB to GBs).
PART_BYTES, PART_CONCURRENCY = 16 * 1024 * 1024, 4


class Store:
    """The objects under one location, with the writes an object store can make atomically."""

    def __init__(self, uri: str, options: StoreOptions | None = None):
        from obstore.store import LocalStore

        self.uri = for_clients(uri)
        kind = store_kind(self.uri)
        if kind is None:
            self._store = LocalStore(self.uri, mkdir=True)
            return
        parsed = urlparse(self.uri)
        self._store = _obstore_store(kind, parsed.netloc, parsed.path.strip("/") or None, options)

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``key`` whole (a reader sees the old object or the new one, never a part)."""
        import obstore

        obstore.put(self._store, key, data)

    def put_if(self, key: str, data: bytes, tag: str | None = None) -> str | None:
        """Write ``key`` if it does not exist (``tag`` None) or is still the version ``tag`` (from
        ``get_tagged`` or an earlier ``put_if``) names; the new version's tag, or None when another
        writer was first (an object store only for ``tag``: a local folder has no conditional
        replace)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

        try:
            return version_tag(obstore.put(self._store, key, data, mode="create" if tag is None else put_mode(tag)))
        except (AlreadyExistsError, PreconditionError):
            return None
        except (NotFoundError, FileNotFoundError):  # replaced: the version was removed since; created: no bucket
            if tag is None:
                raise
            return None

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """``key``'s bytes and their version's tag (``version_tag``); None if there is no such object."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            found = obstore.get(self._store, key)
        except (NotFoundError, FileNotFoundError):
            return None
        return bytes(found.bytes()), version_tag(found.meta)

    def put_parts(self, key: str, parts) -> None:
        """Write ``key`` from ``parts`` (bytes, in order) in one multipart upload: whole or not at all."""
        import obstore

        obstore.put(self._store, key, parts, chunk_size=PART_BYTES, max_concurrency=PART_CONCURRENCY)

    def get_bytes(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self._store, key).bytes())

    def head(self, key: str) -> dict | None:
        """The object's size, modification time and ETag; None if there is none."""
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            return dict(obstore.head(self._store, key))
        except (NotFoundError, FileNotFoundError):  # obstore raises either, by call
            return None

    def list_keys(self, prefix: str = "") -> list[str]:
        return sorted(meta["path"] for meta in self.list_meta(prefix))

    def list_meta(self, prefix: str = "") -> list[dict]:
        """Each object under ``prefix``: its ``path``, ``size``, ``last_modified`` and ``e_tag``."""
        import obstore

        return [dict(meta) for batch in obstore.list(self._store, prefix or None) for meta in batch]

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key`` (one ranged read)."""
        import obstore

        return bytes(obstore.get_range(self._store, key, start=start, end=end))

    def delete(self, key: str) -> None:
        import obstore

        obstore.delete(self._store, key)


def version_tag(meta) -> str:
    """The tag of one version of an object, from what a put returned or a read's metadata: its
    ETag (S3, Azure: what ``If-Match`` compares), and where the store gives one its version
    (GCS: the generation ``ifGenerationMatch`` compares), as ``["<etag>", "<version>"]``."""
    import json

    return json.dumps([meta["e_tag"], meta["version"]]) if meta.get("version") else meta["e_tag"]


def put_mode(tag: str) -> dict[str, str]:
    """obstore's put mode that replaces only the version ``tag`` (``version_tag``) names."""
    import json

    e_tag, version = json.loads(tag) if tag.startswith("[") else (tag, None)
    return {"e_tag": e_tag, **({"version": version} if version else {})}


def open_store(uri: str, options: StoreOptions | None = None) -> Store:
    """The objects under ``uri``, reached with ``options`` (default: the configured ones)."""
    return Store(uri, options or configured_options(str(uri)))


def _obstore_patience() -> dict:
    """obstore's client and retry options of ``DELTA_RS_PATIENCE``."""
    from datetime import timedelta

    return {
        "client_options": {"connect_timeout": f"{CONNECT_TIMEOUT_S}s", "timeout": f"{REQUEST_TIMEOUT_S}s"},
        "retry_config": {"max_retries": MAX_RETRIES, "retry_timeout": timedelta(seconds=RETRY_TIMEOUT_S)},
    }


#: Each store's options when none are given: the environment's credentials.
_DEFAULT_OPTIONS = {"s3": S3Options, "gcs": GCSOptions, "azure": AzureOptions}


def _obstore_store(kind: str, bucket: str, prefix: str | None, options: StoreOptions | None):
    """obstore's store of ``bucket`` (an S3 or GCS bucket, an Azure container) under ``prefix``."""
    from obstore.store import AzureStore, GCSStore, S3Store

    options = options or _DEFAULT_OPTIONS[kind]()
    patience = _obstore_patience()
    if kind == "s3":
        return S3Store(bucket, prefix=prefix, **_obstore_config(options), **patience)
    config, client = _cloud_config(options)
    patience["client_options"] |= client
    made = GCSStore if kind == "gcs" else AzureStore
    return made(bucket, prefix=prefix, config=config, **patience)


def _cloud_config(options: GCSOptions | AzureOptions) -> tuple[dict[str, str], dict[str, str]]:
    """The object_store configuration of a GCS or Azure store (the keys obstore and delta-rs
    share), and its HTTP client's options."""
    if isinstance(options, GCSOptions):
        if options.endpoint:  # an emulator: its API, without OAuth
            key = {"service_account_key": cloud_access.emulator_service_account(options.endpoint)}
            return key, ({"allow_http": "true"} if options.endpoint.startswith("http://") else {})
        return ({"service_account": options.service_account} if options.service_account else {}), {}
    found = {"account_name": options.account, "account_key": options.key, "endpoint": options.endpoint}
    return {k: v for k, v in found.items() if v}, ({"allow_http": "true"} if options.plain_http else {})


def _obstore_config(options: S3Options) -> dict:
    config: dict = {"region": options.region} if options.region else {}
    if options.endpoint:
        config |= {"endpoint": options.endpoint, "virtual_hosted_style_request": False}
        config["allow_http"] = options.plain_http
    if options.access_key:
        config |= {"access_key_id": options.access_key, "secret_access_key": options.secret_key}
    return config
