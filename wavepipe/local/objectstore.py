"""A real S3-compatible object store on this machine: SeaweedFS, started on loopback like the broker.

SeaweedFS (Apache-2.0) serves the S3 API over its own master, volume and filer servers, all in
one ``weed server`` process here. It keeps S3's conditional writes (``If-None-Match: *`` creates
an object only if it is absent, ``If-Match`` replaces only the version that was read), which is
what wavepipe's exactly-once rests on when its state lives in a bucket.

The server is a Go module: ``weed_binary`` builds it once with the machine's Go from the Go module
proxy into the tools cache (``.cache/go/`` in a checkout; a few minutes), as ``docker/check``
builds the Compose plugin. Its data, config, credentials, ports and pid file live under one
folder (``<home>/objectstore``); ``up`` returns once the S3 API answers a signed request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tenacity

from wavepipe import objectstore_access, processes
from wavepipe.jars import SetupError, require_tool
from wavepipe.local.kafka import free_port, port_is_free
from wavepipe.storage import S3Options, open_store
from wavepipe.waiting import wait_until

#: The SeaweedFS release wavepipe's tests and ``make demo`` use (the Go module proxy's newest).
WEED_MODULE = "github.com/seaweedfs/seaweedfs"
WEED_VERSION = "v0.0.0-20261109003541-7506e5f91cd6"
#: The SeaweedFS release that module version is (``weed version``): the compose stack's image tag.
WEED_RELEASE = "4.53"
READY_TIMEOUT_S = 60.0
#: The internal servers besides S3, each with an HTTP and a gRPC port.
INTERNAL = ("master", "volume", "filer")


def weed_binary(tools_dir: Path, *, say=None) -> Path:
    """The ``weed`` server binary at ``WEED_VERSION``, built once into ``tools_dir``.

    ``go install module@version`` refuses this module (its go.mod has replace directives), so it
    is built inside the downloaded module instead, read-only, with the module's own go.sum."""
    target = tools_dir / f"weed-{WEED_VERSION}"
    if target.exists():
        return target
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    go = require_tool(
        "go",
        "Install Go 1.21 or newer, which fetches the Go 1.26 toolchain SeaweedFS needs (Debian 12: golang-go "
        "from bookworm-backports; see the README); it builds SeaweedFS, the object store.",
    )
    say(f"building SeaweedFS {WEED_VERSION} (the local S3 object store) with Go into {target} (once; about 5 minutes)")
    began = time.monotonic()
    source = go_module_source(go, WEED_MODULE, WEED_VERSION)
    tools_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    run_go(go, "-C", source, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), "./weed", readonly=True)
    partial.replace(target)
    say(f"built SeaweedFS in {time.monotonic() - began:.0f}s: {target}")
    return target


def go_module_source(go: str, module: str, version: str) -> str:
    """The folder of ``module@version``'s source in Go's module cache (read-only), downloaded
    from the Go module proxy the first time."""
    fetched = run_go(go, "mod", "download", "-json", f"{module}@{version}")
    source = json.loads(fetched).get("Dir")
    if not source:
        raise SetupError(f"the Go module proxy did not serve {module}@{version}: {fetched[-500:]}")
    return source


def run_go(go: str, *args: str, readonly: bool = False) -> str:
    """One ``go`` command's output; a failure says what to check."""
    env = {**os.environ, **({"GOFLAGS": "-mod=readonly"} if readonly else {})}
    result = subprocess.run([go, *args], capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise SetupError(
            f"`go {' '.join(args[:3])} ...` failed:\n{result.stderr[-3000:]}\n"
            "Check that the Go module proxy is reachable (GOPROXY) and the disk has 3 GB free, then retry."
        )
    return result.stdout


#: The master's settings (``master.toml`` keys as ``WEED_`` variables). A restart on new internal
#: ports looks to SeaweedFS like a master that lost its state, and by default it then freezes volume
#: growth until an operator checks the cluster: every write needing a new volume (a new bucket, a
#: full volume) would fail or hang. One node with one disk has no other state to check against:
#: no freeze, and one a store made before (it is kept on disk) lifted after a second.
WEED_ENV = {
    "WEED_MASTER_VOLUME_GROWTH_FREEZE_ON_TOPOLOGY_MISMATCH": "false",
    "WEED_MASTER_VOLUME_GROWTH_STATE_LOSS_RECOVERY_WAIT": "1s",
}

#: Starts tried when one of the store's internal ports (picked free) was taken before it bound it.
START_TRIES = 3


class PortTakenError(SetupError):
    """The store did not start: one of its internal ports, picked free, was taken before it bound it."""


@dataclass
class LocalObjectStore:
    """One local SeaweedFS keeping its data and config in ``folder``, its S3 API on ``port``."""

    folder: Path
    port: int
    tools_dir: Path
    host: str = objectstore_access.HOST
    #: The bucket ``up`` makes sure of.
    bucket: str = "wavepipe"

    @classmethod
    def from_settings(cls, settings) -> LocalObjectStore:
        return cls(objectstore_access.store_folder(settings.home), settings.object_store_port, settings.tools_dir)

    @property
    def endpoint(self) -> str:
        return objectstore_access.endpoint(self.port, self.host)

    @property
    def pid_file(self) -> Path:
        return self.folder / "weed.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / "weed.log"

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    def credentials(self) -> dict[str, str]:
        """This store's access key and secret, made the first time (kept in the folder, 0600)."""
        return objectstore_access.credentials(self.folder)

    def client_options(self) -> dict[str, str]:
        """What an S3 client needs for this store (the keys of ``wavepipe.storage.S3Options``)."""
        return objectstore_access.client_options(self.folder, self.port, self.host)

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if processes.alive(pid, "weed") else None

    def up(self) -> str:
        """Start the store (building SeaweedFS the first time) and wait until S3 answers."""
        if self.pid() is not None:
            self.wait_ready()
            return f"object store already running at {self.endpoint} (pid {self.pid()})"
        if not port_is_free(self.host, self.port):
            raise SetupError(
                f"port {self.port} on {self.host} is in use by another process. Stop it, or set "
                "WAVEPIPE_OBJECT_STORE_PORT=<free port> to run the local object store elsewhere."
            )
        # an internal port taken between our pick and its bind (another program's start): new ports
        starting = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(PortTakenError),
            stop=tenacity.stop_after_attempt(START_TRIES),
            reraise=True,
        )
        proc = starting(self._start_answering)
        return f"object store (SeaweedFS S3) {self.endpoint} started (pid {proc.pid}, data in {self.data_dir})"

    def _start_answering(self) -> subprocess.Popen:
        """Start the server and wait until S3 answers; one that does not is stopped again, its
        error raised (``PortTakenError`` when its log says an internal port was taken)."""
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        proc = self.start()
        try:
            self.wait_ready(proc)
        except SetupError as exc:
            self.down()
            if "address already in use" in self._log_since(log_offset):
                raise PortTakenError(str(exc)) from exc
            raise
        except BaseException:
            self.down()
            raise
        return proc

    def _log_since(self, offset: int) -> str:
        with self.log_file.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def start(self) -> subprocess.Popen:
        """Write the S3 identities and launch ``weed server``; returns at once."""
        weed = weed_binary(self.tools_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        creds = self.credentials()
        identity = {
            "name": "wavepipe",
            "credentials": [{"accessKey": creds["access_key"], "secretKey": creds["secret_key"]}],
        }
        identity["actions"] = ["Admin", "Read", "List", "Tagging", "Write"]
        config = self.folder / "s3.json"
        config.touch(mode=0o600)
        config.write_text(json.dumps({"identities": [identity]}))
        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(
                [str(weed), "server", *self._flags(config)],
                env={**os.environ, **WEED_ENV},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.folder,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc

    def _flags(self, config: Path) -> list[str]:
        """``weed server``'s flags: everything on loopback, the internal servers on free ports,
        the extra catalog servers off, small volumes (a test machine's disk)."""
        flags = [f"-ip={self.host}", f"-ip.bind={self.host}", f"-dir={self.data_dir}", "-filer", "-s3"]
        for server in INTERNAL:
            flags += [f"-{server}.port={free_port()}", f"-{server}.port.grpc={free_port()}"]
        flags += [f"-s3.port={self.port}", f"-s3.port.grpc={free_port()}", f"-s3.config={config}"]
        flags += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-master.volumeSizeLimitMB=256", "-volume.max=0"]
        flags += ["-master.telemetry=false"]  # it would report to seaweedfs.com
        return flags

    def wait_ready(self, proc: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        """Until a signed write and read of a marker object in ``bucket`` succeed (which also
        makes the bucket: the local identity is an admin, and SeaweedFS makes a missing bucket on
        an admin's first upload)."""
        from obstore.exceptions import BaseError

        store = open_store(f"s3://{self.bucket}", S3Options(**self.client_options()))

        def answers() -> bool:
            if proc is not None and proc.poll() is not None:
                raise SetupError(f"the object store exited with code {proc.returncode}; see {self.log_file}")
            store.put_bytes(".wavepipe-store", b"wavepipe's local object store\n")
            store.get_bytes(".wavepipe-store")
            return True

        # not answering yet: obstore's errors (refused, 5xx, no bucket yet) or the OS's (a NotFound)
        wait_until(
            answers,
            timeout,
            f"the object store at {self.endpoint} to answer",
            retry_on=(BaseError, OSError),
            hint=f"see its log {self.log_file}",
            error=SetupError,
        )

    def down(self, timeout: float = 30.0) -> str:
        """Stop the store (SIGTERM; SIGKILL after ``timeout``)."""
        return processes.stop_server("object store", self.pid(), self.pid_file, lambda: self.pid() is not None, timeout)

    def kill(self, timeout: float = 30.0) -> int | None:
        """SIGKILL the store (a crash); returns the pid it had, once its port is free again."""
        pid = self.pid()
        if pid is not None:
            os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
            while self.pid() is not None or not port_is_free(self.host, self.port):
                if time.monotonic() > deadline:
                    raise SetupError(
                        f"the object store (pid {pid}) still holds port {self.port} {timeout:.0f}s after SIGKILL"
                    )
                time.sleep(0.1)
        return pid

    def status(self) -> str:
        pid = self.pid()
        return f"object store running at {self.endpoint} (pid {pid})" if pid else "object store is not running"
