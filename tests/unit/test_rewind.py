"""The pure parts of rewinds: targets, durations and instants, clamping, and the snap rule."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from wavepipe.consumers.boundaries import chunk_position, decide_boundaries
from wavepipe.consumers.rewind import (
    PartitionRewind,
    RewindPlan,
    RewindTarget,
    clamp,
    format_plan,
    parse_duration,
    parse_partitions,
)
from wavepipe.contracts.plan import parse_datetime


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("2h", 7200),
        ("90m", 5400),
        ("30s", 30),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1w", 604800),
        ("500ms", 0.5),
        ("PT1H30M", 5400),
        ("P1D", 86400),
        ("pt45s", 45),
        ("P1DT2H", 93600),
        (" 2H ", 7200),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "2", "h", "2 hours", "1x", "P", "PT", "P1H", "-2h", "0s", "PT0S", "2h foo"])
def test_bad_durations_say_what_is_expected(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_datetimes_naive_is_utc_and_zones_convert():
    assert parse_datetime("2026-11-02T08:30:00") == datetime(2026, 11, 2, 8, 30, tzinfo=UTC)
    assert parse_datetime("2026-11-02T08:30:00Z") == datetime(2026, 11, 2, 8, 30, tzinfo=UTC)
    assert parse_datetime("2026-11-02T09:30:00+01:00") == datetime(2026, 11, 2, 8, 30, tzinfo=UTC)
    assert parse_datetime("2026-11-02") == datetime(2026, 11, 2, tzinfo=UTC)
    with pytest.raises(ValueError, match="not ISO-8601"):
        parse_datetime("yesterday")


def test_targets_from_text_and_from_cli_args():
    assert RewindTarget.parse("earliest", "ignored") == RewindTarget("earliest")
    assert RewindTarget.parse("OFFSET", " 12 ") == RewindTarget("offset", 12)
    assert RewindTarget.parse("shift", "-5") == RewindTarget("shift", -5)
    assert RewindTarget.parse("duration", "2h").value == timedelta(hours=2)
    assert RewindTarget.parse("datetime", "2026-11-02T08:30").describe() == "datetime 2026-11-02T08:30:00+00:00"
    for mode, value, match in [
        ("sideways", "1", "not one of"),
        ("offset", "", "needs a value"),
        ("offset", "-1", "negative"),
        ("shift", "x", "not an integer"),
    ]:
        with pytest.raises(ValueError, match=match):
            RewindTarget.parse(mode, value)
    args = argparse.Namespace(
        to_earliest=False, to_latest=False, to_offset=None, to_datetime=None, shift_by=-3, by_duration=None
    )
    assert RewindTarget.from_args(args) == RewindTarget("shift", -3)


def test_partitions_selection():
    assert parse_partitions(None) is None and parse_partitions("") is None and parse_partitions(" ") is None
    assert parse_partitions("2, 0,2") == [0, 2]
    with pytest.raises(ValueError, match="comma-separated"):
        parse_partitions("0;1")


def test_clamping_only_with_force():
    assert clamp(5, 3, 10, force=False) == (5, False)
    assert clamp(10, 3, 10, force=False) == (10, False)  # the end itself is fine
    assert clamp(1, 3, 10, force=False) == (1, True)
    assert clamp(1, 3, 10, force=True) == (3, True)
    assert clamp(12, 3, 10, force=True) == (10, True)


def _chunks(*layout: str):
    """Positions from "id:seq/count" strings, at offsets 0, 1, 2, ... (None: a non-chunk record)."""
    out = []
    for offset, item in enumerate(layout):
        if item is None:
            continue
        wid, rest = item.split(":")
        seq, count = rest.split("/")
        out.append((offset, wid, int(seq), int(count)))
    return out


def test_snap_moves_inside_a_waveform_to_its_first_chunk():
    chunks = _chunks("a:0/1", "b:0/4", "b:1/4", "b:2/4", "b:3/4", "c:0/1")
    for offset in (2, 3, 4):
        b = decide_boundaries(chunks, offset)
        assert (b.first_offset, b.close_offset, b.snapped_for) == (1, 5, ("b",))
    for offset in (0, 1, 5, 6):  # on a boundary: unchanged
        b = decide_boundaries(chunks, offset)
        assert (b.first_offset, b.close_offset, b.snapped_for) == (offset, offset, ())


def test_snap_with_interleaved_waveforms_follows_the_chain_back():
    # c starts at 0, a at 1 (inside c), b at 3 (inside a): a target inside b lands before all three
    chunks = _chunks("c:0/2", "a:0/3", "c:1/2", "b:0/2", "a:1/3", "a:2/3", "b:1/2", "d:0/1")
    b = decide_boundaries(chunks, 6)
    assert (b.first_offset, b.snapped_for) == (0, ("a", "b", "c"))
    assert b.close_offset == 7  # b began before 6 and ends at 6
    b = decide_boundaries(chunks, 4)
    assert (b.first_offset, b.close_offset) == (0, 7)  # a (ends at 5) and b (ends at 6) began before 4
    assert decide_boundaries(chunks, 7).first_offset == 7  # everything before 7 is complete
    assert decide_boundaries(chunks, 3).first_offset == 0  # a is open at 3, and c is open at 1


def test_non_chunks_are_ignored_and_a_headless_waveform_does_not_move_the_target():
    chunks = _chunks("x:1/3", "x:2/3", None, "y:0/2", None, "y:1/2")
    b = decide_boundaries(chunks, 1)
    assert (b.first_offset, b.unresolved) == (1, ("x",))  # x's seq 0 is not there: cannot complete
    b = decide_boundaries(chunks, 4)
    assert (b.first_offset, b.close_offset, b.snapped_for) == (3, 6, ("y",))
    assert decide_boundaries(_chunks(None, "z:2/3"), 1).headless == ("z",)


def test_duplicate_chunks_and_the_end_of_the_partition():
    chunks = _chunks("a:0/2", "a:0/2", "a:1/2", "b:0/3", "b:1/3")
    b = decide_boundaries(chunks, 2)
    assert b.first_offset == 0  # the earliest copy of a's first chunk
    # at the end, b is still missing a chunk: its rest is to come, so a reader must start at 3
    assert decide_boundaries(chunks, 5, end_reached=True).first_offset == 3
    assert decide_boundaries(chunks, 5, end_reached=False).first_offset == 5
    assert decide_boundaries(chunks, 5, end_reached=True).incomplete == ("b",)


def test_chunk_position_needs_valid_protocol_headers():
    ok = [("wp-id", b"w1"), ("wp-seq", b"2"), ("wp-count", b"3"), ("other", None)]
    assert chunk_position(7, ok) == (7, "w1", 2, 3)
    for bad in (
        [("wp-id", b"w1"), ("wp-seq", b"3"), ("wp-count", b"3")],
        [("wp-id", b"w1"), ("wp-seq", b"x"), ("wp-count", b"3")],
        [("wp-seq", b"0"), ("wp-count", b"1")],
        [("wp-id", b""), ("wp-seq", b"0"), ("wp-count", b"1")],
        [("wp-id", b"a"), ("wp-id", b"b"), ("wp-seq", b"0"), ("wp-count", b"1")],
        None,
    ):
        assert chunk_position(0, bad) is None


def test_table_shows_before_after_and_notes():
    plan = RewindPlan(
        topic="t",
        group="g",
        target=RewindTarget("offset", 2),
        force=True,
        planned_at="now",
        partitions=(
            PartitionRewind(
                0, 10, 0, 12, requested=2, final=1, snapped_from=2, note="snapped from 2 to the first chunk of b"
            ),
            PartitionRewind(
                1, None, 5, 9, requested=2, final=5, clamped_from=2, out_of_range=True, note="clamped from 2"
            ),
        ),
    )
    text = format_plan(plan)
    assert "offset 2" in text and "(force)" in text
    row0 = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert row0.split()[:6] == ["0", "10", "2", "1", "0", "12"] and "2 -> 11" in row0 and "snapped from 2" in row0
    row1 = next(line for line in text.splitlines() if line.strip().startswith("1 "))
    assert row1.split()[:2] == ["1", "-"] and "4 -> 4" in row1 and "clamped from 2" in row1
