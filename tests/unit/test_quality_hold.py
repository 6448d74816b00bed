"""Quarantining quality rules: the setting, the detail a quarantine row gets, and the rows a
worker holds back from its batch (pure; the run is tested in tests/integration/test_recordings.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wavepipe.contracts.quality import parse_rules
from wavepipe.spark_apps.assembly import Holding, hold_apart


def test_a_rule_quarantines_when_its_action_says_so_and_a_wrong_action_is_refused():
    dead, clipped, late = parse_rules(
        [
            {"name": "dead", "metric": "qc_dead", "action": "quarantine"},
            {"name": "clipped", "metric": "qc_clipped_share", "above": 0.01, "action": "flag"},
            {"name": "late", "metric": "latency_s", "above": 60},
        ]
    )
    assert (dead.quarantine, clipped.quarantine, late.quarantine) == (True, False, False)
    assert dead.reason == "qc_dead"
    with pytest.raises(ValueError, match=r"rule 1 .*action must be flag or quarantine, not 'drop'"):
        parse_rules([{"name": "dead", "metric": "qc_dead", "action": "drop"}])


def test_the_detail_names_the_channels_breaking_the_rule_and_their_values():
    dead, clipped, late = parse_rules(
        [
            {"name": "dead", "metric": "qc_dead"},
            {"name": "clipped", "metric": "qc_clipped_share", "above": 0.01},
            {"name": "late", "metric": "latency_s", "above": 60},
        ]
    )
    row = {"qc_dead": [False, True, True], "qc_clipped_share": [0.5, 0.0, 0.02], "channel_names": ["I", "II", None]}
    assert dead.explain(row) == "breaks quality rule dead (qc_dead on any channel): II, ch 3"
    assert clipped.explain(row) == "breaks quality rule clipped (qc_clipped_share above 0.01): I 0.5, ch 3 0.02"
    assert late.explain({"latency_s": 7200.0}) == "breaks quality rule late (latency_s above 60): latency_s 7200"


def test_a_worker_holds_back_the_rows_a_quarantining_rule_names_and_writes_them_without_payload(tmp_path):
    batch = pa.RecordBatch.from_pydict(
        {
            "waveform_id": ["a", "b", "c", "d"],
            "payload": [b"1", b"2", b"3", None],
            "qc_flags": [["clipped"], ["clipped", "dead"], [], None],
        }
    )
    holding = Holding(frozenset({"dead"}), str(tmp_path / "held"))
    kept = hold_apart(batch, holding)
    assert kept.column(0).to_pylist() == ["a", "c", "d"]
    (written,) = (tmp_path / "held").iterdir()
    held = pq.read_table(written)
    assert held.column_names == ["waveform_id", "qc_flags"] and held["waveform_id"].to_pylist() == ["b"]
    assert hold_apart(kept, holding) is kept and hold_apart(batch, None) is batch, "nothing to hold: as it was"
    assert len(list((tmp_path / "held").iterdir())) == 1
