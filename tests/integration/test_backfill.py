"""Time-window runs that cannot be planned are refused before anything is read or claimed. (The
backfill of two windows through Airflow, ``airflow backfill create``, is in test_airflow_ui.py,
where one Airflow serves the module.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import run_cli
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.planner import WindowError, backfill_lane
from wavepipe.pipeline import run_once
from wavepipe.run_store import RunStore


def test_a_window_that_is_empty_or_has_not_closed_is_refused(settings):
    ensure_topic(settings, partitions=1)
    now = datetime.now(UTC)
    with pytest.raises(WindowError, match="has not closed yet"):
        run_once(settings, window=(now - timedelta(minutes=10), now + timedelta(minutes=5)))
    with pytest.raises(WindowError, match="is empty"):
        run_once(settings, window=(now - timedelta(hours=1), now - timedelta(hours=1)))
    # the CLI: naive instants are UTC; the refusal says why, and nothing was claimed
    code, out = run_cli(settings, "run", "--window", "2026-11-20T00:15", "2026-11-20T00:00")
    assert code == 2 and "window [2026-11-20T00:15:00+00:00, 2026-11-20T00:00:00+00:00) is empty" in out, out
    assert RunStore(settings).active_run(backfill_lane(settings.group)) is None
    assert RunStore(settings).active_run(settings.group) is None


def test_an_unfinished_incremental_run_run_again_for_a_window_is_abandoned_and_kept(settings):
    """Airflow may run an incremental DAG run again as a backfill of its logical date (a manual run
    given one): the incremental run's claim is released (its offsets were never committed), its
    plan is kept, and the window is planned under a run id of its own. A refused window plan is
    noted under that id, with its reason, in the backfill lane's history."""
    from wavepipe.consumers.kafka_admin import committed_offsets
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.contracts.errors import UsageError
    from wavepipe.pipeline import plan_step

    ensure_topic(settings, partitions=1)
    produce_demo(settings, count=2, target_bytes=16 * 1024)
    store = RunStore(settings)
    incremental = plan_step(settings, "manual__x")
    assert store.active_run(settings.group) == "manual__x" and incremental.total_offsets > 0
    now = datetime.now(UTC)
    window = (now - timedelta(hours=2), now - timedelta(hours=1))
    replanned = plan_step(settings, "manual__x", window=window)
    assert replanned.run_id == "manual__x.reprocess-1" and replanned.is_window
    assert store.active_run(settings.group) is None  # released: the next incremental run reads its offsets
    assert store.load_plan("manual__x") == incremental  # kept as it was
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: None}
    store.release_group(backfill_lane(settings.group), replanned.run_id)

    with pytest.raises(UsageError, match="topic 'no-such-topic' does not exist"):
        plan_step(settings, "manual__y", window=window, topic="no-such-topic")
    assert store.failures(backfill_lane(settings.group)) == []  # a refusal, not a failure:
    (refused,) = store.refusals()  # listed by `wavepipe status` whatever group it named
    assert (refused["run_id"], refused["topic"]) == ("manual__y", "no-such-topic")
    assert refused["reason"].startswith("topic 'no-such-topic' does not exist")
