"""`wavepipe airflow backfill`'s pure parts: what a user typed is refused before Airflow is
asked, and the skipped windows are named with their runs (the backfill through the scheduler is
in tests/integration/test_airflow_ui.py)."""

from __future__ import annotations

import pytest

from wavepipe.cli import main
from wavepipe.contracts.errors import EXIT_USAGE
from wavepipe.local.airflow import skipped_windows

W1, W2, W3 = (f"2026-11-25T10:{m}:00+00:00" for m in ("00", "15", "30"))


def test_skipped_windows_name_their_run_and_why():
    runs = {
        W1: {"dag_run_id": "backfill__a", "state": "success"},
        W2: {"dag_run_id": "backfill__b", "state": "running"},  # in flight: no dry run lists it
        W3: {"dag_run_id": "backfill__c", "state": "failed"},
    }
    assert skipped_windows([W1, W3], [W3], runs, "failed") == [
        f"{W1}: backfill__a (success): --reprocess failed skips a success run",
        f"{W2}: backfill__b (running): it is running now",
    ]
    assert skipped_windows([W1, W3], [W1, W3], {}, "all") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-date", "yesterday", "--to-date", W1], "datetime 'yesterday' is not ISO-8601"),
        (["--from-date", W1, "--to-date", W2, "--conf", "[1]"], "--conf must be a JSON object"),
        (["--from-date", W1, "--to-date", W2, "--conf", "{topic"], "--conf must be a JSON object"),
        (["--from-date", W1], "needs --from-date and --to-date"),
    ],
)
def test_a_typo_is_refused_before_airflow_is_asked(tmp_path, capsys, args, message):
    code = main(["--home", str(tmp_path), "airflow", "backfill", *args])
    out = capsys.readouterr()
    assert code == EXIT_USAGE and message in out.out + out.err, out
    assert not (tmp_path / "airflow").exists()  # no service was started or asked
