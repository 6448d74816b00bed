"""Exactly once at the table: the transaction a run's publish carries, read back from a real Delta
log (written here by delta-rs), and the decision that a publish never reached Kafka."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from wavepipe import delta_txn
from wavepipe.contracts.errors import StepFailedError
from wavepipe.contracts.plan import OffsetRange, RunPlan

APP = delta_txn.app_id("g", "t")


def _plan(run_id="r7", version=7) -> RunPlan:
    return RunPlan.new(
        run_id,
        "t",
        "g",
        (OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 0, 5)),
        committed={0: 10, 1: None},
        committed_by={0: "r6", 1: None},
        txn_version=version,
    )


def _publish(path, plan: RunPlan, safe: dict[int, int]) -> None:
    """A commit as a run's publish makes it: its transaction and metadata (delta-rs, not Spark)."""
    props = CommitProperties(
        custom_metadata={"userMetadata": delta_txn.commit_metadata(plan, safe)},
        app_transactions=[Transaction(APP, plan.txn_version)],
    )
    write_deltalake(str(path), pa.table({"waveform_id": [plan.run_id]}), mode="append", commit_properties=props)


def test_the_metadata_reads_back_and_a_group_keeps_one_transaction_entry_however_many_runs(tmp_path):
    for version in (1, 2, 3):
        _publish(tmp_path / "t", _plan(f"r{version}", version), {0: 15, 1: 5})
    assert delta_txn.txn_version(tmp_path / "t", APP) == 3
    assert delta_txn.next_version([tmp_path / "t", tmp_path / "none"], APP) == 4
    assert delta_txn.txn_version(tmp_path / "t", delta_txn.app_id("other", "t")) == 0
    newest = delta_txn.published_runs(tmp_path / "t", APP)
    assert [p["run_id"] for p in newest] == ["r3", "r2", "r1"]
    assert newest[0]["ranges"] == {0: [10, 20], 1: [0, 5]} and newest[0]["safe_offsets"] == {0: 15, 1: 5}
    assert newest[0]["committed"] == {0: 10, 1: None} and newest[0]["committed_by"] == {0: "r6", 1: None}
    assert newest[0]["table_version"] == 2
    # the table's state, as its checkpoint holds it: one transaction entry for the group, not one per run
    DeltaTable(str(tmp_path / "t")).create_checkpoint()
    (checkpoint,) = (tmp_path / "t" / "_delta_log").glob("*.checkpoint.parquet")
    txns = [t for t in pq.read_table(checkpoint, columns=["txn"])["txn"].to_pylist() if t]
    assert [(t["appId"], t["version"]) for t in txns] == [(APP, 3)]


def test_a_table_that_cannot_be_read_is_named(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("not json\n")
    with pytest.raises(StepFailedError, match=r"reading the group's last transaction at .*/t failed .*table repair"):
        delta_txn.next_version([tmp_path / "t"], APP)


PUBLISHED = {
    "run_id": "r7",
    "table_version": 12,
    "ranges": {0: [10, 20], 1: [0, 5]},
    "committed": {0: 10, 1: None},
    "committed_by": {0: "r6", 1: None},
    "safe_offsets": {0: 15, 1: 5},
}


def test_a_publish_whose_kafka_commit_never_happened_is_found():
    where_it_found_the_group = {0: (10, "r6"), 1: (None, None)}
    lost = delta_txn.lost_commit(PUBLISHED, where_it_found_the_group)
    assert lost == {
        "run_id": "r7",
        "table_version": 12,
        "offsets": {0: [10, 15], 1: [None, 5]},
        "ranges": PUBLISHED["ranges"],
    }


@pytest.mark.parametrize(
    "positions",
    [
        {0: (15, "r7"), 1: (5, "r7")},  # its commit went through
        {0: (10, None), 1: (None, None)},  # rewound to where it started, by a tool: honoured
        {0: (3, "rewind"), 1: (None, None)},  # moved elsewhere
        {0: (10, "r6")},  # a partition it read is not the group's any more
    ],
)
def test_anything_but_a_lost_commit_leaves_kafka_the_visible_progress(positions):
    assert delta_txn.lost_commit(PUBLISHED, positions) is None


def test_a_run_whose_safe_offsets_are_where_it_started_has_nothing_to_recover():
    stayed = {**PUBLISHED, "safe_offsets": {0: 10}}
    assert delta_txn.lost_commit(stayed, {0: (10, "r6"), 1: (None, None)}) is None
    assert delta_txn.lost_commit(None, {0: (10, "r6")}) is None
