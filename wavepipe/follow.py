"""``wavepipe follow``: bounded runs back to back while the group lags, a wait on lag between.

Each micro-batch is an ordinary run (``pipeline.run_once``): its own run id, frozen plan,
validation, report and commit. The loop adds nothing the guarantees depend on, so a kill
anywhere (SIGKILL, a task cleared) loses and doubles nothing: the next start resumes the group's
unfinished run first (``run_once`` does), then follows on. A second loop on the same group meets
the group's claim or the run's lock at its first micro-batch, says so and ends; it never runs a
batch beside the first.

Between micro-batches the loop asks Kafka for the group's lag (``consumers.lag.LagProbe``: two
small requests) and starts a run as soon as there is any new (``Backlog``: a lag that a waveform
still missing chunks holds back waits for new records). While idle it waits on a long poll for the
next record after the offsets it measured, so a micro-batch starts when a record becomes readable,
not at the next poll; the lag is measured again at least every ``poll_s``. A micro-batch that
fails (the engine died, a run-level expectation failed) is retried after a pause that doubles up
to ``MAX_BACKOFF_S``; after ``max_failures`` failures in a row the loop ends with the last error.
One that fails on an error of the code itself (``BUGS``: a ``TypeError``, ...) ends it at once,
its traceback logged.

What only describes a micro-batch (its plots, its Data Docs) is made after its commit by a thread
of the loop's own (``Describer``), for all the micro-batches of the last few seconds at once: the
next micro-batch does not wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import tenacity

from wavepipe import waiting
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import BUGS, ConflictError, UsageError
from wavepipe.contracts.plan import ActiveRunError
from wavepipe.run_store import RunStore
from wavepipe.state import StepBusyError

log = logging.getLogger("wavepipe.follow")

#: The longest pause before a failed micro-batch is tried again.
MAX_BACKOFF_S = 60.0
#: How long the same backlog waits before it is run again when no new record came (a waveform
#: still missing chunks holds the group's commit back; ``incomplete_after_s`` may end it by then).
SAME_BACKLOG_S = 60.0


BUG_HINT = "trying again fails the same way; the run resumes from where it stopped once the cause is fixed"


class GroupBusyError(ConflictError):
    """Another process runs this group's micro-batches (a second follow loop, a DAG run)."""


@dataclass(frozen=True)
class FollowOptions:
    """``poll_s``: seconds between lag polls while idle; ``max_batches`` / ``max_seconds``: end
    after that many micro-batches / start none after that long; ``max_idle_s``: end after this
    long with no micro-batch due (0: no limit, each); ``max_failures``: failed micro-batches in a
    row before the loop gives up; ``describe_every_s``: the least time between two makings of the
    micro-batches' descriptions (``Describer``)."""

    poll_s: float = 1.0
    max_batches: int = 0
    max_seconds: float = 0.0
    max_failures: int = 3
    max_idle_s: float = 0.0
    describe_every_s: float = 5.0

    def __post_init__(self):
        if not self.poll_s > 0 or not self.describe_every_s > 0:
            raise UsageError(
                f"follow: the lag poll interval and the description interval must be above 0 s, not {self.poll_s} "
                f"and {self.describe_every_s}"
            )
        if self.max_batches < 0 or not self.max_seconds >= 0 or not self.max_idle_s >= 0 or self.max_failures < 1:
            raise UsageError(
                "follow: max batches, seconds and idle seconds must be 0 (no limit) or more, max failures 1 or more"
            )


@dataclass
class Followed:
    """What a loop did: one line per micro-batch (``batch_line``) and why it ended."""

    batches: list[dict] = field(default_factory=list)
    ended: str = ""
    #: ``time.monotonic()`` when the loop began or its last micro-batch ended
    busy_until: float = field(default_factory=time.monotonic)


def batch_summary(report: dict, seconds: float) -> dict:
    """The few numbers of a micro-batch's report that its log line and the loop's summary show."""
    outcome, totals = report.get("outcome") or {}, report.get("totals") or {}
    lag = [part.get("lag_after") for part in report.get("partitions", {}).values()]
    return {
        "run_id": report["run_id"],
        "new": outcome.get("new", 0),
        "quarantined": outcome.get("quarantined", 0),
        "records": totals.get("records_read", 0),
        "seconds": round(seconds, 3),
        "lag_after": None if None in lag else sum(lag),
    }


def batch_line(number: int, batch: dict) -> str:
    lag = "unknown" if batch["lag_after"] is None else f"{batch['lag_after']} records"
    rate = batch["records"] / batch["seconds"] if batch["seconds"] else 0.0
    return (
        f"micro-batch {number}: run {batch['run_id']}: {batch['new']} new waveforms, {batch['quarantined']} "
        f"quarantined, {batch['records']} records in {batch['seconds']:.1f} s ({rate:.0f} records/s); "
        f"lag after: {lag}"
    )


@dataclass
class Backlog:
    """When the group's lag is worth a micro-batch: new records arrived since the last one (its
    end offsets moved), the last one's cap left records it saw, or ``SAME_BACKLOG_S`` passed. So
    a lag that only a waveform still missing chunks holds back (the run reads them, leaves them
    pending, commits before them) does not start run after run on the same records."""

    end: dict[int, int] | None = None
    at: float = float("-inf")

    def due(self, end: dict[int, int], now: float) -> bool:
        return end != self.end or now - self.at >= SAME_BACKLOG_S

    def ran(self, end: dict[int, int], now: float, left_by_cap: int) -> None:
        self.end, self.at = (None if left_by_cap else dict(end)), now


def worth_retrying(exc: BaseException) -> bool:
    """Whether a micro-batch that failed with ``exc`` is tried again: any error but wrong usage,
    another loop on the group and ``BUGS`` (never ``BaseException``: Ctrl-C ends the loop)."""
    return isinstance(exc, Exception) and not isinstance(exc, (UsageError, GroupBusyError, *BUGS))


def batch_retrying(max_failures: int, stop: threading.Event) -> tenacity.Retrying:
    """How failed micro-batches are tried again: after a pause of 1 s that doubles with each
    failure in a row up to ``MAX_BACKOFF_S`` (cut short when ``stop`` is set), while they fail
    with errors ``worth_retrying``; the ``max_failures``-th in a row is raised."""

    def say(state: tenacity.RetryCallState) -> None:
        log.warning(
            "micro-batch failed (%d in a row), trying again in %.0f s: %s",
            state.attempt_number,
            state.next_action.sleep,
            state.outcome.exception(),
        )

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(worth_retrying),
        stop=tenacity.stop_after_attempt(max_failures),
        wait=tenacity.wait_exponential(max=MAX_BACKOFF_S),
        sleep=stop.wait,
        before_sleep=say,
        reraise=True,
    )


def follow(
    settings: Settings,
    options: FollowOptions,
    stop: threading.Event,
    request: dict | None = None,
    on_batch: Callable[[dict], None] | None = None,
) -> Followed:
    """Run micro-batches of ``settings``' group while it lags, until ``stop`` is set (checked
    between micro-batches and while idle) or a limit of ``options`` is reached. ``request``:
    each run's ``RunRequest`` beside its topic and group (caps, a new group's start); ``on_batch``:
    called with each micro-batch's report."""
    from wavepipe.consumers.lag import LagProbe
    from wavepipe.pipeline import left_by_cap

    done, began, backlog = Followed(), time.monotonic(), Backlog()
    probe = LagProbe(settings, settings.topic, settings.group)
    describer = Describer(settings, options.describe_every_s)
    try:
        while True:
            batch = _next_batch(settings, options, stop, request or {}, probe, backlog, done, began)
            if isinstance(batch, str):
                done.ended = batch
                return done
            end, report, t = batch
            done.busy_until = time.monotonic()
            backlog.ran(end, done.busy_until, left_by_cap(report))
            done.batches.append(batch_summary(report, time.monotonic() - t))
            log.info("%s", batch_line(len(done.batches), done.batches[-1]))
            describer.add(report)
            if on_batch is not None:
                on_batch(report)
    finally:
        probe.close()
        describer.close()


class Describer:
    """Makes the descriptions of the micro-batches a loop committed (``pipeline.describe_step``:
    their plots and Data Docs) in a thread of its own, all those committed since the last time at
    once, at most once every ``every_s``: the next micro-batch never waits for them. ``close``
    makes what still waits; an error of wavepipe's own code there is raised by it, any other is a
    warning (a description never fails a run)."""

    def __init__(self, settings: Settings, every_s: float):
        self.settings, self.every_s = settings, every_s
        self._waiting: list[dict] = []
        self._lock = threading.Lock()
        self._due, self._closing = threading.Event(), threading.Event()
        self._bug: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="wavepipe-describe", daemon=True)
        self._thread.start()

    def add(self, report: dict) -> None:
        """Describe the committed run of ``report`` (a run that read nothing has nothing to describe);
        raises the defect an earlier description met, which ends the loop."""
        if self._bug is not None:
            raise self._bug
        if report.get("report_html"):
            with self._lock:
                self._waiting.append(report)
            self._due.set()

    def close(self) -> None:
        self._closing.set()
        self._due.set()
        self._thread.join()
        if self._bug is not None:
            raise self._bug

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._closing.wait(self.every_s)  # the micro-batches of the next few seconds join these
            with self._lock:
                waiting, self._waiting = self._waiting, []
                self._due.clear()
            self._describe(waiting)
            if self._closing.is_set() and not self._waiting:
                return

    def _describe(self, reports: list[dict]) -> None:
        from wavepipe.pipeline import describe_step

        try:
            describe_step(self.settings, reports)
        except BUGS as exc:
            self._bug = exc
            self._closing.set()
        except Exception as exc:  # the runs are committed; only their pages lack what failed here
            log.warning("the descriptions of runs %s were not made: %s", ", ".join(r["run_id"] for r in reports), exc)


def _next_batch(
    settings: Settings,
    options: FollowOptions,
    stop: threading.Event,
    request: dict,
    probe,
    backlog: Backlog,
    done: Followed,
    began: float,
) -> tuple[dict[int, int], dict, float] | str:
    """The next micro-batch that succeeded, as the end offsets it was started at, its report and
    when it started; or why the loop ends (a limit of ``options``, ``stop``). Waits on lag while
    there is no work; a failed micro-batch is tried again as ``batch_retrying`` says, the limits
    and the lag checked again first. Only a micro-batch's own failure is retried: one of the lag
    probe ends the loop."""
    for attempt in batch_retrying(options.max_failures, stop):
        ended = _limit_reached(options, done, began, stop)
        if ended:
            return ended
        lag = probe.measure(oldest=False)
        end = _work(settings, lag, backlog)
        if end is None:
            _idle(probe, lag, options.poll_s, stop)
            continue  # not an attempt: the failures in a row so far still count
        t = time.monotonic()
        with attempt:
            report = _one_batch(settings, request)
        outcome = attempt.retry_state.outcome
        if not outcome.failed:
            return end, report, t
        if isinstance(outcome.exception(), BUGS):  # another try fails the same way: no backoff, the traceback once
            exc = outcome.exception()
            raise waiting.stopped(exc, f"the next micro-batch of group {settings.group!r}", BUG_HINT) from exc
    raise AssertionError("batch_retrying ends in a success (returned above) or raises")


def _limit_reached(options: FollowOptions, done: Followed, began: float, stop: threading.Event) -> str:
    if stop.is_set():
        return "stopped"
    if options.max_batches and len(done.batches) >= options.max_batches:
        return f"{options.max_batches} micro-batches run"
    if options.max_seconds and time.monotonic() - began >= options.max_seconds:
        return f"{options.max_seconds:g} s elapsed"
    if options.max_idle_s and time.monotonic() - done.busy_until >= options.max_idle_s:
        return f"idle for {options.max_idle_s:g} s"
    return ""


def _work(settings: Settings, lag, backlog: Backlog) -> dict[int, int] | None:
    """The topic's end offsets when a micro-batch is due (None: wait): the group has an
    unfinished run to resume, is new (its first run starts it, or is refused with the reason), or
    lags with a backlog that is ``due``."""
    if RunStore(settings).active_run(settings.group) is not None or lag.new_group:
        return lag.end
    return lag.end if lag.records > 0 and backlog.due(lag.end, time.monotonic()) else None


def _idle(probe, lag, poll_s: float, stop: threading.Event) -> None:
    """Wait until a record arrives after what ``lag`` measured (a long poll: the loop wakes as the
    record becomes readable), at most ``poll_s``, then the lag is measured again (a backlog may be
    due again). A new group has no offsets to wait after: it waits ``poll_s``."""
    if lag.new_group:
        stop.wait(poll_s)
    else:
        probe.wait_for_records(lag.end, poll_s)


def _one_batch(settings: Settings, request: dict) -> dict:
    from wavepipe.pipeline import run_once

    try:
        return run_once(settings, describe=False, **request)
    except (ActiveRunError, StepBusyError) as exc:
        raise GroupBusyError(
            f"group {settings.group!r} is being run by another process ({exc}); one loop per group: "
            "stop the other one, or follow another group"
        ) from None
