"""What the image tier's tests share: the gate, the build (docker/build-local), and working
containers (``buildah run``, chroot isolation) in a network namespace of their own that has only a
loopback, torn down with every process started in them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("WAVEPIPE_BUILDAH_CACHE") or ROOT / ".cache" / "buildah")
IMAGE = os.environ.get("IMAGE") or "localhost/wavepipe:latest"
#: the Debian 12 base docker/build-local makes with debootstrap (minbase + python3, python3-venv,
#: ca-certificates, this machine's own CAs)
BASE_IMAGE = "localhost/wavepipe-base:bookworm"
BUILDAH = ["buildah", "--storage-driver", "vfs", "--root", str(CACHE / "storage"), "--runroot", str(CACHE / "run")]


def why_not() -> str | None:
    """Why the image tier cannot run here (None: it can)."""
    if os.environ.get("WAVEPIPE_IMAGE_TEST") != "1":
        return "builds and runs the image (minutes): set WAVEPIPE_IMAGE_TEST=1 to run it"
    if os.geteuid() != 0:
        return "needs root (rootful buildah, debootstrap, network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip (network namespaces)"
    return None


def say(message: str) -> None:
    print(f"[image test] {message}", flush=True)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return done.stdout


@dataclass
class Built:
    image: str
    output: str
    seconds: float


def build_local() -> Built:
    """The image, built by docker/build-local (reused when it and its base are up to date; the
    base is made first when missing)."""
    began = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "docker" / "build-local")],
        env={**os.environ, "IMAGE": IMAGE, "WAVEPIPE_BUILDAH_CACHE": str(CACHE)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=3600,
        check=False,
    )
    seconds = time.monotonic() - began
    say(f"docker/build-local: exit {done.returncode} in {seconds:.0f}s\n{done.stdout[-4000:]}")
    assert done.returncode == 0, done.stdout[-6000:]
    return Built(IMAGE, done.stdout, seconds)


def have_image(image: str) -> bool:
    found = subprocess.run([*BUILDAH, "inspect", "--type", "image", image], capture_output=True, check=False)
    return found.returncode == 0


class Box:
    """A working container of ``image`` in a network namespace with only a loopback: its servers
    bind there, out of the way of anything on this machine. A command run ``online`` shares this
    machine's network instead (to reach the package registries); ``stop`` is what ``close`` runs
    first to stop the servers, before it kills whatever is left."""

    def __init__(self, image: str, *, name: str = "imgtest", hostname: str = "wavepipe-image", stop: str = ""):
        tag = uuid.uuid4().hex[:8]
        self.netns, self.name, self.mark = f"wp{name[:6]}{tag}", f"wavepipe-{name}-{tag}", f"wavepipe-{name}-{tag}"
        self.hostname, self.stop = hostname, stop
        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        subprocess.run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"], check=True)
        made = subprocess.run(
            [*BUILDAH, "from", "--name", self.name, "--add-host", f"{hostname}:127.0.0.1", image],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode:
            subprocess.run(["ip", "netns", "del", self.netns], check=False)
            raise RuntimeError(f"buildah from {image} failed: {made.stderr}")

    def run(
        self,
        script: str,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        *,
        online: bool = False,
        workdir: str | None = None,
        volumes: Sequence[str] = (),
    ) -> subprocess.CompletedProcess:
        """``bash -c script`` in the container, output captured (stdout and stderr apart), no stdin;
        ``volumes`` as ``buildah run -v`` takes them."""
        variables = [f"-e={k}={v}" for k, v in {"IMAGE_TEST_MARK": self.mark, **(env or {})}.items()]
        argv = [
            *(() if online else ("ip", "netns", "exec", self.netns)),
            *BUILDAH,
            *("run", "--isolation", "chroot", "--network", "host", "--hostname", self.hostname, *variables),
            *(("--workingdir", workdir) if workdir else ()),
            *(f"--volume={v}" for v in volumes),
            *(self.name, "--", "bash", "-c", script),
        ]
        began = time.monotonic()
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
        )
        where = "host network" if online else "loopback only"
        first = script.strip().splitlines()[0][:120]
        say(f"$ {first}  ({where}) -> exit {done.returncode} in {time.monotonic() - began:.1f}s")
        return done

    def add(self, source: Path, destination: str) -> None:
        """A file into the container (a tar archive is unpacked there)."""
        subprocess.run([*BUILDAH, "add", self.name, str(source), destination], capture_output=True, check=True)

    def left_behind(self) -> list[int]:
        """Processes started in the container that are still running (found by the variable every
        command of this box gets)."""
        found = []
        needle = f"IMAGE_TEST_MARK={self.mark}".encode()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if needle in (proc / "environ").read_bytes().split(b"\0"):
                        found.append(int(proc.name))
                except OSError:
                    pass
        return found

    def close(self) -> None:
        if self.stop and self.left_behind():
            self.run(self.stop, timeout=120)
        for pid in self.left_behind():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run([*BUILDAH, "rm", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.netns], check=False)
