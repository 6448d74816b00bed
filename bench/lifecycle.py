"""What a benchmark starts, it stops: the local broker, object store and Spark engines it had to
start, and the Airflow services of its own homes, when it ends, fails, or is stopped with SIGTERM
or Ctrl-C. What ran before it keeps running.

``stopping_what_it_starts()`` wraps a whole benchmark: inside it SIGTERM ends the benchmark as
Ctrl-C does (a ``KeyboardInterrupt``), so every ``finally`` that stops a service runs; a second
signal while it stops things is ignored (SIGKILL still ends it). ``start(name, service)`` starts
a local service (``up``/``down``/``pid``) and, if it was not running, stops it on the way out.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

log = logging.getLogger("wavepipe.bench")

#: Services that were not running when the benchmark began (name, service): stopped on the way
#: out if they run then, in reverse order.
_found_stopped: list[tuple[str, Service]] = []


class Service(Protocol):
    def up(self) -> str: ...

    def down(self) -> str: ...

    def pid(self) -> int | None: ...


def as_found(name: str, service: Service) -> None:
    """Leave ``service`` as it is now when the benchmark ends: if it is not running now and runs
    then (the benchmark, or a run it made, started it), it is stopped."""
    if service.pid() is None:
        _found_stopped.append((name, service))


def start(name: str, service: Service) -> str:
    """``service.up()``, stopped again when the benchmark ends if it was not running before."""
    as_found(name, service)
    return service.up()


class Stopped(KeyboardInterrupt):
    """The benchmark was sent SIGTERM."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, _ignore)
    raise Stopped("stopped by SIGTERM")


def _ignore(signum, frame) -> None:
    log.warning("SIGTERM again: still stopping what the benchmark started (SIGKILL ends it at once)")


@contextmanager
def stopping_what_it_starts() -> Iterator[None]:
    """Run a benchmark: SIGTERM interrupts it like Ctrl-C, and what it ``start``-ed is stopped
    however it ends."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except KeyboardInterrupt:
        log.warning("the benchmark was stopped; stopping what it started")
        raise
    finally:
        signal.signal(signal.SIGTERM, _ignore)
        try:
            _stop_started()
        finally:
            signal.signal(signal.SIGTERM, previous)


def _stop_started() -> None:
    while _found_stopped:
        name, service = _found_stopped.pop()
        try:
            if service.pid() is not None:
                log.info("%s: %s", name, service.down())
        except Exception:  # one that will not stop must not keep the others running
            log.exception("%s did not stop; stop it by hand", name)
