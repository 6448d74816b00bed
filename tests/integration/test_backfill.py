"""Time-window runs that cannot be planned are refused before anything is read or claimed. (The
backfill of two windows through Airflow, ``airflow backfill create``, is in test_airflow_ui.py,
where one Airflow serves the module.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import run_cli
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.planner import WindowError, backfill_lane
from wavepipe.contracts.runfiles import RunStore
from wavepipe.pipeline import run_once


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
