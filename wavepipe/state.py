"""Where a run's state is kept (plans, claims, step records, locks, ledgers): a local folder, or a
prefix on an object store (``state_uri``) that workers on other hosts share.

Both keep the same keys (``runs/<run_id>/plan.json``, ``groups/<group>/active.json``, ...) and
give the same guarantees by different means:

* a write is whole: the local folder writes a temporary file and renames it; an object store's PUT
  is atomic by itself;
* a create is refused when the key exists: ``link(2)`` of a written file, or the store's
  conditional PUT (S3, Azure: ``If-None-Match: *``; GCS: ``ifGenerationMatch=0``), which exactly
  one of several racing writers wins;
* a lock keeps two processes out of one step: an OS file lock (``flock``, dropped by the kernel
  when its holder dies) or a *lease*: an object naming its holder and its expiry, created if
  absent, renewed by its holder every third of ``lease_s`` with a conditional replace of the
  version it wrote (``If-Match`` its ETag; GCS: ``ifGenerationMatch`` its generation; the
  version's tag, ``storage.version_tag``), and taken over only when it has expired, or when its holder was a
  process on this host that is gone. A holder that cannot renew (stalled longer than the lease)
  loses it and says so in its log; the data's own guarantees (the Delta transaction, the offsets'
  check before their commit) still keep each waveform once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tenacity

from wavepipe import storage, waiting
from wavepipe.contracts.errors import ConflictError
from wavepipe.contracts.runfiles import write_bytes_atomic

log = logging.getLogger(__name__)

#: Seconds between tries of a lock another process holds.
LOCK_RETRY_S = 1.0


class StepBusyError(ConflictError):
    """The same step of the same run is executing in another process right now."""


#: Locks this process holds (by location), so a step called inside ``run_once`` does not wait on itself.
_held: set[str] = set()


def process_gone(host: Any, pid: Any) -> bool:
    """Whether ``pid`` on ``host`` is known to have exited: only a process of this host can be
    looked at (another host's is never taken as gone)."""
    if host != socket.gethostname() or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    import psutil

    try:  # a zombie (exited, not reaped yet) is gone too
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def busy_message(what: str, holder: str, waited: float, wait_s: float) -> str:
    return (
        f"{what} is running in another process right now ({holder}); two of them must not overlap."
        + (f" Waited {waited:.0f}s." if wait_s else "")
        + " Wait for it, or stop it and retry."
    )


def lock_retrying(
    what: str, wait_s: float, retry: tenacity.retry_base, holder: Callable[[tenacity.RetryCallState], str]
) -> tenacity.Retrying:
    """Tries of a lock while ``retry`` says another process holds it: every ``LOCK_RETRY_S``,
    logging who it waits for (``holder``) each minute, for up to ``wait_s`` seconds; then
    ``StepBusyError`` naming the holder. Whatever else a try raises is raised at once."""

    def say(state: tenacity.RetryCallState) -> None:
        if int(state.seconds_since_start) % 60 == 0:
            log.info("waiting for %s (%s) to finish", what, holder(state))

    def refuse(state: tenacity.RetryCallState) -> None:
        raise StepBusyError(busy_message(what, holder(state), state.seconds_since_start, wait_s))

    return tenacity.Retrying(
        retry=retry,
        stop=tenacity.stop_after_delay(wait_s),
        wait=tenacity.wait_fixed(LOCK_RETRY_S),
        before_sleep=say,
        retry_error_callback=refuse,
    )


def lease_verdict(lease: dict, now: float) -> str:
    """What a lease found on a lock means: ``expired`` (its holder stopped renewing it), ``orphaned``
    (its holder was a process of this host that is gone), else ``held``."""
    if not isinstance(lease.get("expires_at"), int | float) or lease["expires_at"] < now:
        return "expired"
    return "orphaned" if process_gone(lease.get("host"), lease.get("pid")) else "held"


class LocalState:
    """The run state in a local (or shared POSIX) folder."""

    remote = False

    def __init__(self, root: Path):
        self.root = Path(root)

    def where(self, key: str) -> str:
        return str(self.root / key)

    def read(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, key: str, data: bytes) -> None:
        write_bytes_atomic(self.root / key, data)

    def create(self, key: str, data: bytes) -> bool:
        path = self.root / key
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        write_bytes_atomic(tmp, data)
        try:
            os.link(tmp, path)  # fails if the key exists; readers never see a half-written one
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def listing(self, prefix: str) -> list[tuple[str, float]]:
        """``(key, modified epoch seconds)`` of each entry directly under folder ``prefix``."""
        return self.entries(prefix)[0]

    def folders(self, prefix: str) -> dict[str, float]:
        """Each folder directly under ``prefix``: when an entry of it was last added, replaced or
        removed (a write's rename changes its folder's time)."""
        return self.entries(prefix)[1]

    def entries(self, prefix: str) -> tuple[list[tuple[str, float]], dict[str, float]]:
        """``listing`` and ``folders`` of ``prefix`` from one look at it; an entry another process
        removes meanwhile is left out."""
        files, folders = [], {}
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(self.root / prefix) as found:
            for entry in found:
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_dir():
                        folders[entry.name] = entry.stat().st_mtime
                    elif entry.is_file():
                        files.append((f"{prefix.rstrip('/')}/{entry.name}", entry.stat().st_mtime))
        return files, folders

    def delete_folder(self, prefix: str) -> None:
        import shutil

        shutil.rmtree(self.root / prefix, ignore_errors=True)

    def append(self, key: str, line: str, keep: int) -> None:
        """Add ``line`` to the text at ``key``, keeping about its last ``keep`` lines."""
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:  # one short write per line: appends from two runs do not interleave
            fh.write(line + "\n")
        if path.stat().st_size > keep * 1000:
            self.write(key, "".join(f"{kept}\n" for kept in path.read_text().splitlines()[-keep:]).encode())

    @contextmanager
    def lock(self, key: str, what: str, wait_s: float = 0.0) -> Iterator[None]:
        """Hold ``key`` exclusively, or raise ``StepBusyError``: at once, or after waiting up to
        ``wait_s`` seconds (logging who it waits for each minute). An OS file lock (``flock``):
        the kernel drops it when the holder exits, also on SIGKILL, so a crashed step never blocks
        its retry. It serialises processes on one machine or on a shared filesystem with working
        ``flock`` (local disks; not every NFS)."""
        import fcntl

        path = self.root / key
        if str(path) in _held:
            yield
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:

            def holder(_: tenacity.RetryCallState) -> str:
                return f"pid {os.pread(fd, 64, 0).decode(errors='replace').strip() or '?'}"

            # flock refuses at once (BlockingIOError) while another process holds the lock
            taking = lock_retrying(what, wait_s, tenacity.retry_if_exception_type(BlockingIOError), holder)
            taking(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            _held.add(str(path))
            try:
                yield
            finally:
                _held.discard(str(path))
        finally:
            os.close(fd)  # releases the lock


class ObjectState:
    """The run state under a prefix of an object store: conditional puts and leases."""

    remote = True
    #: tries of a read-modify-write (``append``) that meets other writers
    APPEND_TRIES = 8

    def __init__(self, uri: str, lease_s: float):

        self.uri = uri.rstrip("/")
        self.lease_s = lease_s
        self._store = _Answering(storage.open_store(self.uri), self.uri)

    def where(self, key: str) -> str:
        return f"{self.uri}/{key}"

    def read(self, key: str) -> bytes | None:
        found = self._store.get_tagged(key)
        return None if found is None else found[0]

    def write(self, key: str, data: bytes) -> None:
        self._store.put_bytes(key, data)

    def create(self, key: str, data: bytes) -> bool:
        return self._store.put_if(key, data) is not None

    def delete(self, key: str) -> None:
        if self._store.head(key) is not None:
            self._store.delete(key)

    def exists(self, key: str) -> bool:
        return self._store.head(key) is not None

    def listing(self, prefix: str) -> list[tuple[str, float]]:
        return self.entries(prefix)[0]

    def folders(self, prefix: str) -> dict[str, float]:
        """Each "folder" directly under ``prefix`` (the first part of a longer key): its newest
        object's time."""
        return self.entries(prefix)[1]

    def entries(self, prefix: str) -> tuple[list[tuple[str, float]], dict[str, float]]:
        """``listing`` and ``folders`` of ``prefix`` from one listing of the store."""
        folder = prefix.rstrip("/") + "/"
        files, folders = [], {}
        for m in self._store.list_meta(folder):
            name, nested, _ = m["path"][len(folder) :].partition("/")
            modified = m["last_modified"].timestamp()
            if nested:
                folders[name] = max(folders.get(name, 0.0), modified)
            else:
                files.append((m["path"], modified))
        return files, folders

    def delete_folder(self, prefix: str) -> None:
        for m in self._store.list_meta(prefix.rstrip("/") + "/"):
            self._store.delete(m["path"])

    def append(self, key: str, line: str, keep: int) -> None:
        """Add ``line`` to the text at ``key``, keeping its last ``keep`` lines: a conditional
        replace of the version read, tried again (``APPEND_TRIES`` in all) while other writers
        are first; then the line is logged, not added."""

        def add() -> str | None:
            found = self._store.get_tagged(key)
            lines = found[0].decode().splitlines() if found else []
            text = "".join(f"{kept}\n" for kept in [*lines, line][-keep:]).encode()
            return self._store.put_if(key, text, found[1] if found else None)

        def not_added(_: tenacity.RetryCallState) -> None:
            log.warning(
                "could not add to %s: %d other writers were first; the line was: %s", key, self.APPEND_TRIES, line
            )

        tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda etag: etag is None),
            stop=tenacity.stop_after_attempt(self.APPEND_TRIES),
            retry_error_callback=not_added,
        )(add)

    @contextmanager
    def lock(self, key: str, what: str, wait_s: float = 0.0) -> Iterator[None]:
        """Hold ``key`` as a lease (see the module's doc), or raise ``StepBusyError``: at once, or
        after waiting up to ``wait_s`` seconds."""
        if self.where(key) in _held:
            yield
            return
        lease = Lease(self._store, key, self.lease_s)
        # take() names the lease's holder while another process holds it, else None
        taking = lock_retrying(
            what, wait_s, tenacity.retry_if_result(lambda holder: holder is not None), lambda s: s.outcome.result()
        )
        taking(lease.take)
        _held.add(self.where(key))
        try:
            yield
        finally:
            _held.discard(self.where(key))
            lease.release()


class _Answering:
    """A store whose failures (no answer, no bucket, refused keys) raise ``StorageUnavailableError``
    in one line that says what to check (obstore's own message runs to dozens of lines)."""

    def __init__(self, store, uri: str):
        self._store, self._uri = store, uri

    def __getattr__(self, name: str):
        call = getattr(self._store, name)

        def answered(*args, **kwargs):
            from obstore.exceptions import BaseError

            try:
                return call(*args, **kwargs)
            except Exception as exc:
                if not (isinstance(exc, BaseError) or storage.is_storage_error(exc)):
                    raise
                said = storage.store_down(self._uri, exc, what="the run state's object store")
                raise storage.StorageUnavailableError(said) from None

        return answered


class Lease:
    """One process's lease on a key of an object store (``ObjectState.lock``)."""

    def __init__(self, store, key: str, lease_s: float):
        self.store, self.key, self.lease_s = store, key, lease_s
        self.owner = uuid.uuid4().hex
        self.etag: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps(
            {
                "owner": self.owner,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "expires_at": time.time() + self.lease_s,
            }
        ).encode()

    def take(self) -> str | None:
        """Take the lease: None when taken, else who holds it (for a message)."""
        self.etag = self.store.put_if(self.key, self._body())
        if self.etag is None:
            found = self.store.get_tagged(self.key)
            if found is None:
                return "a holder that just let go"
            try:
                current = json.loads(found[0])
            except ValueError:
                current = {}
            verdict = lease_verdict(current, time.time())
            if verdict == "held":
                left = current["expires_at"] - time.time()
                return (
                    f"pid {current.get('pid', '?')} on {current.get('host', '?')}, its lease good for {left:.0f}s more"
                )
            self.etag = self.store.put_if(self.key, self._body(), found[1])
            if self.etag is None:
                return "another process that took it over first"
            log.warning("took over the lock %s: its holder's lease was %s (%s)", self.key, verdict, current)
        self._renewer = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._renewer.start()
        return None

    def _renew(self) -> None:
        """Every third of the term until released. A store that fails (``STORAGE_ERRORS``) is
        tried again before the lease runs out; any other error stops the renewal, logged once with
        its traceback (the lease then runs out within its term)."""
        while not self._stop.wait(self.lease_s / 3):
            try:
                etag = self.store.put_if(self.key, self._body(), self.etag)
            except Exception as exc:
                if not waiting.expected(exc, storage.STORAGE_ERRORS):
                    hint = (
                        f"it runs out within {self.lease_s:.0f}s and another process may take it over; the Delta "
                        "transaction and Kafka's offsets still keep each waveform once"
                    )
                    waiting.stopped(exc, f"the lease {self.key} to be renewed", hint)
                    return
                log.warning("could not renew the lease %s (%s); trying again", self.key, storage.briefly(exc))
                continue
            if etag is None:
                log.error(
                    "lost the lease %s: another process took it over (this one stalled longer than %.0fs); "
                    "the Delta transaction and Kafka's offsets still keep each waveform once",
                    self.key,
                    self.lease_s,
                )
                return
            self.etag = etag

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still this one's (never raises: a lease
        that could not be deleted runs out within its term)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        try:
            found = self.store.get_tagged(self.key)
            if found is not None and found[1] == self.etag:
                self.store.delete(self.key)
        except Exception as exc:  # the store did not answer: the step's own outcome stands
            log.warning(
                "could not let go of the lease %s (%s); it runs out within %.0fs",
                self.key,
                storage.briefly(exc),
                self.lease_s,
            )


def open_state(settings) -> LocalState | ObjectState:
    """The run state of ``settings``: ``state_uri`` on an object store, else the ``home`` folder."""
    if storage.is_remote(settings.state_uri):
        return ObjectState(settings.state_uri, settings.state_lease_s)
    return LocalState(Path(settings.state_uri) if settings.state_uri else settings.home)
