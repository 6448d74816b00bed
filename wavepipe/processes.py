"""The processes the local services leave: found and signalled through psutil, in one place.

Every service manager keeps a pid file; a pid alone proves nothing (it may have been recycled by
another program, or be a zombie), so each asks ``alive(pid, marker)``: a live process whose
command line names what it should be.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

#: States of a process that has exited but is not reaped yet: it holds no resource and does no work.
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


@contextlib.contextmanager
def file_lock(path: Path, mode: int = fcntl.LOCK_EX, waiting: str | None = None, wait: bool = True) -> Iterator[bool]:
    """Hold ``path`` locked in ``mode`` (``fcntl.LOCK_SH`` or ``LOCK_EX``) for the block; yields
    whether it is held. Taken at once if free, else: with ``wait``, waited for (logging
    ``waiting`` first, if given); without, not taken (yields False). The lock goes with the
    process: one killed while holding it holds nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if waiting:
                log.warning("%s", waiting)
            fcntl.flock(fh, mode)
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def alive(pid: int | None, marker: str | None = None, *, allow_blank: bool = False) -> bool:
    """Whether ``pid`` is a live process (not a zombie) whose command line contains ``marker``.

    ``allow_blank``: a command line that reads empty also counts (it does for an instant while
    setproctitle rewrites it, as Airflow's services do)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() in _GONE:
            return False
        if marker is None:
            return True
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return (allow_blank and not cmdline) or marker in cmdline


def _members(key) -> list[int]:
    found = []
    for proc in psutil.process_iter(["status"]):
        if proc.pid == os.getpid() or proc.info["status"] in _GONE:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            if key(proc):
                found.append(proc.pid)
    return found


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a service started with ``start_new_session`` and all it
    started), this process left out."""
    return _members(lambda proc: os.getsid(proc.pid) == sid)


def in_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``, this process left out."""
    return _members(lambda proc: os.getpgid(proc.pid) == pgid)


def with_environment(entry: str) -> list[int]:
    """The live processes whose environment holds ``entry`` (``NAME=value``), this process left out."""
    name, _, value = entry.partition("=")
    return _members(lambda proc: proc.environ().get(name) == value)


def send(pids: list[int], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to each of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_server(name: str, pid: int | None, pid_file, still_running, timeout: float) -> str:
    """Stop the server ``name`` whose process group is ``pid`` (``stop_group``; None: it is not
    running) and remove its ``pid_file``; what was done, in one line."""
    if pid is not None:
        stop_group(pid, still_running, timeout)
    pid_file.unlink(missing_ok=True)
    return f"{name} (pid {pid}) stopped" if pid is not None else f"{name} is not running"


def stop_group(pid: int, still_running, timeout: float) -> None:
    """Stop the process group of ``pid``: SIGTERM (a clean shutdown), then SIGKILL if
    ``still_running()`` still says so after ``timeout`` seconds."""
    import time

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and still_running():
        time.sleep(0.2)
    if still_running():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def supervise(argv: list[str], *, min_uptime_s: float = 30.0, pause_s: float = 2.0, say=print) -> int:
    """Run ``argv`` and start it again each time it crashes after running ``min_uptime_s`` or
    more (a service whose loop died on an error it could not handle); a crash sooner, or an exit
    with 0, ends the supervision with its code (a start that fails is for the caller to report).
    Signals that end the supervisor's process group end the service with it."""
    import subprocess
    import time

    while True:
        began = time.monotonic()
        code = subprocess.call(argv)
        ran = time.monotonic() - began
        if code == 0 or code < 0 or ran < min_uptime_s:
            return code
        say(f"wavepipe: {' '.join(argv[-2:])} exited with {code} after {ran:.0f}s; starting it again", flush=True)
        time.sleep(pause_s)
