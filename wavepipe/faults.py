"""Failpoints: named places in a run where a test, or an operator rehearsing an outage, makes a
step fail for real (SIGKILL, an exception, a pause) instead of mocking the failure.

``WAVEPIPE_FAILPOINTS`` lists them, comma-separated: ``<name>[@<hit>]=<action>``, where ``hit``
is the 1-based time the point is reached in that process (default 1) and ``action`` is one of
these, or several joined by ``+`` (``sleep:3+kill-app``):

* ``kill``: SIGKILL this process (a crash: no ``finally``, no cleanup);
* ``kill-app``: SIGKILL every process of the Spark app this code runs in (driver JVM, Python
  driver, Python workers); only inside an app started by ``wavepipe.spark.submit``;
* ``raise``: raise ``InjectedFault`` (a clean failure of the step);
* ``sleep:<seconds>``: pause, e.g. to restart the broker under a running reader.

Unset, a failpoint costs one dict lookup. The names are listed in ``POINTS``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ENV = "WAVEPIPE_FAILPOINTS"
POINTS = {
    "plan.after_claim": "the plan step, after it claimed the group, before it asked Kafka for offsets",
    "consume.record": "a reader, after staging a record",
    "reassemble.batch": "a Spark Python worker, after the writer took a batch of output rows",
    "reassemble.after_write": "the Spark app's driver, after the run's candidate waveforms are written, before "
                              "its candidate quarantine and dead letters are written and the result is saved",
    "publish.after_write": "the validate step, after the validated waveforms are published, before that is recorded",
    "commit.before_offsets": "the commit step, after the counts were checked, before offsets are committed",
    "commit.after_offsets": "the commit step, after offsets are committed, before the report and release",
}


class InjectedFault(RuntimeError):
    """Raised by a ``raise`` failpoint."""


def parse(spec: str) -> dict[str, tuple[int, str]]:
    """``"a@2=kill,b=sleep:3"`` -> ``{"a": (2, "kill"), "b": (1, "sleep:3")}``; unknown names or
    actions are errors, so a typo cannot make a fault test pass without its fault."""
    points: dict[str, tuple[int, str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        target, sep, action = item.partition("=")
        name, _, hit = target.partition("@")
        if not sep or name not in POINTS:
            raise ValueError(f"failpoint {item!r}: expected <name>[@<hit>]=<action> with name in {sorted(POINTS)}")
        for step in action.split("+"):
            if step not in ("kill", "kill-app", "raise") and not (step.startswith("sleep:") and _is_number(step[6:])):
                raise ValueError(f"failpoint {item!r}: action must be kill, kill-app, raise or sleep:<seconds>")
        points[name] = (int(hit) if hit else 1, action)
    return points


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


_hits: dict[str, int] = {}
_parsed: tuple[str, dict[str, tuple[int, str]]] | None = None


def failpoint(name: str) -> None:
    """Act if ``name`` is armed in ``WAVEPIPE_FAILPOINTS`` and this is its hit."""
    global _parsed
    spec = os.environ.get(ENV)
    if not spec:
        return
    if _parsed is None or _parsed[0] != spec:
        _parsed = (spec, parse(spec))
    armed = _parsed[1].get(name)
    if armed is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    hit, action = armed
    if _hits[name] != hit:
        return
    for step in action.split("+"):
        if step == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif step == "kill-app":
            kill_spark_app()
        elif step == "raise":
            raise InjectedFault(f"failpoint {name} (hit {hit})")
        else:
            time.sleep(float(step[6:]))


def kill_spark_app() -> None:
    """SIGKILL every process of the session this Spark app runs in. ``wavepipe.spark.submit``
    starts spark-submit as a session leader; refuse anywhere else (it would be a test runner)."""
    sid = os.getsid(0)
    leader = Path(f"/proc/{sid}/cmdline")
    if not leader.exists() or b"org.apache.spark.deploy.SparkSubmit" not in leader.read_bytes():
        raise InjectedFault("kill-app: this process is not inside an app started by wavepipe.spark.submit")
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            if os.getsid(int(proc.name)) == sid:
                os.kill(int(proc.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    os.kill(me, signal.SIGKILL)
