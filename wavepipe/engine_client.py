"""Attaching a run to its Spark engine: a long-lived Spark Connect server.

A run's Spark work (reassemble, validate, publish) runs in the run's own process as a Spark
Connect client: it attaches in well under a second to a server that is already warm (JVM, Delta,
Python workers), where a spark-submit app pays 8-16 s of start-up every time.

* Locally, the server is this home's own engine, started on demand: the package's
  ``wavepipe.engines`` entry point ``local`` names it (``wavepipe.local.engine_server.LocalEngine``),
  so the run reaches it without importing the local development servers.
* Elsewhere, ``spark_remote`` (``sc://host:port``, or in Airflow the apache-spark provider's
  ``spark_connect`` Connection) names the cluster's server.
* ``spark_engine = "submit"`` keeps the old path: one spark-submit app per step.

All runs of a home share one server-side session (``session_id``): Spark 4.2 keeps a Python
worker daemon per session until the server stops (about 50 MB, more with idle workers), so one
session per run would grow the server without bound; one shared session also keeps its Python
workers warm. Runs never release the session, and they change its configuration: the publish's
Parquet writes (``spark_apps.tables.write_files``) set ``spark.sql.parquet.outputTimestampType``
to ``TIMESTAMP_MICROS`` (as Delta writes) and ``mapreduce.fileoutputcommitter.marksuccessfuljobs``
to ``false`` (no ``_SUCCESS`` file), always to those values, which then stay for every command on
the session. A VACUUM with a retention under Delta's safe one (``wavepipe.maintenance``) turns
Delta's retention check off for its command (for every user of the session meanwhile) and unsets
it after.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import tenacity

from wavepipe import faults, storage, waiting
from wavepipe.contracts.config import Settings, SettingsError, redact_url
from wavepipe.contracts.errors import BUGS, EngineGoneError, UnavailableError
from wavepipe.contracts.runfiles import read_json_or, write_json_atomic
from wavepipe.spark_launch import current_phase, local_session

log = logging.getLogger("wavepipe.engine")

#: Spark Connect's port when a URL names none.
DEFAULT_PORT = 15002
#: Seconds a TCP connection to the engine may take to open.
CONNECT_TIMEOUT_S = 5.0


class EngineUnavailableError(UnavailableError):
    """The Spark Connect server cannot be reached; the message says what to start or fix."""


class OwnEngine(Protocol):
    """This home's own engine, as a run uses it when ``spark_remote`` is not set."""

    log_file: Path

    def ensure_up(self, restart: bool = True) -> str:
        """Its URL, started (or, with ``restart``, restarted when idle and due) first if need be."""

    def in_use(self) -> contextlib.AbstractContextManager:
        """Held while a step works on it: no restart meanwhile."""

    def pid(self) -> int | None: ...

    def running(self, pid: int) -> bool:
        """Whether ``pid`` is still this engine's server."""

    def ui_url(self) -> str | None: ...

    def renew_session(self, session_id: str) -> None:
        """Attach every later step to ``session_id`` (the server closed the old one)."""


#: The entry point group and name of the engine a run uses when ``spark_remote`` is not set.
ENGINES, OWN = "wavepipe.engines", "local"


@functools.cache
def _own_engine() -> Callable[[Settings], OwnEngine]:
    found = metadata.entry_points(group=ENGINES, name=OWN)
    if not found:
        raise EngineUnavailableError(
            f"no Spark engine: spark_remote is not set and the installed wavepipe names no {ENGINES} entry point "
            f"{OWN!r}; set spark_remote (in Airflow, the Connection wavepipe_spark), or reinstall wavepipe"
        )
    return next(iter(found)).load()


def own_engine(settings: Settings) -> OwnEngine:
    """This home's own engine (the ``wavepipe.engines`` entry point ``local``)."""
    return _own_engine()(settings)


def accepts(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def shared_session_id(key: str) -> str:
    """A stable session id (a UUID, as Spark Connect requires) for ``key``."""
    return str(uuid.UUID(bytes=hashlib.sha256(key.encode()).digest()[:16], version=4))


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port[/;param=value...]``) with ``session_id`` set."""
    base, _, params = url.partition(";")
    kept = [p for p in params.split(";") if p and not p.startswith("session_id=")]
    return base.rstrip("/") + "/;" + ";".join(kept + [f"session_id={session_id}"])


def _url_key(url: str) -> str:
    """A key for the server ``url`` names and the user it attaches as, whatever the spelling
    (``sc://h:15002`` and ``sc://h:15002/`` are one server) and without its secrets (a token)."""
    host, port = _host_port(url)
    user = next((p.split("=", 1)[1] for p in url.split(";")[1:] if p.startswith("user_id=")), "")
    return hashlib.sha256(f"{host.lower()}:{port}|{user}".encode()).hexdigest()[:16]


def _remote_session_file(settings: Settings) -> Path:
    return settings.home / "spark-connect" / "remote-session.json"


def remote_url(settings: Settings, restart: bool = True) -> tuple[str, str]:
    """(the URL to attach to, what to do when it is down). Starts this home's server on demand
    (and with ``restart`` restarts it when idle and due, see ``LocalEngine.ensure_up``)."""
    if settings.spark_remote:
        url = settings.spark_remote
        given = next((p.split("=", 1)[1] for p in url.split(";")[1:] if p.startswith("session_id=")), None)
        session_id = given or _renewed_sessions(settings).get(_url_key(url))
        session_id = session_id or shared_session_id(f"{settings.home}|{_url_key(url)}")
        return with_session_id(url, session_id), (
            f"check that the Spark Connect server {redact_url(settings.spark_remote)} is up and reachable (the "
            "spark_remote setting, or the Airflow Connection wavepipe_spark)"
        )
    return own_engine(settings).ensure_up(
        restart
    ), "start it with `wavepipe spark up` (its log is under <home>/spark-connect/)"


def _renewed_sessions(settings: Settings) -> dict[str, str]:
    """The session ids ``_renew`` chose, per remote server: none when the file is missing or damaged."""
    known = read_json_or(_remote_session_file(settings), {})
    return known if isinstance(known, dict) else {}


def _renew(settings: Settings) -> None:
    """A new shared session id, after the server closed the old one (it never reopens an id)."""
    new = str(uuid.uuid4())
    if settings.spark_remote:
        path = _remote_session_file(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        known = _renewed_sessions(settings)
        known[_url_key(settings.spark_remote)] = new
        write_json_atomic(path, known)
    else:
        own_engine(settings).renew_session(new)


def require_reachable(settings: Settings) -> None:
    """Fail at once, in one line that says what to fix, when the remote engine does not accept
    connections (before a run reads anything it could not process)."""
    _require_accepts(*remote_url(settings))


def _require_accepts(url: str, hint: str) -> None:
    host, port = _host_port(url)
    if not accepts(host, port, CONNECT_TIMEOUT_S):
        raise EngineUnavailableError(f"the Spark engine at sc://{host}:{port} is not reachable: {hint}")


_sessions: dict[str, object] = {}
_sessions_lock = threading.Lock()


def _host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url.split(";")[0].replace("sc://", "http://", 1))
    return parsed.hostname or "", parsed.port or DEFAULT_PORT


def _session(url: str):
    """This process's session on ``url`` (made and checked once, then reused)."""
    with _sessions_lock:
        spark = _sessions.pop(url, None)
        if spark is not None and not spark.is_stopped:
            try:
                _ = spark.version  # one round trip: a server restarted since has another session
                _sessions[url] = spark
                return spark
            except BUGS:
                raise
            except Exception as exc:
                log.info(
                    "the Spark engine's session of this process is gone (%s): attaching again",
                    redact_url(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__,
                )
                _close_quietly(spark)
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        # A channel of its own to the server: gRPC shares connections to one address between
        # channels, so a channel to a server that was just restarted on the same port would
        # inherit the dead connection's reconnect backoff and fail with "Connection refused".
        channel = DefaultChannelBuilder(url, channelOptions=[("grpc.use_local_subchannel_pool", 1)])
        # what pyspark's own builder.remote() sets: pyspark.sql.functions build Connect columns
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        spark = ConnectSession.builder.channelBuilder(channel).create()
        spark.release_session_on_close = False  # shared with other runs: never released
        spark.client.set_retry_policies([_short_retries()])
        try:
            _ = spark.version  # one round trip: a closed session id fails here, not in the step
        except Exception:
            with contextlib.suppress(Exception):
                spark.client.close()
            raise
        _sessions[url] = spark
        # closed before pyspark's own exit hook (atexit runs the last registered first), which
        # would otherwise call a server that may be gone, retrying for RETRY_FOR_S
        atexit.register(_close_quietly, spark)
        return spark


def _close_quietly(spark) -> None:
    with contextlib.suppress(Exception):
        spark.client.close()


#: How long a step retries a server that does not answer (restarting, or a network blip) before
#: it fails: Spark Connect's default policy waits up to 10 minutes, which looks like a hang.
RETRY_FOR_S = 10.0


def _short_retries():
    from pyspark.sql.connect.client.retries import DefaultPolicy

    # 50 ms, 200 ms, 800 ms, then 2 s steps: about RETRY_FOR_S in all
    return DefaultPolicy(max_retries=3 + int((RETRY_FOR_S - 1.05) // 2), max_backoff=2000)


def _closed_session(exc: BaseException) -> bool:
    text = str(exc)
    return any(code in text for code in ("SESSION_CLOSED", "SESSION_CHANGED", "INVALID_HANDLE"))


@contextlib.contextmanager
def attached(settings: Settings) -> Iterator[object]:
    """A Spark Connect session on the engine for the duration of a step (one per process and
    server, reused). The session is never released: other runs share it."""
    engine = None if settings.spark_remote else own_engine(settings)
    remote_url(settings)  # starts a local server that is down; may restart an idle one that holds too much
    with engine.in_use() if engine else contextlib.nullcontext():
        # as it is now that no restart can happen under this step (started again if it stopped
        # meanwhile; a start in progress is waited for)
        url, hint = remote_url(settings, restart=False)
        _require_accepts(url, hint)
        host, port = _host_port(url)
        try:
            spark = _session(url)
        except BUGS:
            raise
        except Exception as exc:
            if "INVALID_CONNECT_URL" in str(exc):
                raise SettingsError(
                    f"spark_remote {redact_url(settings.spark_remote)}: Spark Connect refuses it "
                    f"({redact_url(str(exc).splitlines()[0])})"
                ) from None
            if not _closed_session(exc):
                raise EngineUnavailableError(
                    f"the Spark engine at sc://{host}:{port} did not answer "
                    f"({redact_url(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)})"
                    f": {hint}"
                ) from exc
            log.info("the Spark engine closed the shared session: attaching to a new one")
            _renew(settings)
            url, _ = remote_url(settings, restart=False)  # this step holds the in-use lock: no restart now
            spark = _session(url)
        faults.attached_engine(engine.pid() if engine else None)
        try:
            with _watched(engine, spark) as died:
                yield spark
        except Exception as exc:
            store_down = storage.unreachable(settings) if storage.is_storage_error(exc) else None
            if store_down:
                raise storage.StorageUnavailableError(store_down) from exc
            lost = _lost_reason(exc, died, f"sc://{host}:{port}")
            if lost or _closed_session(exc):
                with _sessions_lock:
                    _sessions.pop(url, None)  # the next step attaches afresh
            if lost:
                raise EngineLostError(_lost_message(lost, engine)) from exc
            raise
        finally:
            faults.attached_engine(None)


class EngineLostError(EngineUnavailableError, EngineGoneError):
    """The engine died, was stopped or stopped answering during a step; the message is one line
    that says what happened and what to run next."""


#: How often a step checks that its local engine's JVM is still there.
WATCH_S = 0.5
#: Sessions whose engine died or stopped answering: no call is made on them any more.
_lost: weakref.WeakSet = weakref.WeakSet()


def lost(spark) -> bool:
    """Whether ``spark``'s engine died or stopped answering (a call on it would only wait)."""
    return spark in _lost


@contextlib.contextmanager
def _watched(engine: OwnEngine | None, spark) -> Iterator[dict]:
    """While a step runs on this home's engine: a JVM that exits is noticed within ``WATCH_S``,
    and the session's channel is closed so the step's call fails at once instead of retrying a
    server that is gone. Yields what it saw (``pid``: the JVM that exited)."""
    died: dict = {}
    pid = engine.pid() if engine else None
    if pid is None:
        yield died
        return
    stop = threading.Event()
    died["watched"] = pid

    def watch() -> None:
        while not stop.wait(WATCH_S):
            if not engine.running(pid):
                died["pid"] = pid
                _lost.add(spark)
                _close_quietly(spark)
                return

    threading.Thread(target=watch, name="spark-engine-watch", daemon=True).start()
    try:
        yield died
    except BaseException:
        if not engine.running(pid):  # it went before the watch looked again
            died["pid"] = pid
        raise
    finally:
        stop.set()


#: What a call says when its engine went away (gRPC, Spark Connect's client, Spark's scheduler).
_GONE = (
    "StatusCode.UNAVAILABLE",
    "RETRIES_EXCEEDED",
    "Connection refused",
    "Socket closed",
    "Channel closed",
    "Stream removed",
)
_STOPPED = ("SparkContext was shut down", "SparkContext has been shutdown", "SparkContext is stopped")


def _lost_reason(exc: BaseException, died: dict, address: str) -> str | None:
    """How the step's engine went away, in words, or None when ``exc`` is another failure."""
    text = f"{exc!r} {exc}"
    during = f"during Spark step {current_phase() or 'the step'}"
    if died.get("pid"):
        return f"the Spark engine's JVM (pid {died['pid']}) exited {during}"
    if any(marker in text for marker in _STOPPED):
        return f"the Spark engine was stopped {during} (`wavepipe spark restart --force`, or its JVM shut down)"
    if any(marker in text for marker in _GONE):
        return f"the Spark engine at {address} stopped answering {during}"
    return None


def _lost_message(reason: str, engine: OwnEngine | None) -> str:
    where = f"the engine's log: {engine.log_file}" if engine else "check the Spark Connect server (spark_remote)"
    return (
        f"{reason}. Nothing the step wrote was committed, and the run's plan and staged chunks are kept: run it "
        f"again (`wavepipe run` resumes the run and starts the engine; in Airflow, clear the failed task); {where}"
    )


def after_failure(spark, exc: BaseException) -> None:
    """After a failed step, while its engine is still there: free what the step left cached."""
    if not lost(spark) and _lost_reason(exc, {}, "") is None:
        drop_cached_data(spark)


@contextlib.contextmanager
def sole_writer(spark, settings: Settings) -> Iterator[None]:
    """Tag this step's operations as the writer of ``settings``' tables, after interrupting any
    operation still running under that tag. Called under the tables' lock: whoever held it before
    is gone (a killed client's operations keep running on the server for a while), so a retry
    never writes beside the attempt it replaces."""
    tag = "wavepipe-writer-" + hashlib.sha256(str(settings.tables_dir).encode()).hexdigest()[:16]
    stale = spark.interruptTag(tag)
    if stale:
        log.warning(
            "interrupted %d operation(s) of an earlier step that died writing %s", len(stale), settings.tables_dir
        )
    spark.addTag(tag)
    try:
        yield
    except BaseException as exc:
        # the step failed or was stopped here (a task killed by Airflow, Ctrl-C): what it started
        # on the server must not go on writing after the tables' lock is released (a server that
        # is gone writes nothing: it is not called, which would only wait)
        if not lost(spark) and _lost_reason(exc, {}, "") is None:
            with contextlib.suppress(Exception):
                spark.interruptTag(tag)
        raise
    finally:
        with contextlib.suppress(Exception):
            spark.removeTag(tag)


@contextlib.contextmanager
def counted_jobs(spark, settings: Settings, into: dict) -> Iterator[None]:
    """Tag the step's operations; afterwards ``into["jobs"]`` lists the Spark jobs they started,
    from the engine's own job list (``spark_jobs``), or is None where the engine has no job list
    to ask (a remote engine) or it did not answer: the list only describes a run, never fails it."""
    tag = f"wavepipe-jobs-{uuid.uuid4().hex[:16]}"
    spark.addTag(tag)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            spark.removeTag(tag)
        ui = (settings.spark_ui.rstrip("/") or None) if settings.spark_remote else own_engine(settings).ui_url()
        into["jobs"] = _listed_jobs(ui, tag) if ui else None


#: Seconds a request to the engine's web UI waits for its answer.
UI_TIMEOUT_S = 10.0


def _listed_jobs(ui: str, tag: str, attempts: int = 2) -> list[dict] | None:
    """``spark_jobs``, or None where the engine's UI could not say. A loaded engine's UI answers
    late: each request waits up to ``UI_TIMEOUT_S``; a quick failure (``http_client.FAILED``: no
    connection, an error page, the UI starting) is asked again a second later, up to ``attempts``
    times in all, one after half of ``UI_TIMEOUT_S`` is not (a UI that does not answer would hold
    every step up). Any other error is not asked again: logged once with its traceback, and None
    (the list only describes a run)."""

    def say(state: tenacity.RetryCallState) -> None:
        log.warning(
            "could not list the step's Spark jobs from %s (attempt %d): %s",
            ui,
            state.attempt_number,
            state.outcome.exception(),
        )

    def given_up(state: tenacity.RetryCallState) -> None:
        say(state)
        return None

    from wavepipe import http_client

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(http_client.FAILED),
        stop=tenacity.stop_after_attempt(attempts) | tenacity.stop_after_delay(UI_TIMEOUT_S / 2),
        wait=tenacity.wait_fixed(1),
        before_sleep=say,
        retry_error_callback=given_up,
    )
    try:
        return retrying(spark_jobs, ui, tag)
    except Exception as exc:  # not http_client.FAILED (those end in given_up): a bug, not asked again
        waiting.stopped(exc, f"the step's Spark jobs from {ui}", "the run's report lists no jobs for it")
        return None


class StageProgress:
    """A Spark Connect progress handler (``spark.registerProgressHandler``): what the engine says
    of the operation running now (its stages, tasks done of all, bytes read) and how many
    operations finished, for a step's progress lines (``summary``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, int, int, int, int]] = {}
        self._finished = 0

    def __call__(self, stages, inflight_tasks: int, operation_id: str | None, done: bool) -> None:
        stages = list(stages or ())
        key = operation_id or "?"
        with self._lock:
            if done:  # said once, when the operation ends
                self._finished += 1
                self._running.pop(key, None)
                return
            self._running[key] = (
                sum(1 for s in stages if s.done),
                len(stages),
                sum(s.num_completed_tasks for s in stages),
                sum(s.num_tasks for s in stages),
                sum(s.num_bytes_read for s in stages),
            )

    def summary(self) -> str | None:
        """``Spark: 2 operation(s) done; now 1/2 stage(s), 14/16 task(s), 85.2 MB read``."""
        with self._lock:
            parts = [f"{self._finished} operation(s) done"] if self._finished else []
            for stages_done, stages, tasks_done, tasks, read in self._running.values():
                parts.append(
                    f"now {stages_done}/{stages} stage(s), {tasks_done}/{tasks} task(s), {read / 1e6:.1f} MB read"
                )
        return f"Spark: {'; '.join(parts)}" if parts else None


@contextlib.contextmanager
def stage_progress(spark) -> Iterator[StageProgress]:
    """A ``StageProgress`` fed by the session's operations while the block runs (none where the
    client has no progress handlers: only a description of the step)."""
    handler = StageProgress()
    try:
        spark.registerProgressHandler(handler)
    except Exception as exc:
        log.debug("no Spark progress for this step: %s", exc)
        yield handler
        return
    try:
        yield handler
    finally:
        with contextlib.suppress(Exception):
            spark.removeProgressHandler(handler)


def _get_json(url: str):
    from wavepipe import http_client

    return http_client.get_json(url, timeout_s=UI_TIMEOUT_S)


def _ui_time(text: str | None) -> datetime | None:
    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z") if text else None


def spark_jobs(ui: str, tag: str, settle_s: float = 3.0) -> list[dict]:
    """The jobs the engine at ``ui`` ran for operations tagged ``tag`` (Spark Connect marks its
    jobs with its clients' tags), oldest first: id, name, seconds, status and stages. The engine
    records a job's end a moment after the operation returns: waits up to ``settle_s`` for none
    to be running."""
    (app,) = [a["id"] for a in _get_json(f"{ui}/api/v1/applications")][:1]
    deadline = time.monotonic() + settle_s
    while True:
        jobs = [
            j
            for j in _get_json(f"{ui}/api/v1/applications/{app}/jobs")
            if any(t == tag or t.endswith(f"_Tag_{tag}") for t in j.get("jobTags") or ())
        ]
        if all(j["status"] != "RUNNING" for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out = []
    for j in sorted(jobs, key=lambda j: j["jobId"]):
        began, ended = _ui_time(j.get("submissionTime")), _ui_time(j.get("completionTime"))
        operation = next((t.rsplit("_Operation_", 1)[1] for t in j["jobTags"] if "_Operation_" in t), "")
        out.append(
            {
                "id": j["jobId"],
                "operation": operation[:8],
                "kind": plan_kind(j.get("name") or ""),
                "s": round((ended - began).total_seconds(), 3) if began and ended else None,
                "status": j["status"],
                "stages": len(j["stageIds"]),
            }
        )
    return out


_PLAN_WRAPPERS = {"plan", "root", "common", "command"}


def plan_kind(name: str) -> str:
    """What a Spark Connect job ran, from its name (the start of the client's plan, as text): its
    outermost relation or command, e.g. ``aggregate``, ``write_operation``, ``sql_command``."""
    for line in name.splitlines():
        word = line.strip().removesuffix("{").strip()
        if line.rstrip().endswith("{") and word and word not in _PLAN_WRAPPERS:
            return word
    return "?"


def drop_cached_data(spark) -> None:
    """After a failed step: free what it left cached. That is everything cached on the shared
    session, also what steps of other runs cached: theirs recompute it (slower, never wrong)."""
    with contextlib.suppress(Exception):
        spark.catalog.clearCache()


@contextlib.contextmanager
def table_session(settings: Settings) -> Iterator[object]:
    """A session to read (or maintain) the tables with: on the engine (``spark_engine =
    "connect"``), else an in-process one, stopped afterwards."""
    if settings.spark_engine == "connect":
        with attached(settings) as spark:
            yield spark
        return

    spark = local_session(settings, "wavepipe-read")
    try:
        yield spark
    finally:
        spark.stop()
