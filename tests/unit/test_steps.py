"""Step records are typed: saved as JSON, read back as the same type, and refused when they are not one."""

import json
from pathlib import Path

import pytest

from wavepipe.contracts.config import load_settings
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import PartitionAccount, ReadStats, Reassembled, WindowRows
from wavepipe.run_store import RunStore


def test_a_reassembly_comes_back_with_its_partition_numbers(tmp_path):
    store = RunStore(load_settings(home=tmp_path))
    result = Reassembled(
        run_id="r1",
        finished_at="2026-11-25T00:00:00Z",
        partitions={0: PartitionAccount(safe_offset=7, output=3), 12: PartitionAccount(safe_offset=40)},
        waveforms={"output_new": 1},
        timings={"classify_s": 0.5},
        candidates={"manifest": 1},
        window_rows=WindowRows(keep=["a"], extra={"waveforms": []}),
    )
    store.save_result("r1", Step.REASSEMBLE, result)
    on_disk = json.loads(Path(store.where("r1", Step.REASSEMBLE)).read_text())
    assert sorted(on_disk["partitions"]) == ["0", "12"], "JSON's keys are text"
    back = store.load_result("r1", Step.REASSEMBLE, Reassembled)
    assert back == result and sorted(back.partitions) == [0, 12]
    assert store.load_result("r2", Step.REASSEMBLE, Reassembled) is None, "no record before the step is done"


def test_a_consume_record_keeps_its_counts(tmp_path):
    store = RunStore(load_settings(home=tmp_path))
    stats = ReadStats("t", 3, 10, 20, records=9, chunks=8, dead_letters=1, max_timestamp_ms=5)
    store.save_result("r1", "consume-t-3", stats)
    back = store.load_result("r1", "consume-t-3", ReadStats)
    assert back == stats and back.gap_offsets == 1


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda r: r.pop("finished_at"), "finished_at"),
        (lambda r: r["partitions"].update({"zero": r["partitions"].pop("0")}), "partitions.zero"),
        (lambda r: r["partitions"]["0"].update(output="many"), "partitions.0.output"),
    ],
)
def test_a_record_that_is_not_one_is_refused_naming_the_step(tmp_path, change, where):
    store = RunStore(load_settings(home=tmp_path))
    store.save_result(
        "r1",
        Step.REASSEMBLE,
        Reassembled(
            run_id="r1", finished_at="t", partitions={0: PartitionAccount(safe_offset=1)}, waveforms={}, timings={}
        ),
    )
    path = Path(store.where("r1", Step.REASSEMBLE))
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))
    with pytest.raises(
        RuntimeError,
        match=rf"reassemble.json is not a reassemble record .*\({where}.*run the run's reassemble step again",
    ):
        store.load_result("r1", Step.REASSEMBLE, Reassembled)


def test_a_nan_example_stays_a_nan_and_a_record_cut_short_is_refused(tmp_path):
    import math

    from tests.unit.test_report import validated
    from wavepipe.contracts.steps import Validated

    store = RunStore(load_settings(home=tmp_path))
    failed = {"expectation": "expect_column_values_to_be_between", "column": "sample_rate"}
    result = validated(suites=[{"suite": "s", "failed": [failed | {"examples": [math.nan, math.inf]}]}])
    store.save_result("r1", Step.VALIDATE, result)
    [examples] = [f["examples"] for s in store.load_result("r1", Step.VALIDATE, Validated).suites for f in s["failed"]]
    assert math.isnan(examples[0]) and examples[1] == math.inf, "not None: the page shows what failed"
    path = Path(store.where("r1", Step.VALIDATE))
    path.write_text(path.read_text()[:40])
    with pytest.raises(
        RuntimeError, match=r"validate.json is not a validate record .*not JSON.*run the run's validate step"
    ):
        store.load_result("r1", Step.VALIDATE, Validated)
