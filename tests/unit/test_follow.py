"""The follow loop's pure parts: its options, the tries after failures, a micro-batch's line, the
thread that describes its micro-batches."""

from __future__ import annotations

import threading
import time

import pytest
import tenacity

from wavepipe.contracts.errors import UsageError
from wavepipe.follow import (
    MAX_BACKOFF_S,
    SAME_BACKLOG_S,
    Backlog,
    Describer,
    FollowOptions,
    GroupBusyError,
    batch_line,
    batch_retrying,
    batch_summary,
    worth_retrying,
)


@pytest.mark.parametrize(
    "bad",
    [
        {"poll_s": 0},
        {"poll_s": -1},
        {"max_batches": -1},
        {"max_seconds": -5},
        {"max_failures": 0},
        {"max_idle_s": -1},
        {"max_idle_s": float("nan")},
        {"describe_every_s": 0},
        {"describe_every_s": float("nan")},
    ],
)
def test_options_a_loop_could_not_honour_are_refused(bad):
    with pytest.raises(UsageError, match="follow"):
        FollowOptions(**bad)


def test_the_pause_after_failures_doubles_up_to_its_cap():
    retrying = batch_retrying(3, threading.Event())
    state = tenacity.RetryCallState(retrying, None, (), {})
    pauses = []
    for failures in (1, 2, 3, 4, 30):
        state.attempt_number = failures
        pauses.append(retrying.wait(state))
    assert pauses == [1.0, 2.0, 4.0, 8.0, MAX_BACKOFF_S]


def test_failed_micro_batches_are_tried_again_until_max_failures_in_a_row_then_the_last_error_is_raised():
    failures, paused = [], []

    def failing():
        failures.append(len(failures) + 1)
        raise RuntimeError(f"the engine died ({len(failures)})")

    retrying = batch_retrying(3, threading.Event()).copy(sleep=paused.append)
    with pytest.raises(RuntimeError, match=r"the engine died \(3\)"):
        retrying(failing)
    assert failures == [1, 2, 3] and paused == [1.0, 2.0]


def test_a_set_stop_cuts_the_pause_short():
    stop = threading.Event()
    stop.set()
    calls = []

    def fails_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a run-level expectation failed")
        return "ran"

    retrying = batch_retrying(3, stop)
    retrying.wait = tenacity.wait_fixed(3600)  # would hang the test if the pause were not cut short
    assert retrying(fails_once) == "ran"


@pytest.mark.parametrize(
    "error", [TypeError("a bug"), AttributeError("a bug"), UsageError("bad option"), GroupBusyError("another loop")]
)
def test_bugs_wrong_usage_and_another_loop_are_not_tried_again(error):
    assert not worth_retrying(error)
    assert not worth_retrying(KeyboardInterrupt())
    assert worth_retrying(RuntimeError("the engine died")) and worth_retrying(ConnectionError("no broker"))
    calls = []

    def fails():
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        batch_retrying(3, threading.Event()).copy(sleep=lambda s: None)(fails)
    assert calls == [1]


def test_a_micro_batch_line_says_what_it_published_how_fast_and_the_lag_it_left():
    report = {
        "run_id": "run_1",
        "outcome": {"new": 5, "quarantined": 1},
        "totals": {"records_read": 40},
        "partitions": {"0": {"lag_after": 3}, "1": {"lag_after": 0}},
    }
    batch = batch_summary(report, 2.0)
    assert batch == {"run_id": "run_1", "new": 5, "quarantined": 1, "records": 40, "seconds": 2.0, "lag_after": 3}
    line = batch_line(2, batch)
    assert line.startswith("micro-batch 2: run run_1: 5 new waveforms, 1 quarantined, 40 records in 2.0 s")
    assert "(20 records/s)" in line and line.endswith("lag after: 3 records")
    report["partitions"]["1"]["lag_after"] = None  # the end offsets could not be read
    assert batch_line(1, batch_summary(report, 0.0)).endswith("lag after: unknown")


def test_the_same_backlog_waits_for_new_records_unless_a_cap_left_some_or_it_waited_long_enough():
    backlog = Backlog()
    assert backlog.due({0: 10}, now=0.0), "a first backlog is run"
    backlog.ran({0: 10}, now=0.0, left_by_cap=0)
    assert not backlog.due({0: 10}, now=5.0), "a waveform still missing chunks: no run after run"
    assert backlog.due({0: 11}, now=5.0), "a new record"
    assert backlog.due({0: 10}, now=SAME_BACKLOG_S), "long enough (incomplete_after_s may end it)"
    backlog.ran({0: 10}, now=6.0, left_by_cap=40)
    assert backlog.due({0: 10}, now=6.5), "a cap left records the run saw: the next one at once"


def test_the_loop_ends_once_idle_for_max_idle_since_its_start_or_its_last_micro_batch():
    import time

    from wavepipe.follow import Followed, _limit_reached

    options, stop = FollowOptions(max_idle_s=5), threading.Event()
    now = time.monotonic()
    assert _limit_reached(options, Followed(busy_until=now - 1), now - 60, stop) == ""
    assert _limit_reached(options, Followed(busy_until=now - 6), now - 60, stop) == "idle for 5 s"
    assert _limit_reached(FollowOptions(), Followed(busy_until=now - 600), now - 600, stop) == ""


def _describer(monkeypatch, every_s: float, fail: BaseException | None = None) -> tuple[Describer, list]:
    """A ``Describer`` whose ``pipeline.describe_step`` records the batches it is given."""
    from wavepipe import pipeline

    batches: list[list[str]] = []

    def describe_step(settings, reports):
        batches.append([r["run_id"] for r in reports])
        if fail is not None:
            raise fail
        return reports

    monkeypatch.setattr(pipeline, "describe_step", describe_step)
    return Describer(None, every_s), batches


def _report(run_id: str, page: str | None = "page.html") -> dict:
    return {"run_id": run_id, "report_html": page}


def test_the_micro_batches_of_a_few_seconds_are_described_at_once_off_the_loop(monkeypatch):
    describer, batches = _describer(monkeypatch, every_s=0.3)
    for run_id in ("r1", "r2", "r3"):
        describer.add(_report(run_id))  # returns at once: the loop goes on to its next micro-batch
    describer.add(_report("idle", page=None))  # a run that read nothing: nothing to describe
    assert batches == []
    deadline = time.monotonic() + 5
    while not batches and time.monotonic() < deadline:
        time.sleep(0.05)
    assert batches == [["r1", "r2", "r3"]]
    describer.add(_report("r4"))
    describer.close()  # what still waits is made before the loop ends, without waiting out every_s
    assert batches == [["r1", "r2", "r3"], ["r4"]]


def test_a_defect_while_describing_ends_the_loop_and_other_failures_are_warnings(monkeypatch, caplog):
    describer, batches = _describer(monkeypatch, every_s=0.01, fail=OSError("disk full"))
    describer.add(_report("r1"))
    describer.close()
    assert batches == [["r1"]] and "were not made: disk full" in caplog.text

    describer, batches = _describer(monkeypatch, every_s=0.01, fail=TypeError("a defect"))
    describer.add(_report("r1"))
    deadline = time.monotonic() + 5
    while not batches and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    with pytest.raises(TypeError, match="a defect"):
        describer.add(_report("r2"))
    with pytest.raises(TypeError, match="a defect"):
        describer.close()
