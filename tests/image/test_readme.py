"""The README's prerequisites are what a fresh Debian 12 needs for ``make demo``: on the Debian 12
base docker/build-local makes with debootstrap (minbase with python3, python3-venv,
ca-certificates and this machine's own CAs), the README's own ``apt-get`` line (the first bash block
of "Two commands", run as it is written: no terminal, nothing answered), the checkout's tracked
files (``git ls-files``) in /root/wavepipe, then ``make demo`` there, which must say that its checks
passed. A package missing from the README's list fails it.

The installs need the registries (Debian's mirror, PyPI, Maven Central), so they share this
machine's network: the README's apt-get line, and ``make setup``, the first half of ``make demo``
(the virtualenv from requirements.lock, the jars with Maven). ``make demo`` itself then runs in the
box's namespace with only a loopback (tests/image/boxes.py): its Kafka broker (9092) and Spark
engine (15002) keep their default ports there, out of the way of this machine's, and it shows that
once set up the demo needs no network. What it leaves running is stopped as the README says
(``make kafka-down``, then ``wavepipe spark down --force``) and must be all there was.

To keep it short, this machine's caches are lent to ``make setup`` when they exist, as overlays
(read, never written back): pip's (``~/.cache/pip``: pyspark is an sdist that pip otherwise builds
into a wheel, minutes) and Maven's (``~/.m2``). With another ``HOME`` everything comes from the
registries. Measured on 2 cores, another test run beside it: 3.6 minutes with the caches (apt-get
20 s, ``make setup`` 85 s, ``make demo`` 75-90 s, the rest the box's making and removal), 4.7
without them (``make setup`` 170 s).

Part of the image tier (``make test-image``, the last step of ``make test``); alone:
``WAVEPIPE_IMAGE_TEST=1 .venv/bin/python -m pytest tests/image/test_readme.py`` (root; the base is
made by docker/build-local when missing).
"""

from __future__ import annotations

import re
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tests.image.boxes import BASE_IMAGE, ROOT, Box, build_local, have_image, ok, say, why_not

REASON = why_not()
pytestmark = [pytest.mark.image, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

#: where the checkout goes in the box
SOURCE = "/root/wavepipe"
#: what ``make demo`` leaves running, stopped the README's way
STOP = f"cd {SOURCE} && make kafka-down; {SOURCE}/.venv/bin/wavepipe spark down --force"
#: this machine's caches lent to the setup (overlays: nothing is written back), when they exist
CACHES = {Path.home() / ".cache" / "pip": "/root/.cache/pip", Path.home() / ".m2": "/root/.m2"}


def readme_apt_line() -> str:
    """The ``apt-get ... install ...`` line of the first bash block under "## Two commands"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Two commands\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "no bash block under the README's 'Two commands'"
    lines = [line for line in block.group(1).splitlines() if re.search(r"\bapt-get\b.*\binstall\b", line)]
    assert len(lines) == 1, f"not one apt-get install line in the README's first bash block: {lines}"
    return lines[0].strip()


def _tracked_files(into: Path) -> Path:
    """The checkout's tracked files (as they are in the work tree) in a tar archive."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    archive = into / "source.tar"
    with tarfile.open(archive, "w") as tar:
        for name in filter(None, listed.split("\0")):
            path = ROOT / name
            if path.exists() or path.is_symlink():  # not one deleted in the work tree
                tar.add(path, arcname=name, recursive=False)
    return archive


@pytest.fixture(scope="module")
def base() -> str:
    if not have_image(BASE_IMAGE):
        build_local()  # makes the base, then the image (minutes)
    return BASE_IMAGE


@pytest.fixture
def fresh(base):
    b = Box(base, name="readme", hostname="wavepipe-readme", stop=STOP)
    try:
        yield b
    finally:
        b.close()


def test_the_readme_prerequisites_are_all_make_demo_needs_on_debian_12(fresh, tmp_path):
    times: dict[str, float] = {}

    def timed(phase: str, done: subprocess.CompletedProcess, began: float) -> str:
        times[phase] = time.monotonic() - began
        return ok(done)

    line = readme_apt_line()
    began = time.monotonic()
    timed("apt-get", fresh.run(line, online=True, timeout=900), began)

    began = time.monotonic()
    fresh.add(_tracked_files(tmp_path), SOURCE)
    times["copy"] = time.monotonic() - began

    lent = [f"{outside}:{inside}:O" for outside, inside in CACHES.items() if outside.is_dir()]
    say(f"lent to make setup: {', '.join(lent) or 'no caches'}")
    began = time.monotonic()
    timed("make setup", fresh.run("make setup", online=True, workdir=SOURCE, volumes=lent, timeout=2400), began)

    began = time.monotonic()
    demo = timed("make demo", fresh.run("make demo", workdir=SOURCE, timeout=1200), began)
    assert re.search(r"^OK: all \d+ produced waveforms are in the output once and bit-exact", demo, re.M), demo[-4000:]
    # set up by then: nothing installed or resolved again (there is no network to do it with)
    assert ".venv/bin/pip install" not in demo and "resolving jars" not in demo, demo[:4000]

    began = time.monotonic()
    stopped = timed("stop", fresh.run(STOP), began)
    assert re.search(r"^Kafka .* stopped", stopped, re.M), stopped  # the broker the demo left running
    deadline = time.monotonic() + 30
    while fresh.left_behind() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert fresh.left_behind() == [], "processes left running after make kafka-down and wavepipe spark down"
    say("times: " + ", ".join(f"{phase} {seconds:.0f}s" for phase, seconds in times.items()))
