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


def _scripted_api(monkeypatch, answers: list[tuple[str, int, dict]]) -> list[tuple[str, str]]:
    """Airflow's REST answers, in order, to the calls ``create_backfill`` makes (each checked to
    be the call expected); the calls made are returned as they happen."""
    from wavepipe.local import airflow

    calls = []

    def answer(url, *, method, body, token):
        expected, status, reply = answers.pop(0)
        calls.append((method, url.split("/api/v2")[1]))
        assert calls[-1][1].startswith(expected), (calls[-1], expected)
        return status, reply

    monkeypatch.setattr(airflow, "_http_json", answer)
    monkeypatch.setattr(airflow.time, "sleep", lambda s: None)
    monkeypatch.setattr(airflow, "airflow_url", lambda settings: "http://airflow")
    return calls


BODY = {"dag_id": "wavepipe_ingest", "from_date": W1, "to_date": W2}
LOCKED = {"detail": "Database is locked. Backfill creation is not supported on SQLite ..."}
BUSY = {"detail": "There is already a running backfill for dag wavepipe_ingest"}


def test_an_empty_backfill_our_locked_try_left_is_waited_for_then_the_backfill_is_made(monkeypatch):
    from wavepipe.local.airflow import create_backfill

    calls = _scripted_api(
        monkeypatch,
        [
            ("/backfills", 503, LOCKED),  # the row was committed, the runs were not
            ("/backfills", 409, BUSY),  # refused by what our own try left
            ("/backfills?dag_id=", 200, {"backfills": [{"id": 7, "completed_at": None}]}),
            ("/backfills?dag_id=", 200, {"backfills": [{"id": 7, "completed_at": "2026-11-25T10:31:00Z"}]}),
            ("/backfills", 200, {"id": 8}),
        ],
    )
    assert create_backfill(None, "token", BODY) == (200, {"id": 8})
    assert [c[0] for c in calls] == ["POST", "POST", "GET", "GET", "POST"]


def test_a_backfill_someone_else_runs_is_refused_at_once(monkeypatch):
    from wavepipe.local.airflow import create_backfill

    calls = _scripted_api(monkeypatch, [("/backfills", 409, BUSY)])
    assert create_backfill(None, "token", BODY) == (409, BUSY)  # theirs: no waiting, the user is told
    assert len(calls) == 1


def test_an_empty_backfill_never_closed_gives_back_the_refusal(monkeypatch):
    from wavepipe.local import airflow

    open_one = ("/backfills?dag_id=", 200, {"backfills": [{"id": 7, "completed_at": None}]})
    _scripted_api(monkeypatch, [("/backfills", 503, LOCKED), ("/backfills", 409, BUSY)] + [open_one] * 5)
    clock = iter(range(0, 1000, 40))
    monkeypatch.setattr(airflow.time, "monotonic", lambda: next(clock))
    assert airflow.create_backfill(None, "token", BODY, wait_s=150) == (409, BUSY)
