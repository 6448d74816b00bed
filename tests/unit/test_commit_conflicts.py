"""A publish whose commit meets another writer's is decided again, a few times; other failures
are not retried (spark_apps/tables.py: ``decided_again_on_conflict``)."""

from __future__ import annotations

import pytest
from deltalake.exceptions import CommitFailedError, DeltaError

from wavepipe.spark_apps.tables import COMMIT_TRIES, decided_again_on_conflict, is_commit_conflict


def _publish(failures: list[BaseException]):
    calls = []

    @decided_again_on_conflict
    def publish(data, path, *, txn=None):
        calls.append((data, path, txn))
        if failures:
            raise failures.pop(0)

    return publish, calls


def test_a_commit_that_met_another_writers_is_decided_again_with_the_same_arguments():
    publish, calls = _publish([CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")])
    publish("rows", "s3://lake/t", txn="wavepipe:g:t@7")
    assert calls == [("rows", "s3://lake/t", "wavepipe:g:t@7")] * 2


def test_a_table_created_meanwhile_is_a_conflict_and_other_failures_are_not():
    assert is_commit_conflict(DeltaError("Generic error: A Delta Lake table already exists at that location."))
    assert not is_commit_conflict(DeltaError("Generic S3 error: 403 Forbidden"))
    publish, calls = _publish([DeltaError("Generic S3 error: 403 Forbidden")])
    with pytest.raises(DeltaError, match="403"):
        publish("rows", "s3://lake/t")
    assert len(calls) == 1


def test_it_gives_up_after_its_tries():
    publish, calls = _publish([CommitFailedError("conflict")] * (COMMIT_TRIES + 1))
    with pytest.raises(CommitFailedError):
        publish("rows", "/tmp/t")
    assert len(calls) == COMMIT_TRIES
