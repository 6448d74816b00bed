"""A run's chunk metadata, classified in the client (``spark_apps/classify.py``): no Spark."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from tests.helpers import chunk_rows, waveform_records
from wavepipe.consumers.staging import CHUNK_SCHEMA
from wavepipe.spark_apps import classify


def _meta(rows) -> pd.DataFrame:
    return pa.Table.from_pylist(rows, schema=CHUNK_SCHEMA).select(classify.META_COLUMNS).to_pandas()


def _by_id(frame: pd.DataFrame, *columns) -> dict:
    return {r["waveform_id"]: tuple(r[c] for c in columns) for r in frame.to_dict("records")}


def test_classify_names_each_case():
    ok, _ = waveform_records("ok", 3, seed=1)
    dup, _ = waveform_records("dup", 2, seed=2)
    part, _ = waveform_records("partial", 3, seed=3)
    count, _ = waveform_records("count", 2, seed=4)
    meta, _ = waveform_records("meta", 2, seed=5)
    big, _ = waveform_records("big", 2, seed=6)
    ragged, _ = waveform_records("ragged", 2, seed=7)
    rows = (
        chunk_rows(ok)
        + chunk_rows(dup + [dup[0]], first_offset=10)
        + chunk_rows(part[:2], first_offset=20)
        + chunk_rows(count, first_offset=30, overrides={1: {"chunk_count": 3}})
        + chunk_rows(meta, first_offset=40, overrides={1: {"sample_rate": 99.0}})
        + chunk_rows(big, first_offset=50, overrides={0: {"total_size": 10**9}, 1: {"total_size": 10**9}})
        + chunk_rows(ragged, first_offset=60, overrides={0: {"total_size": 513}, 1: {"total_size": 513}})
    )
    got = classify.classify(_meta(rows), max_waveform_bytes=10**6)
    assert _by_id(got, "status", "reason", "records", "distinct_chunks") == {
        "ok": ("candidate", None, 3, 3),
        "dup": ("candidate", None, 3, 2),
        "partial": ("pending", None, 2, 2),
        "count": ("quarantined", "chunk_count_mismatch", 2, 2),
        "meta": ("quarantined", "metadata_mismatch", 2, 2),
        "big": ("quarantined", "too_large", 2, 2),
        "ragged": ("quarantined", "size_mismatch", 2, 2),
    }
    details = _by_id(got, "detail")
    assert details["big"] == ("1000000000 bytes by header, 512 in chunks; the maximum is 1000000",)
    assert details["ragged"] == ("chunks hold 512 bytes, wp-size says 513",)
    assert details["partial"] == ("2 of 3 chunks; none in the last null offsets (null s) of its partition",)
    assert details["ok"] == (None,)


def test_a_pending_waveform_expires_by_offsets_or_record_time():
    slow, _ = waveform_records("slow", 3, seed=1)
    fresh, _ = waveform_records("fresh", 3, seed=2)
    rows = chunk_rows(slow[:2], first_offset=0, timestamp_ms=1_000) + chunk_rows(
        fresh[:1], first_offset=90, timestamp_ms=60_000
    )
    by_offsets = classify.classify(_meta(rows), ends={0: 100}, incomplete_after_offsets=50)
    assert _by_id(by_offsets, "status", "expired") == {"slow": ("pending", True), "fresh": ("pending", False)}
    assert "none in the last 99 offsets (null s)" in _by_id(by_offsets, "detail")["slow"][0]
    by_time = classify.classify(_meta(rows), newest_ms={0: 61_000}, incomplete_after_ms=30_000)
    assert _by_id(by_time, "expired") == {"slow": (True,), "fresh": (False,)}
    assert "(60 s)" in _by_id(by_time, "detail")["slow"][0]


def test_classify_in_a_window_sets_aside_waveforms_whose_first_chunk_is_outside():
    """Window [10, 20) of partition 0: a waveform is the window's when its seq-0 chunk is inside,
    whatever its other chunks; the chunks of one begun before the window are another window's."""
    inside, _ = waveform_records("inside", 3, seed=1)
    tail, _ = waveform_records("tail", 3, seed=2)
    straddles, _ = waveform_records("straddles", 3, seed=3)
    late, _ = waveform_records("late", 2, seed=4)
    shuffled, _ = waveform_records("shuffled", 2, seed=5)
    rows = (
        chunk_rows(tail[1:], first_offset=10)
        + chunk_rows(inside, first_offset=12)
        + chunk_rows(straddles, first_offset=18)
        + chunk_rows(late, first_offset=21)
        # seq 1 at 15, inside; seq 0 at 25, outside: the later window's
        + chunk_rows([shuffled[1]], first_offset=15)
        + chunk_rows([shuffled[0]], first_offset=25)
    )
    got = classify.classify(_meta(rows), window={0: (10, 20)}, ends={0: 30}, incomplete_after_offsets=1)
    assert _by_id(got, "status", "expired") == {
        "inside": ("candidate", False),
        "straddles": ("candidate", False),
        "tail": ("other_window", False),
        "late": ("other_window", False),
        "shuffled": ("other_window", False),
    }
    # without a window the same chunks are an incremental run's: the tail is pending
    plain = _by_id(classify.classify(_meta(rows)), "status")
    assert plain["tail"] == ("pending",) and plain["late"] == plain["shuffled"] == ("candidate",)


def test_route_takes_the_readers_digest_only_when_it_matches_the_chunks():
    candidates = pd.DataFrame(
        {
            "waveform_id": ["in-order", "bad-digest", "no-digest", "spread", "twice"],
            "checksum": ["c1", "c2", "c3", "c4", "c5"],
            "chunk_count": [2, 2, 2, 2, 2],
            "records": [2, 2, 2, 2, 2],
            "distinct_chunks": [2, 2, 2, 2, 2],
            "partition": [0, 0, 0, 0, 0],
            "one_partition": [True, True, True, False, True],
        }
    )
    digests = pd.DataFrame(
        {
            "waveform_id": ["in-order", "bad-digest", "spread", "twice", "twice"],
            "checksum": ["c1", "c2", "c4", "c5", "c5"],
            "n_chunks": [2, 2, 2, 2, 2],
            "partition": [0, 0, 0, 0, 0],
            "digest": ["c1", "other", "c4", "c5", "c5"],
        }
    )
    got = _by_id(classify.route(candidates, digests), "route", "digest_ok")
    assert got == {
        "in-order": ("digest", True),
        "bad-digest": ("digest", False),  # hashed to another checksum: quarantined, not assembled
        "no-digest": ("local", None),
        "spread": ("shuffle", None),
        "twice": ("local", None),  # two digest rows for one id: not trusted
    }
    assert _by_id(classify.route(candidates, None), "route")["in-order"] == ("local",)


def test_final_status_quarantines_once_and_accounts_leftovers_with_their_waveform():
    classified = pd.DataFrame(
        {
            "waveform_id": ["new", "bad-sum", "again", "late-chunks", "leftover", "stale", "waiting"],
            "status": ["candidate", "candidate", "candidate", "pending", "pending", "pending", "pending"],
            "reason": [None] * 7,
            "detail": [None] * 7,
            "expired": [False, False, False, True, False, True, False],
        }
    )
    got = classify.final_status(
        classified,
        before={"again", "leftover"},
        after={"again", "leftover", "new"},
        quarantined={"late-chunks": "incomplete"},
    )
    assert _by_id(got, "status", "reason", "already_written") == {
        "new": ("output", None, False),
        "bad-sum": ("quarantined", "checksum_mismatch", False),
        "again": ("output", None, True),
        "late-chunks": ("quarantined", "incomplete", False),
        "leftover": ("output", None, True),
        "stale": ("quarantined", "incomplete", False),
        "waiting": ("pending", None, False),
    }
    assert _by_id(got, "detail")["late-chunks"] == ("chunks of a waveform quarantined earlier",)


def test_a_reused_id_is_a_conflict_with_both_checksums_and_its_records_are_accounted():
    mine, mine_sum = waveform_records("w", 2, seed=1)
    other, other_sum = waveform_records("w", 2, seed=2)
    rows = chunk_rows(mine) + chunk_rows(other, first_offset=2)
    meta = _meta(rows)
    kept, conflicts = classify.split_conflicts(meta, pd.DataFrame({"waveform_id": ["w"], "checksum": [mine_sum]}))
    assert list(kept["offset"]) == [0, 1] and list(conflicts["offset"]) == [2, 3]
    placed = classify.conflict_status(conflicts)
    assert _by_id(placed, "status", "reason", "output_checksum") == {"w": ("quarantined", "id_conflict", mine_sum)}
    rows = classify.quarantine_rows(conflicts, placed, "run-1").to_pylist()
    assert len(rows) == 1 and rows[0]["checksum"] == other_sum and rows[0]["output_checksum"] == mine_sum
    assert (rows[0]["first_offset"], rows[0]["last_offset"], rows[0]["records"]) == (2, 3, 2)
    counted = classify.accounting(conflicts, placed)
    assert counted == [
        {
            "partition": 0,
            "status": "quarantined",
            "reason": "id_conflict",
            "already_written": False,
            "records": 2,
            "bytes": int(conflicts["chunk_len"].sum()),
            "min_offset": 2,
        }
    ]
    assert classify.by_waveform(placed) == [
        {"status": "quarantined", "reason": "id_conflict", "already_written": False, "count": 1}
    ]


def test_a_waveform_whose_chunks_disagree_on_the_checksum_names_both_and_keeps_the_smallest():
    """``checksum`` is the smallest of a waveform's chunks' ``wp-checksum`` and the detail names
    the largest too, for every waveform of a run, whatever the order its chunks were read in."""
    late, late_sum = waveform_records("late", 2, seed=8)
    torn, _ = waveform_records("torn", 3, seed=9)
    low, high = "sha256:" + "0" * 64, "sha256:" + "f" * 64
    rows = chunk_rows([*late, *torn], overrides={3: {"checksum": low}, 4: {"checksum": high}})
    rows.reverse()
    placed = classify.classify(_meta(rows))
    found = _by_id(placed, "status", "reason", "checksum")
    assert found["late"] == ("candidate", None, late_sum)
    assert found["torn"] == ("quarantined", "metadata_mismatch", low)
    (detail,) = placed.loc[placed["waveform_id"] == "torn", "detail"]
    assert f"wp-checksum {low} and {high}" in detail
