"""What is on the dead-letter topic already: origin offsets as merged intervals, in the committed
offset's metadata (within Kafka's size limit) and in a ledger under home."""

import json

from wavepipe.consumers.committer import (
    METADATA_MAX_CHARS,
    commit_metadata,
    covers,
    ledger_published,
    merge_intervals,
    published_in_metadata,
    record_published,
    tables_committed_to,
)
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.plan import OffsetRange, RunPlan


def _plan(end: int = 10) -> RunPlan:
    return RunPlan(run_id="r1", topic="t", group="g", created_at="now", ranges=(OffsetRange("t", 0, 0, end),))


def test_intervals_merge_when_they_overlap_or_touch_and_empty_ones_vanish():
    assert merge_intervals([[5, 8], [0, 3], [3, 5], [10, 12], [12, 12], [11, 15]]) == [[0, 8], [10, 15]]
    assert merge_intervals([]) == []
    merged = [[0, 8], [10, 15]]
    assert [o for o in range(17) if covers(merged, o)] == [*range(8), *range(10, 15)]
    assert not covers([], 0)


def test_metadata_carries_the_published_offsets_of_its_dead_letter_topic_only():
    metadata = commit_metadata(_plan(), 0, "/t", [[0, 10]], "dlq")
    assert json.loads(metadata) == {
        "run_id": "r1",
        "planned_end": 10,
        "tables": "/t",
        "dlq_topic": "dlq",
        "dlq": [[0, 10]],
    }
    assert published_in_metadata(metadata, "dlq") == [[0, 10]]
    assert published_in_metadata(metadata, "other-dlq") == []  # another topic has none of them
    assert json.loads(commit_metadata(_plan(), 0, "s3://lake/t")) == {
        "run_id": "r1",
        "planned_end": 10,
        "tables": "s3://lake/t",
    }
    assert tables_committed_to(commit_metadata(_plan(), 0, "s3://lake/t")) == "s3://lake/t"
    assert tables_committed_to('{"rewind": "x"}') is None and tables_committed_to("not json") is None
    for foreign in (None, "", "not json", '{"rewind": "x"}', "[1, 2]", '{"dlq_topic": "dlq", "dlq": [["a"]]}'):
        assert published_in_metadata(foreign, "dlq") == []


def test_metadata_stays_within_kafkas_limit_keeping_the_newest_intervals():
    many = [[i * 10, i * 10 + 5] for i in range(1000)]
    metadata = commit_metadata(_plan(), 0, "/t", many, "dlq")
    assert len(metadata) <= METADATA_MAX_CHARS < 4096
    kept = published_in_metadata(metadata, "dlq")
    assert kept and kept[-1] == many[-1] and kept == many[-len(kept) :]


def test_the_ledger_adds_up_per_dead_letter_topic_and_partition(tmp_path):
    settings = load_settings(home=tmp_path, dead_letter_topic="dlq")
    assert ledger_published(settings, "t") == {}
    record_published(settings, "t", {0: [[0, 5]], 1: [[3, 4]]})
    record_published(settings, "t", {0: [[5, 9], [20, 30]]})
    assert ledger_published(settings, "t") == {0: [[0, 9], [20, 30]], 1: [[3, 4]]}
    assert ledger_published(settings.replace(dead_letter_topic="dlq2"), "t") == {}
    assert ledger_published(settings, "another-topic") == {}
