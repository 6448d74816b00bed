import dataclasses

from wavepipe.consumers.planner import record_cap
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.plan import OffsetRange, RunPlan
from wavepipe.contracts.report import build_report
from wavepipe.contracts.steps import Published, ReadStats, Reassembled, Validated, from_record

PLAN = RunPlan("r1", "t", "g", "now", (OffsetRange("t", 0, 10, 20), OffsetRange("t", 1, 0, 5)))


def _reassembled(**p0):
    part0 = {
        "output": 6,
        "output_already_written": 0,
        "pending": 2,
        "quarantined": 1,
        "dead_letter": 0,
        "output_bytes": 60,
        "pending_bytes": 20,
        "quarantined_bytes": 10,
        "dead_letter_bytes": 0,
        "quarantine_reasons": {"size_mismatch": 1},
        "safe_offset": 14,
    }
    part0.update(p0)
    part1 = dict(part0, output=5, pending=0, quarantined=0, dead_letter=0, safe_offset=5, quarantine_reasons={})
    return reassembled({"0": part0, "1": part1})


def reassembled(partitions: dict) -> Reassembled:
    """A reassemble record as read back from its JSON (partitions keyed by their number as text)."""
    record = {"run_id": "r1", "finished_at": "now", "partitions": partitions, "waveforms": {}, "timings": {}}
    return from_record(Reassembled, record)


def validated(**fields) -> Validated:
    """A validate record of run r1 with ``fields`` (each a field of ``Validated``)."""
    assert set(fields) <= {f.name for f in dataclasses.fields(Validated)}, fields
    record = {
        "run_id": "r1",
        "group": "g",
        "topic": "t",
        "checked_at": "now",
        "suite_version": 1,
        "success": True,
        "suites": [],
        "data_docs_index": None,
        "rows": {"waveforms": 0, "waveform_bytes": 0, "staged_records": 0},
        "thresholds": {},
    }
    return from_record(Validated, record | fields)


def published(**fields) -> Published:
    """A publish record of run r1 with ``fields`` (each a field of ``Published``)."""
    assert set(fields) <= {f.name for f in dataclasses.fields(Published)}, fields
    return from_record(Published, {"run_id": "r1", "output_table_version": 4} | fields)


CONSUMED = {
    0: ReadStats("t", 0, 10, 20, records=10, chunks=9, dead_letters=1, payload_bytes=90, seconds=1.0),
    1: ReadStats("t", 1, 0, 5, records=5, chunks=5, dead_letters=0, payload_bytes=50, seconds=1.0),
}


def test_counts_that_add_up_balance():
    report = build_report(PLAN, CONSUMED, _reassembled(dead_letter=1), {"plan": 0.1})
    assert report["balance_errors"] == []
    assert report["totals"]["offsets"] == 15
    assert report["partitions"]["0"]["gap"] == 0


def test_waveforms_validation_quarantined_move_from_output_to_quarantine_and_still_balance():
    before = _reassembled(dead_letter=1)
    before.waveforms = {"output_new": 3, "quarantined:size_mismatch": 1, "pending": 1}
    moved = {"waveforms": {"expect_column_values_to_be_between(sample_rate)": 2}}
    moved["records"] = {"0": {"expect_column_values_to_be_between(sample_rate)": [4, 40]}}
    report = build_report(PLAN, CONSUMED, before, {}, validation=validated(quarantined=moved))
    assert report["balance_errors"] == []
    part = report["partitions"]["0"]
    assert (part["output"], part["output_bytes"], part["quarantined"], part["quarantined_bytes"]) == (2, 20, 5, 50)
    assert part["quarantine_reasons"] == {"size_mismatch": 1, "expect_column_values_to_be_between(sample_rate)": 4}
    assert part["safe_offset"] == 14, "a quarantined waveform holds no offset back"
    assert report["waveforms"]["output_new"] == 1
    assert report["outcome"]["new"] == 1 and report["outcome"]["quarantined"] == 3
    assert before.partitions[0].output == 6, "the reassembly's own record stays as it was"


def test_a_lost_record_is_reported():
    report = build_report(PLAN, CONSUMED, _reassembled(dead_letter=0), {})
    assert any("partition 0" in e for e in report["balance_errors"])


def test_gap_offsets_count_as_placed():
    consumed = {**CONSUMED, 0: dataclasses.replace(CONSUMED[0], records=9, chunks=9, dead_letters=0)}
    report = build_report(PLAN, consumed, _reassembled(), {})
    assert report["partitions"]["0"]["gap"] == 1
    assert report["balance_errors"] == []


def test_safe_offset_outside_range_is_an_error():
    report = build_report(PLAN, CONSUMED, _reassembled(dead_letter=1, safe_offset=25), {})
    assert any("safe offset" in e for e in report["balance_errors"])


def test_record_cap_combines_records_and_bytes():
    s = load_settings(chunk_size=1000)
    assert record_cap(s, None, None) == 0
    assert record_cap(s, 50, None) == 50
    assert record_cap(s, 50, 20_000) == 20
    assert record_cap(s, None, 500) == 1


def test_window_runs_account_for_other_windows_records():
    """A window run's records of other windows' waveforms (and dead letters past its end) are
    placed as ``other_window``; the balance holds with them and fails without them."""
    from wavepipe.contracts.plan import OffsetRange, RunPlan
    from wavepipe.contracts.report import build_report

    plan = RunPlan(
        run_id="w1",
        topic="t",
        group="g.backfill",
        created_at="2026-11-22T00:00:00Z",
        ranges=(OffsetRange("t", 0, 5, 15),),
        window={"start": "a", "end": "b", "offsets": {"0": [5, 12]}},
    )
    consumed = {0: ReadStats("t", 0, 5, 15, records=10, chunks=9, payload_bytes=900)}
    part = {
        "start": 5,
        "end": 15,
        "output": 6,
        "output_already_written": 0,
        "pending": 0,
        "quarantined": 0,
        "dead_letter": 0,
        "output_bytes": 600,
        "pending_bytes": 0,
        "quarantined_bytes": 0,
        "dead_letter_bytes": 0,
        "quarantine_reasons": {},
        "safe_offset": 15,
        "other_window": 4,
        "other_window_bytes": 300,
        "other_window_chunks": 3,
    }
    report = build_report(plan, consumed, reassembled({"0": part}), {})
    assert report["balance_errors"] == [] and report["totals"]["other_window"] == 4
    short = build_report(plan, consumed, reassembled({"0": {**part, "other_window": 3}}), {})
    assert any("other windows' 3" in e for e in short["balance_errors"]), short["balance_errors"]


def test_status_lists_each_run_by_its_latest_outcome_failed_ones_with_their_reason(tmp_path):
    from wavepipe.status import last_runs, run_line

    settings = load_settings(home=tmp_path)
    (settings.reports_dir).mkdir()
    (settings.reports_dir / "a.html").write_text("a's page, on this worker")

    def report(run_id, at, **extra):
        totals = {"output": 3, "pending": 0, "quarantined": 0, "dead_letter": 0}
        return {
            "run_id": run_id,
            "reported_at": at,
            "status": "committed",
            "totals": totals,
            **extra,
        }

    window = {"start": "2026-11-25T10:00:00+00:00", "end": "2026-11-25T10:15:00+00:00"}
    runs = last_runs(
        settings,
        [report("a", "2026-11-25T11:00"), report("w", "2026-11-25T11:20", status="window_replaced", window=window)],
        [
            {"run_id": "w", "step": "plan", "reason": "window ... has not closed yet", "at": "2026-11-25T11:10"},
            {"run_id": "b", "step": "validate", "reason": "2 expectations failed", "at": "2026-11-25T11:30"},
        ],
    )
    # --json gives the entries, the text their lines
    assert [(r["run_id"], r["outcome"], r.get("page")) for r in runs] == [
        ("a", "committed", str(settings.reports_dir / "a.html")),
        ("w", "window_replaced", None),
        ("b", "failed", None),
    ]
    assert [run_line(r) for r in runs] == [
        f"a: committed; 3 chunks out, 0 pending, 0 quarantined, 0 dead-lettered; file://{settings.reports_dir}/a.html",
        "w: window_replaced [2026-11-25T10:00:00+00:00, 2026-11-25T10:15:00+00:00); 3 chunks out, 0 pending, "
        "0 quarantined, 0 dead-lettered; its page is on the worker that ran it",  # its retry succeeded after the failure
        "b: FAILED at validate: 2 expectations failed",
    ]


def test_the_trend_of_a_group_holds_its_window_runs(tmp_path):
    import json

    from wavepipe.consumers.planner import lanes
    from wavepipe.contracts.config import load_settings
    from wavepipe.contracts.report import validation_trend
    from wavepipe.contracts.runfiles import history_path

    settings = load_settings(home=tmp_path)
    history_path(settings).parent.mkdir(parents=True)
    history_path(settings).write_text(
        "".join(
            json.dumps({"run_id": r, "group": g, "success": True}) + "\n"
            for r, g in [("a", "g"), ("w", "g.backfill"), ("o", "h")]
        )
    )
    assert lanes("g") == lanes("g.backfill") == ("g", "g.backfill")
    assert [e["run_id"] for e in validation_trend(settings, groups=lanes("g.backfill"))] == ["a", "w"]
    assert [e["run_id"] for e in validation_trend(settings)] == ["a", "w", "o"]


def test_the_spark_jobs_summary_counts_what_the_engine_listed_and_says_when_it_could_not():
    from wavepipe.contracts.report import spark_jobs_summary

    jobs = [{"id": 7, "kind": "aggregate", "s": 0.25}, {"id": 8, "kind": "write_operation", "s": 1.5}]
    summary = spark_jobs_summary({"reassemble": jobs})
    assert (summary["count"], summary["seconds"], summary["by_step"]) == (2, 1.75, {"reassemble": 2})
    assert [j["step"] for j in summary["jobs"]] == ["reassemble", "reassemble"]
    unknown = spark_jobs_summary({"reassemble": jobs, "validate": None})  # a remote engine's step
    assert unknown["count"] is None and unknown["by_step"]["validate"] is None
    assert spark_jobs_summary({})["count"] == 0, "a run that read nothing started no job"


def test_a_refused_run_is_noted_for_the_home_not_as_a_failure_and_status_lists_it(tmp_path):
    """A request that can never work (here caps on a window run) is refused before anything is
    read: noted once among the home's refusals, with the topic and group it asked for (which may
    not exist), and not among its group's failed runs."""
    from datetime import UTC, datetime

    import pytest

    from wavepipe.contracts.errors import UsageError
    from wavepipe.pipeline import plan_step
    from wavepipe.run_store import RunStore
    from wavepipe.status import status_lines

    settings = load_settings(home=tmp_path, topic="t", group="g")
    window = (datetime(2026, 11, 25, 10, tzinfo=UTC), datetime(2026, 11, 25, 10, 15, tzinfo=UTC))
    with pytest.raises(UsageError, match="a window run reads its whole window"):
        plan_step(settings, "manual__1", window=window, group="gorup", max_records=5)
    store = RunStore(settings)
    (refused,) = store.refusals()
    assert (refused["run_id"], refused["topic"], refused["group"]) == ("manual__1", "t", "gorup")
    assert refused["reason"].startswith("a window run reads its whole window")
    assert store.failures("g") == [] and store.failures("gorup") == []
    doc = {"group": "g", "topic": "t", "bootstrap_servers": "b", "partitions": {}, "pending_waveforms": 0}
    doc |= {"active_runs": {}, "runs": [], "spark": "Spark", "idle_runs": None, "validation_trend": []}
    lines = status_lines({**doc, "refused_runs": store.refusals()})
    assert lines[-1].endswith("manual__1: topic 't', group 'gorup': " + refused["reason"])
    assert "refused runs in this home" in lines[-2]
