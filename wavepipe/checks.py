"""``wavepipe check``: each configured service tried the way a run uses it, one line each saying
what works or what to fix. The Airflow Connections' Test buttons (``wavepipe.plugins.connections``)
run the same checks, so a Connection that tests green is one a run accepts.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wavepipe import storage
from wavepipe.contracts.config import Settings, redact_url
from wavepipe.contracts.errors import BUGS


@dataclass(frozen=True)
class Check:
    """One service's outcome: ``ok`` True (works), False (a run would fail: ``line`` says what
    to fix) or None (not running now, and a run starts it on demand)."""

    service: str
    ok: bool | None
    line: str

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "idle"}[self.ok]
        return f"{mark} {self.service:<8} {self.line}"


def _tried(service: str, attempt: Callable[[], Check], fix: str) -> Check:
    """``attempt()``, or a failed check with the error's first line, and ``fix`` unless the error
    is wavepipe's own (those say what to do)."""
    try:
        return attempt()
    except BUGS:
        raise
    except Exception as exc:
        first = redact_url(str(exc).splitlines()[0][:400]) if str(exc) else type(exc).__name__
        said = type(exc).__module__.startswith("wavepipe.")
        return Check(service, False, first if said else f"{first}; {fix}")


def check_kafka(settings: Settings, timeout_s: float = 10.0) -> Check:
    """The cluster answers with the credentials a run uses, and the topic is there."""
    from wavepipe.consumers.kafka_admin import cluster_metadata

    def attempt() -> Check:
        began = time.monotonic()
        meta = cluster_metadata(settings, timeout=timeout_s)
        took = time.monotonic() - began
        topic = meta.topics.get(settings.topic)
        where = f"{len(meta.brokers)} broker(s) at {settings.bootstrap_servers} answered in {took:.1f}s"
        if topic is None or topic.error is not None:
            return Check("kafka", True, f"{where}; topic {settings.topic!r} is not there yet (a producer makes it)")
        return Check("kafka", True, f"{where}; topic {settings.topic!r} has {len(topic.partitions)} partition(s)")

    return _tried(
        "kafka",
        attempt,
        "check the brokers (`wavepipe kafka up` for this machine's), bootstrap_servers and kafka_client_config",
    )


def check_engine(settings: Settings) -> Check:
    """The Spark engine attaches and runs a query: its version and the query's seconds."""
    from wavepipe.local.engine_server import LocalEngine

    if settings.spark_engine == "submit":
        return Check(
            "spark", None, f"a spark-submit app per step, master {settings.spark_master} (started by each run)"
        )
    if not settings.spark_remote and LocalEngine(settings).pid() is None:
        return Check("spark", None, "this home's engine is not running; a run starts it (`wavepipe spark up` now)")

    def attempt() -> Check:
        from wavepipe.engine_client import attached

        with attached(settings) as spark:
            began = time.monotonic()
            rows = spark.range(3).count()
            took = time.monotonic() - began
            version = spark.version
        if rows != 3:
            return Check("spark", False, f"a query of 3 rows counted {rows}: the engine is not well")
        where = redact_url(settings.spark_remote) or "this home's engine"
        return Check("spark", True, f"Spark {version} at {where} ran a query in {took:.2f}s")

    return _tried("spark", attempt, "check the engine (`wavepipe spark status`) and spark_remote")


def check_location(settings: Settings, name: str, uri: str) -> Check:
    """A location a run writes: an object written, read back and deleted; on an object store
    also its conditional writes, as the run state uses them (a second create and a replace of a
    stale version refused, a replace of the current one made)."""
    kind = storage.store_kind(uri)

    def attempt() -> Check:
        store = storage.open_store(uri, storage.options_for(settings, kind) if kind else None)
        key = f".wavepipe-check/{uuid.uuid4().hex}"
        body = b"wavepipe check"
        began = time.monotonic()
        try:
            refused = _conditional_writes(store, key, body) if kind else store.put_bytes(key, body)
            if refused:
                return Check(name, False, f"{uri}: {refused}; its run state would not be safe there")
            if store.get_bytes(key) != body:
                return Check(name, False, f"{uri}: an object read back differs from what was written")
        finally:
            if store.head(key) is not None:
                store.delete(key)
            if not kind:  # a folder's store leaves the probe's folder
                with contextlib.suppress(OSError):
                    (Path(uri) / ".wavepipe-check").rmdir()
        made = "conditional writes proved, " if kind else ""
        return Check(name, True, f"{uri}: written, {made}read back and deleted in {time.monotonic() - began:.2f}s")

    settings_hint = storage.KIND_SETTINGS.get(kind or "s3")
    own = storage.own_command(settings, kind or "s3")
    own = f" (`{own}` for this home's own)" if own else ""
    return _tried(name, attempt, f"check the store{own}, that the bucket exists, and the {settings_hint} settings")


def _conditional_writes(store, key: str, body: bytes) -> str | None:
    """Create ``key`` (last with ``body``) the way the run state does; what the store got wrong, or None."""
    first = store.put_if(key, b"first")
    if first is None:
        return "a create of a new object was refused"
    if store.put_if(key, b"again") is not None:
        return "a second create of one object was allowed (no If-None-Match / ifGenerationMatch=0)"
    current = store.put_if(key, body, first)
    if current is None:
        return "a replace of the current version was refused"
    if store.put_if(key, b"stale", first) is not None:
        return "a replace of a stale version was allowed (no If-Match / ifGenerationMatch)"
    return None


def check_airflow(settings: Settings) -> Check:
    """This home's Airflow: its services and the health of its API."""
    from wavepipe.local import airflow

    if not any(airflow.running(settings).values()):
        return Check("airflow", None, "this home's Airflow is not running (`wavepipe airflow up` starts it)")
    report = airflow.health(settings)
    if report is None:
        return Check(
            "airflow", False, f"{airflow.airflow_url(settings)} does not answer; see `wavepipe airflow status`"
        )
    bad = airflow.unhealthy(report)
    if bad:
        return Check("airflow", False, f"unhealthy: {', '.join(bad)}; see `wavepipe airflow status` and its logs")
    return Check("airflow", True, f"{airflow.airflow_url(settings)}: every service healthy")


def check_all(settings: Settings) -> list[Check]:
    """Every service a run uses, as configured; an object store location once."""
    checks = [check_kafka(settings), check_engine(settings)]
    locations = {
        "tables": settings.tables_location,
        "staging": settings.staging_location,
        "state": settings.state_uri or str(settings.home),
    }
    checks += [check_location(settings, name, uri) for name, uri in locations.items()]
    return [*checks, check_airflow(settings)]
