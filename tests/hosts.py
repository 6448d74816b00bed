"""Hosts apart on one machine, for tests that must show wavepipe needs no shared disk.

Each host is a network namespace of its own, plugged into one LAN (a bridge in a namespace of
its own) by a veth pair, and every command on it runs in new mount and UTS namespaces where:
- the host name is ``wp-<host>``, resolved by its own ``/etc/hosts`` (a process of another host
  is not taken for one of its own);
- ``/srv`` is the host's own folder (its disk: kept from one command to the next);
- ``/tmp`` and ``/dev/shm`` are empty and private (so every other host's folder, all kept
  under one root folder, is out of sight as well);
- the code (the checkout with its ``.venv`` and ``.cache``) is read-only, the same for all, as an
  image is.
The test process is on the LAN too (``Lan.observer``): it produces, and reads the results back.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

#: What isolating hosts needs; a test without it is skipped, saying so.
NEEDS = (
    "root with CAP_NET_ADMIN and CAP_SYS_ADMIN (network, mount and UTS namespaces), iproute2's ip, util-linux's unshare"
)

#: Runs as ``sh -c PRIVATE sh <host name> <host folder> <hosts root> <code> <argv...>`` in new mount
#: and UTS namespaces: the host's own name, folder, /tmp and /dev/shm, the code read-only.
PRIVATE = r"""
set -e
name=$1 own=$2 hosts=$3 code=$4
shift 4
echo "$name" > /proc/sys/kernel/hostname
mount --bind "$own" /srv
mount --bind "$code" /mnt
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
printf '127.0.0.1 localhost %s\n' "$name" > /dev/shm/hosts
mount --bind /dev/shm/hosts /etc/hosts
rm /dev/shm/hosts
if [ -d "$hosts" ]; then mount -t tmpfs tmpfs "$hosts"; fi
mkdir -p "$code"
mount --bind /mnt "$code"
mount -o remount,bind,ro "$code"
umount /mnt
cd /srv
exec "$@"
"""


def why_not() -> str | None:
    """Why hosts cannot be isolated here (None: they can)."""
    if os.geteuid() != 0:
        return f"needs {NEEDS}; this test runs as uid {os.geteuid()}"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {NEEDS}; `{tool}` is not installed (apt-get install iproute2 util-linux)"
    probe = f"wpprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True)
    if made.returncode:
        return f"needs {NEEDS}; `ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    mounted = subprocess.run(
        ["unshare", "--mount", "--uts", "--propagation", "private", "true"], check=False, capture_output=True, text=True
    )
    if mounted.returncode:
        return f"needs {NEEDS}; `unshare --mount --uts` failed: {mounted.stderr.strip()}"
    return None


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 (kept for network tests, RFC 2544) that this machine does not route."""
    routes = _run("ip", "-4", "route", "show", "table", "all")
    for third in random.sample(range(256), 256):
        net = ipaddress.ip_network(f"198.18.{third}.0/24")
        if f"198.18.{third}." not in routes:
            return net
    raise RuntimeError("no free /24 in 198.18.0.0/16")


class Lan:
    """Hosts on one LAN; each host's folder is ``root/<name>``, its code ``code`` (read-only)."""

    def __init__(self, root: Path, code: Path):
        self.root, self.code = root, code
        self.tag = f"{random.getrandbits(16):04x}"
        self.net = _free_subnet()
        self.switch = f"wp{self.tag}lan"
        self.hosts: dict[str, str] = {}  # name -> address
        _run("ip", "netns", "add", self.switch)
        self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "ip", "link", "set", "br0", "up")
        self.observer = self._plug(None, 254)

    def _ns(self, name: str) -> str:
        return f"wp{self.tag}{name}"

    @staticmethod
    def _in(ns: str | None, *argv: str) -> str:
        return _run("ip", "netns", "exec", ns, *argv) if ns else _run(*argv)

    def _plug(self, ns: str | None, number: int) -> str:
        """A veth pair from namespace ``ns`` (None: the test's own) to the LAN's bridge, with
        address ``number`` of the subnet; returns the address."""
        address = str(self.net[number])
        inner, outer = f"wp{self.tag}h{number}", f"wp{self.tag}s{number}"
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", outer, "netns", self.switch)
        self._in(self.switch, "ip", "link", "set", outer, "master", "br0", "up")
        if ns:
            _run("ip", "link", "set", inner, "netns", ns)
        self._in(ns, "ip", "addr", "add", f"{address}/{self.net.prefixlen}", "dev", inner)
        self._in(ns, "ip", "link", "set", inner, "up")
        return address

    def add(self, name: str) -> str:
        """A new host ``name`` (its own network, its own folder); returns its address."""
        ns = self._ns(name)
        _run("ip", "netns", "add", ns)
        self._in(ns, "ip", "link", "set", "lo", "up")
        (self.root / name).mkdir(parents=True, exist_ok=True)
        self.hosts[name] = self._plug(ns, len(self.hosts) + 1)
        return self.hosts[name]

    def command(self, name: str, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` as host ``name`` runs it, with exactly ``env`` (and ``HOME=/srv``)."""
        own = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/srv", "LANG": "C.UTF-8"}
        if "JAVA_HOME" in os.environ:
            own["JAVA_HOME"] = os.environ["JAVA_HOME"]
        variables = [f"{k}={v}" for k, v in {**own, **env}.items()]
        wrapper = ["unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", PRIVATE, "sh"]
        folders = [f"wp-{name}", str(self.root / name), str(self.root), str(self.code)]
        return ["ip", "netns", "exec", self._ns(name), *wrapper, *folders, "env", "-i", *variables, *argv]

    def run(self, name: str, argv: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str]:
        """Run ``argv`` on host ``name`` to its end: (return code, output)."""
        done = subprocess.run(
            self.command(name, argv, env),
            check=False,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        return done.returncode, done.stdout

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """Start ``argv`` on host ``name`` in the background, its output in ``log``."""
        with log.open("ab") as out:
            return subprocess.Popen(
                self.command(name, argv, env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def close(self) -> None:
        """Stop every process of every host and remove the LAN."""
        for name in self.hosts:
            ns = self._ns(name)
            for _ in range(50):
                listed = subprocess.run(["ip", "netns", "pids", ns], check=False, capture_output=True, text=True)
                pids = [int(p) for p in listed.stdout.split()]
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.2)
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(
            ["ip", "netns", "del", self.switch], check=False, capture_output=True
        )  # takes the veth pairs along


def wait_for_port(address: str, port: int, timeout: float, alive=lambda: True) -> None:
    """Until ``address:port`` accepts a connection (``alive()`` false: what serves it died)."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"what serves {address}:{port} exited")
        with socket.socket() as sock:
            sock.settimeout(1.0)
            if sock.connect_ex((address, port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{address}:{port} did not answer in {timeout:.0f}s")
