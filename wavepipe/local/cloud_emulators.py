"""Real local servers of the GCS and Azure Blob APIs, started on loopback like the object store.

- GCS: fake-gcs-server (BSD-2), a Go module built once with the machine's Go from the Go module
  proxy into the tools cache (``.cache/go/``), as ``objectstore.weed_binary`` builds SeaweedFS.
  v1.56.1 serves the JSON API, but not the XML API's writes that Rust's object_store (obstore,
  delta-rs) sends: an unsigned ``PUT`` is refused and ``x-goog-if-generation-match`` ignored. So
  wavepipe adds them before building (``resources/fake-gcs-server/xml_writes.go``: uploads,
  copies and multipart uploads that honour the generation precondition, and ``start-after`` in
  listings), which is what Google's own API does.
- Azure: Azurite (MIT), Microsoft's emulator, from the npm registry into ``.cache/npm/`` (its
  newest release for node 20). It keeps Azure's conditional writes (``If-None-Match: *``,
  ``If-Match``) as they are.

Each keeps its data, log and pid file under one folder of the home; ``up`` returns once the API
answers and the ``wavepipe`` bucket (container) is there.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from wavepipe import cloud_access, processes
from wavepipe.jars import SetupError, require_tool
from wavepipe.local.kafka import port_is_free
from wavepipe.local.objectstore import go_module_source, run_go
from wavepipe.waiting import wait_until

FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"
FAKE_GCS_VERSION = "v1.56.1"
#: wavepipe's additions to fake-gcs-server: new files of its ``fakestorage`` package, and edits
#: of its own files, (file, text, replacement): each text must be there once (a module that
#: changed is a build error, not a silent miss).
FAKE_GCS_ADDITIONS = Path(__file__).resolve().parent.parent / "resources" / "fake-gcs-server"
_ROUTES = "\t// Signed URLs (upload and download)\n"
_LISTED = '\t\tVersions:  r.URL.Query().Get("versions") == "true",\n\t}\n'
_LISTING = "\tfor _, obj := range response.Objects {\n\t\tresult.Contents = append("
FAKE_GCS_EDITS = (
    ("fakestorage/server.go", _ROUTES, "\ts.xmlWriteRoutes(handler)\n" + _ROUTES),
    ("fakestorage/object.go", _LISTED, _LISTED[:-4] + '\t\tStartOffset: r.URL.Query().Get("start-after"),\n\t}\n'),
    (
        "fakestorage/object.go",
        _LISTING,
        _LISTING.replace("\t\tresult", "\t\tif obj.Name == opts.StartOffset {\n\t\t\tcontinue\n\t\t}\n\t\tresult"),
    ),
)
AZURITE_VERSION = "3.35.0"
#: wavepipe's edit of Azurite: its flat listing honours ``startFrom`` (names after it only), which
#: object_store sends for a listing from an offset (delta-rs lists a table's log so) and Azure
#: serves; 3.35.0 ignores it, and delta-rs then reads old log entries as new ones.
AZURITE_EDIT = (
    "dist/src/blob/handlers/ContainerHandler.js",
    "                blobItems: blobs.map(item => {",
    '                blobItems: blobs.filter(item => !request.getQuery("startFrom") || '
    'item.name > request.getQuery("startFrom")).map(item => {',
)
READY_TIMEOUT_S = 60.0
#: The bucket (GCS) or container (Azure) ``up`` makes sure of.
BUCKET = "wavepipe"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def fake_gcs_binary(tools_dir: Path, *, say=_say) -> Path:
    """fake-gcs-server ``FAKE_GCS_VERSION`` with wavepipe's additions, built once into
    ``tools_dir`` (a new build when the additions change: their digest is in the name)."""
    digest = hashlib.sha256()
    for name in sorted(p.name for p in FAKE_GCS_ADDITIONS.iterdir()):
        digest.update((FAKE_GCS_ADDITIONS / name).read_bytes())
    digest.update(repr(FAKE_GCS_EDITS).encode())
    target = tools_dir / f"fake-gcs-server-{FAKE_GCS_VERSION}-{digest.hexdigest()[:8]}"
    if target.exists():
        return target
    go = require_tool("go", "Install Go 1.21 or newer (see the README); it builds fake-gcs-server, the GCS emulator.")
    say(f"building fake-gcs-server {FAKE_GCS_VERSION} (the local GCS emulator) with Go into {target} (once)")
    began = time.monotonic()
    source = go_module_source(go, FAKE_GCS_MODULE, FAKE_GCS_VERSION)
    tools_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    with tempfile.TemporaryDirectory(prefix="fake-gcs-server-") as scratch:  # the module cache stays read-only
        tree = Path(scratch) / "src"
        shutil.copytree(source, tree, copy_function=shutil.copyfile)
        _add_xml_writes(tree)
        run_go(go, "-C", str(tree), "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), ".", readonly=True)
    partial.replace(target)
    say(f"built fake-gcs-server in {time.monotonic() - began:.0f}s: {target}")
    return target


def _add_xml_writes(tree: Path) -> None:
    """Put wavepipe's additions into a copy ``tree`` of the module (its folders made writable)."""
    for folder in [tree, *(p for p in tree.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    for added in FAKE_GCS_ADDITIONS.glob("*.go"):
        shutil.copyfile(added, tree / "fakestorage" / added.name)
    for edit in FAKE_GCS_EDITS:
        _edit(tree, *edit, f"{FAKE_GCS_MODULE}@{FAKE_GCS_VERSION}")


def _edit(tree: Path, name: str, text: str, replacement: str, what: str) -> None:
    """Replace ``text`` in file ``name`` of ``tree`` (``what``'s source) by ``replacement``; a
    file without exactly one ``text`` is a ``SetupError`` (a release that changed there)."""
    found = (tree / name).read_text()
    if found.count(text) != 1:
        raise SetupError(f"{what}'s {name} is not the one wavepipe's edit fits; reinstall {what}")
    (tree / name).write_text(found.replace(text, replacement))


def azurite_install(npm_dir: Path, *, say=_say) -> Path:
    """Azurite's blob server ``AZURITE_VERSION``, installed once from the npm registry under
    ``npm_dir``; returns its launcher."""
    digest = hashlib.sha256(repr(AZURITE_EDIT).encode()).hexdigest()[:8]
    folder = npm_dir / f"azurite-{AZURITE_VERSION}-{digest}"
    launcher = folder / "node_modules" / ".bin" / "azurite-blob"
    if launcher.exists():
        return launcher
    npm = require_tool("npm", "Install Node.js 20 with npm (Debian 12: apt-get install nodejs npm); it runs Azurite.")
    say(f"installing Azurite {AZURITE_VERSION} (the local Azure Blob emulator) with npm into {folder} (once)")
    began = time.monotonic()
    partial = folder.with_suffix(".part")
    shutil.rmtree(partial, ignore_errors=True)
    command = [npm, "install", "--prefix", str(partial), "--no-audit", "--no-fund", "--omit=dev"]
    result = subprocess.run([*command, f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SetupError(
            f"`npm install azurite@{AZURITE_VERSION}` failed:\n{result.stderr[-3000:]}\n"
            "Check that the npm registry is reachable (npm config get registry) and node is 20 or newer, then retry."
        )
    _edit(partial / "node_modules" / "azurite", *AZURITE_EDIT, AZURITE_VERSION)
    shutil.rmtree(folder, ignore_errors=True)
    partial.replace(folder)
    say(f"installed Azurite in {time.monotonic() - began:.0f}s: {launcher}")
    return launcher


def npm_dir(tools_dir: Path) -> Path:
    """Where npm packages are installed: beside the Go builds (``.cache/npm``)."""
    return tools_dir.parent / "npm"


@dataclass
class Emulator:
    """One emulator server keeping its data, log and pid file in ``folder``, its API on ``port``."""

    folder: Path
    port: int
    tools_dir: Path
    host: str = cloud_access.HOST
    #: What it emulates (for messages) and what its command line contains (to know its pid).
    name = ""
    marker = ""

    @property
    def pid_file(self) -> Path:
        return self.folder / "server.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / "server.log"

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    def command(self) -> list[str]:
        raise NotImplementedError

    def make_bucket(self, bucket: str) -> None:
        """Make ``bucket`` (a container on Azure) if it is not there."""
        raise NotImplementedError

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if processes.alive(pid, self.marker) else None

    def up(self) -> str:
        """Start the server (building or installing it the first time) and wait until its API
        answers and ``BUCKET`` is there."""
        if self.pid() is not None:
            self.wait_ready()
            return f"{self.name} already running at {self.endpoint} (pid {self.pid()})"
        if not port_is_free(self.host, self.port):
            raise SetupError(
                f"port {self.port} on {self.host} is in use by another process: stop it, or set the emulator's "
                "port setting (gcs_emulator_port / azure_emulator_port) to a free port"
            )
        command = self.command()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        try:
            self.wait_ready(proc)
        except BaseException:
            self.down()
            raise
        return f"{self.name} {self.endpoint} started (pid {proc.pid}, data in {self.data_dir})"

    def wait_ready(self, proc: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        """Until ``BUCKET`` is made (or found) through the API."""

        def answers() -> bool:
            if proc is not None and proc.poll() is not None:
                raise SetupError(f"the {self.name} exited with code {proc.returncode}; see {self.log_file}")
            self.make_bucket(BUCKET)
            return True

        wait_until(
            answers,
            timeout,
            f"the {self.name} at {self.endpoint} to answer",
            retry_on=(OSError,),  # refused, reset, a 5xx while it starts (urllib's errors are OSErrors)
            hint=f"see its log {self.log_file}",
            error=SetupError,
        )

    def down(self, timeout: float = 30.0) -> str:
        """Stop the server (SIGTERM; SIGKILL after ``timeout``)."""
        return processes.stop_server(self.name, self.pid(), self.pid_file, lambda: self.pid() is not None, timeout)

    def status(self) -> str:
        pid = self.pid()
        return f"{self.name} running at {self.endpoint} (pid {pid})" if pid else f"{self.name} is not running"


class GCSEmulator(Emulator):
    """fake-gcs-server on loopback, its objects in files under the folder."""

    name = "GCS emulator (fake-gcs-server)"
    marker = "fake-gcs-server"

    @classmethod
    def from_settings(cls, settings) -> GCSEmulator:
        return cls(cloud_access.gcs_folder(settings.home), settings.gcs_emulator_port, settings.tools_dir)

    @property
    def endpoint(self) -> str:
        return cloud_access.gcs_endpoint(self.port, self.host)

    def command(self) -> list[str]:
        where = f"{self.host}:{self.port}"
        flags = ["-scheme", "http", "-host", self.host, "-port", str(self.port), "-backend", "filesystem"]
        flags += ["-filesystem-root", str(self.data_dir), "-public-host", where, "-external-url", self.endpoint]
        return [str(fake_gcs_binary(self.tools_dir)), *flags, "-log-level", "warn"]

    def make_bucket(self, bucket: str) -> None:
        body = json.dumps({"name": bucket}).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=wavepipe",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        _send(request, already=409)


class AzureEmulator(Emulator):
    """Azurite's blob server on loopback, its blobs and metadata under the folder."""

    name = "Azure emulator (Azurite)"
    marker = "azurite"

    @classmethod
    def from_settings(cls, settings) -> AzureEmulator:
        return cls(cloud_access.azure_folder(settings.home), settings.azure_emulator_port, settings.tools_dir)

    @property
    def endpoint(self) -> str:
        return cloud_access.azure_endpoint(self.port, self.host)

    def command(self) -> list[str]:
        launcher = azurite_install(npm_dir(self.tools_dir))
        flags = ["--blobHost", self.host, "--blobPort", str(self.port), "--location", str(self.data_dir)]
        flags += ["--skipApiVersionCheck", "--loose", "--disableTelemetry", "--silent"]
        return [str(launcher), *flags]

    def make_bucket(self, bucket: str) -> None:
        """Make container ``bucket`` with a request signed with the account's key (Shared Key)."""
        account = cloud_access.AZURITE_ACCOUNT
        headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        signed = "\n".join(
            ["PUT", *[""] * 11, *(f"{k}:{v}" for k, v in headers.items()), f"/{account}/{account}/{bucket}"]
        )
        signed += "\nrestype:container"
        key = base64.b64decode(cloud_access.AZURITE_KEY)
        signature = base64.b64encode(hmac.new(key, signed.encode(), hashlib.sha256).digest()).decode()
        headers |= {"Authorization": f"SharedKey {account}:{signature}", "Content-Length": "0"}
        request = urllib.request.Request(f"{self.endpoint}/{bucket}?restype=container", method="PUT", headers=headers)
        _send(request, already=409)


def _send(request: urllib.request.Request, already: int) -> None:
    """Send ``request``; an answer ``already`` (the thing exists) is as good as a success. A
    server error (it is starting) is raised as an ``OSError``, any other refusal as a ``SetupError``."""
    try:
        with urllib.request.urlopen(request, timeout=10):
            return
    except urllib.error.HTTPError as exc:
        if exc.code == already:
            return
        if exc.code >= 500:
            raise
        raise SetupError(f"{request.full_url} refused the request: {exc.code} {exc.read()[:300]!r}") from None


def emulators(settings) -> dict[str, Emulator]:
    """This home's emulators, by the store they emulate."""
    return {"gcs": GCSEmulator.from_settings(settings), "azure": AzureEmulator.from_settings(settings)}


def prepare(settings, *, say=_say) -> dict[str, Path]:
    """Build fake-gcs-server and install Azurite (each once): what ``wavepipe setup --emulators`` does."""
    return {
        "gcs": fake_gcs_binary(settings.tools_dir, say=say),
        "azure": azurite_install(npm_dir(settings.tools_dir), say=say),
    }
