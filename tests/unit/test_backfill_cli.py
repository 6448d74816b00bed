"""`wavepipe airflow backfill`'s pure parts: what a user typed is refused before Airflow is
asked, and the skipped windows are named with their runs (the backfill through the scheduler is
in tests/integration/test_airflow_ui.py)."""

from __future__ import annotations

import pytest

from wavepipe.cli import main
from wavepipe.contracts.errors import EXIT_USAGE
from wavepipe.local.airflow import runs_made_by, skipped_windows

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


def test_a_backfills_own_runs_are_those_queued_since_it_was_made():
    """Its new runs and those it cleared to run again; not an earlier backfill's, nor another
    kind of run (the REST API writes instants with ``Z`` or ``+00:00``)."""
    backfill = {"created_at": "2026-11-25T11:00:00.5Z"}
    runs = [
        {"logical_date": "2026-11-25T10:00:00Z", "run_type": "backfill", "queued_at": "2026-11-25T11:00:00.6Z"},
        {"logical_date": W2, "run_type": "backfill", "queued_at": "2026-11-25T10:59:00+00:00"},  # an earlier one's
        {"logical_date": W3, "run_type": "manual", "queued_at": "2026-11-25T11:00:01Z"},
        {"logical_date": W3, "run_type": "backfill", "queued_at": None},
    ]
    assert list(runs_made_by(backfill, runs)) == [W1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-date", "yesterday", "--to-date", W1], "datetime 'yesterday' is not ISO-8601"),
        (["--from-date", W1, "--to-date", W2, "--conf", "[1]"], "--conf must be a JSON object"),
        (["--from-date", W1, "--to-date", W2, "--conf", "{topic"], "--conf must be a JSON object"),
        (["--from-date", W1], "the following arguments are required: --to-date"),
        (["--from-date", W1, "--to-date", W2, "--force"], "--force: not an option of `airflow backfill`"),
    ],
)
def test_a_typo_is_refused_before_airflow_is_asked(tmp_path, capsys, args, message):
    code = _main(["--home", str(tmp_path), "airflow", "backfill", *args])
    out = capsys.readouterr()
    assert code == EXIT_USAGE and message in out.out + out.err, out
    assert not (tmp_path / "airflow").exists()  # no service was started or asked


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own refusals
        return exc.code


def test_a_flag_of_another_action_is_refused_naming_the_action(tmp_path, capsys):
    code = _main(["--home", str(tmp_path), "airflow", "status", "--from-date", W1])
    assert code == EXIT_USAGE
    assert "--from-date 2026-11-25T10:00:00+00:00: not an option of `airflow status`" in capsys.readouterr().err


def test_backfill_help_lists_the_options_of_a_backfill_only(capsys):
    assert _main(["airflow", "backfill", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--reprocess" in text and "--max-active-runs" in text
    assert "{up,down,status,backfill}" not in text and "usage: wavepipe airflow backfill" in text


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


BODY = {"dag_id": "wavepipe_ingest", "from_date": W1, "to_date": W2, "reprocess_behavior": "completed"}
LOCKED = {"detail": "Database is locked. Backfill creation is not supported on SQLite ..."}
BUSY = {"detail": "There is already a running backfill for dag wavepipe_ingest"}
MADE_AT = "2026-11-25T10:31:00Z"


def _backfill(completed_at: str | None, **changes) -> dict:
    """A backfill as the REST API lists it: of ``BODY``'s request, unless ``changes`` say otherwise."""
    return {
        "id": 7,
        "from_date": W1,
        "to_date": W2,
        "dag_run_conf": None,
        "reprocess_behavior": "completed",
        "created_at": MADE_AT,
        "completed_at": completed_at,
        **changes,
    }


def _listed(*backfills) -> tuple[str, int, dict]:
    return ("/backfills?dag_id=", 200, {"backfills": list(backfills)})


def _runs(*queued_at: str) -> tuple[str, int, dict]:
    return (
        "/dags/wavepipe_ingest/dagRuns?",
        200,
        {"dag_runs": [{"logical_date": W1, "run_type": "backfill", "queued_at": q} for q in queued_at]},
    )


def test_a_locked_try_that_made_the_backfill_is_taken_as_made_not_made_twice(monkeypatch):
    from wavepipe.local.airflow import create_backfill

    calls = _scripted_api(
        monkeypatch,
        [
            ("/backfills", 503, LOCKED),  # answered "locked", yet the backfill and its runs were committed
            ("/backfills", 409, BUSY),
            _listed(_backfill(None)),
            _runs("2026-11-25T10:31:01Z"),  # a run queued since it was made: it is ours
        ],
    )
    assert create_backfill(None, "token", BODY) == (200, _backfill(None))
    assert [c[0] for c in calls].count("POST") == 2  # never a third: no second backfill


def test_a_database_error_is_the_lock_too_and_is_tried_again(monkeypatch):
    """The API server answers SQLite's lock with 500 "Database error" when it surfaces in another
    statement of the request (seen creating a backfill beside a busy scheduler): tried again."""
    from wavepipe.local.airflow import create_backfill

    database_error = {"detail": {"reason": "Database error", "statement": "hidden", "orig_error": "hidden"}}
    calls = _scripted_api(monkeypatch, [("/backfills", 500, database_error), ("/backfills", 200, _backfill(None))])
    assert create_backfill(None, "token", BODY) == (200, _backfill(None))
    assert [c[0] for c in calls].count("POST") == 2
    other = {"detail": "a bug"}  # any other 500 is an answer, not tried again
    calls = _scripted_api(monkeypatch, [("/backfills", 500, other)])
    assert create_backfill(None, "token", BODY) == (500, other) and len(calls) == 1


def test_an_empty_backfill_our_locked_try_left_is_waited_for_then_the_backfill_is_made(monkeypatch):
    from wavepipe.local.airflow import create_backfill

    calls = _scripted_api(
        monkeypatch,
        [
            ("/backfills", 503, LOCKED),  # the row was committed, the runs were not
            ("/backfills", 409, BUSY),  # refused by what our own try left
            _listed(_backfill(None)),
            _runs("2026-11-25T09:00:00Z"),  # only the windows' earlier runs: it has none of its own
            _listed(_backfill(None)),
            _listed(_backfill(MADE_AT)),  # the scheduler closed it
            ("/backfills", 200, {"id": 8}),
        ],
    )
    assert create_backfill(None, "token", BODY) == (200, {"id": 8})
    assert [c[0] for c in calls] == ["POST", "POST", "GET", "GET", "GET", "GET", "POST"]


def test_a_backfill_someone_else_runs_is_refused_at_once(monkeypatch):
    from wavepipe.local.airflow import create_backfill

    calls = _scripted_api(monkeypatch, [("/backfills", 409, BUSY)])
    assert create_backfill(None, "token", BODY) == (409, BUSY)  # theirs: no waiting, the user is told
    assert len(calls) == 1


def test_an_empty_backfill_never_closed_gives_back_the_refusal(monkeypatch):
    from wavepipe.local import airflow

    empty = [_listed(_backfill(None)), _runs()]
    _scripted_api(
        monkeypatch, [("/backfills", 503, LOCKED), ("/backfills", 409, BUSY), *empty] + [_listed(_backfill(None))] * 5
    )
    clock = iter(range(0, 1000, 40))
    monkeypatch.setattr(airflow.time, "monotonic", lambda: next(clock))
    assert airflow.create_backfill(None, "token", BODY, wait_s=150) == (409, BUSY)


def test_a_refusal_by_a_failed_try_airflow_is_deleting_is_tried_again(monkeypatch):
    """Seen in a clean-clone run: the locked try's backfill was gone from the list (Airflow's own
    clean-up deleted it), yet the next try was refused while the deletion was not yet committed."""
    from wavepipe.local.airflow import create_backfill

    calls = _scripted_api(
        monkeypatch,
        [
            ("/backfills", 503, LOCKED),
            ("/backfills", 409, BUSY),
            _listed(),  # no backfill of the DAG is open: the refusal saw the one being deleted
            ("/backfills", 409, BUSY),
            _listed(),
            ("/backfills", 200, {"id": 8}),
        ],
    )
    assert create_backfill(None, "token", BODY) == (200, {"id": 8})
    assert [c[0] for c in calls].count("POST") == 4


def test_after_a_locked_try_a_refusal_by_another_open_backfill_is_given_back(monkeypatch):
    from wavepipe.local.airflow import create_backfill

    theirs = _backfill(None, id=9, from_date=W2)
    calls = _scripted_api(
        monkeypatch,
        [
            ("/backfills", 503, LOCKED),
            ("/backfills", 409, BUSY),
            _listed(theirs),
            ("/backfills", 409, BUSY),
            _listed(theirs),
        ],
    )
    assert create_backfill(None, "token", BODY) == (409, BUSY)
    assert [c[0] for c in calls].count("POST") == 3
