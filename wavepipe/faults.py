"""Failpoints: named places in a run where a test, or an operator rehearsing an outage, makes a
step fail for real (SIGKILL, an exception, a pause) instead of mocking the failure.

``WAVEPIPE_FAILPOINTS`` lists them, comma-separated: ``<name>[@<hit>]=<action>``, where ``hit``
is the 1-based time the point is reached in that process (default 1) and ``action`` is one of
these, or several joined by ``+`` (``sleep:3+kill-app``):

* ``kill``: SIGKILL this process (a crash: no ``finally``, no cleanup);
* ``kill-app``: SIGKILL every process of the Spark app this code runs in: inside an app started
  by ``wavepipe.spark_launch.submit`` (driver JVM, Python driver, Python workers) or a Python worker of
  a local Spark engine, that app or engine; in a step attached to this home's local engine
  (``wavepipe.engine_client``), the engine (JVM and Python workers), after which the step fails as it
  does when its server dies (``InjectedFault``);
* ``raise``: raise ``InjectedFault`` (a clean failure of the step);
* ``sleep:<seconds>``: pause, e.g. to restart the broker under a running reader;
* ``stop``: SIGSTOP this process: it stays frozen where it is until a SIGCONT, so a test can
  change the world (kill a store, a broker) at exactly that point. A point reached by each reader
  (``consume.record``) counts its hits per reader process, so it stops the run once per reader.

Unset, a failpoint costs one dict lookup. The names are listed in ``POINTS``.
"""

from __future__ import annotations

import os
import signal
import time

from wavepipe.contracts.errors import StepFailedError

ENV = "WAVEPIPE_FAILPOINTS"
POINTS = {
    "plan.after_claim": "the plan step, after it claimed the group, before it asked Kafka for offsets",
    "consume.record": "a reader, after staging a record",
    "stage.upload": "a reader putting a staged file on an object store, after each part it handed to the upload",
    "assemble.batch": "a Spark Python worker, after the writer took a batch of assembled waveforms (publishing "
    "into the output table, or a reassembly verifying them)",
    "reassemble.after_write": "the reassemble step, after the run's manifest is written, "
    "before its candidate quarantine and dead letters are written and the result is saved",
    "publish.before_commit": "the validate step, after the engine wrote the waveforms' files into the output "
    "table's folder, before the run's process commits them",
    "publish.after_write": "the validate step, after the run's tables are published, before that is recorded",
    "commit.before_offsets": "the commit step, after the counts were checked, before offsets are committed",
    "commit.after_offsets": "the commit step, after offsets are committed, before the report and release",
}


class InjectedFault(StepFailedError):
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
            if step not in ("kill", "kill-app", "raise", "stop") and not (
                step.startswith("sleep:") and _is_number(step[6:])
            ):
                raise ValueError(f"failpoint {item!r}: action must be kill, kill-app, raise, stop or sleep:<seconds>")
        points[name] = (int(hit) if hit else 1, action)
    return points


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


_hits: dict[tuple[str, str], int] = {}
_parsed: tuple[str, dict[str, tuple[int, str]]] | None = None
_engine_pid: int | None = None


def armed() -> str:
    """The failpoints armed in this process (``WAVEPIPE_FAILPOINTS``), to hand to code that runs
    elsewhere: a Spark engine's Python workers do not have the run's environment."""
    return os.environ.get(ENV, "")


def attached_engine(pid: int | None) -> None:
    """The local Spark engine this process's step works on (``kill-app`` stops it), or None."""
    global _engine_pid
    _engine_pid = pid


def failpoint(name: str, spec: str | None = None, scope: str = "") -> None:
    """Act if ``name`` is armed in ``spec`` (default: ``WAVEPIPE_FAILPOINTS``) and this is its
    hit. Hits are counted per ``scope`` (e.g. a run id: a Python worker serves many runs)."""
    global _parsed
    spec = os.environ.get(ENV) if spec is None else spec
    if not spec:
        return
    if _parsed is None or _parsed[0] != spec:
        _parsed = (spec, parse(spec))
    armed_point = _parsed[1].get(name)
    if armed_point is None:
        return
    key = (scope, name)
    _hits[key] = _hits.get(key, 0) + 1
    hit, action = armed_point
    if _hits[key] != hit:
        return
    for step in action.split("+"):
        if step == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif step == "kill-app":
            kill_spark_app()
        elif step == "raise":
            raise InjectedFault(f"failpoint {name} (hit {hit})")
        elif step == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            time.sleep(float(step[6:]))


def kill_spark_app() -> None:
    """SIGKILL every process of the session this Spark app runs in (``wavepipe.spark_launch.submit`` and
    ``wavepipe.engine_client`` start spark-submit as a session leader); in a step attached to a local
    engine, that engine's. Refuse anywhere else (it would be a test runner)."""
    from wavepipe import processes

    sid = os.getsid(0)
    if not processes.alive(sid, "org.apache.spark.deploy.SparkSubmit"):
        if _engine_pid is None:
            raise InjectedFault(
                "kill-app: this process is not inside an app started by wavepipe.spark_launch.submit "
                "and works on no local Spark engine"
            )
        # the engine this step is attached to: JVM and Python workers
        processes.send(processes.in_session(_engine_pid), signal.SIGKILL)
        raise InjectedFault(f"kill-app: the Spark engine (pid {_engine_pid}) was killed under this step")
    processes.send(processes.in_session(sid), signal.SIGKILL)  # all but this process
    os.kill(os.getpid(), signal.SIGKILL)
