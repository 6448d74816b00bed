"""The follow loop's pure parts: its options, the pause after failures, a micro-batch's line."""

from __future__ import annotations

import pytest

from wavepipe.contracts.errors import UsageError
from wavepipe.follow import MAX_BACKOFF_S, FollowOptions, backoff_s, batch_line, batch_summary


@pytest.mark.parametrize(
    "bad", [{"poll_s": 0}, {"poll_s": -1}, {"max_batches": -1}, {"max_seconds": -5}, {"max_failures": 0}]
)
def test_options_a_loop_could_not_honour_are_refused(bad):
    with pytest.raises(UsageError, match="follow"):
        FollowOptions(**bad)


def test_the_pause_after_failures_doubles_up_to_its_cap():
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(30) == MAX_BACKOFF_S


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
