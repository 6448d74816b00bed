"""What a committed run tells OpenLineage and Airflow's metrics (pure: built from its report)."""

from __future__ import annotations

from openlineage.client.serde import Serde

from wavepipe.contracts.config import load_settings
from wavepipe.plugins.lineage import run_lineage, table_dataset_name
from wavepipe.plugins.metrics import run_metrics, stat_names


def _report(run_id: str, start: int, end: int, *, new: int, lag_after: int = 0, success: bool = True) -> dict:
    part = {"start": start, "end": end, "records_read": end - start, "lag_before": end - start, "lag_after": lag_after}
    checks = [
        {"expectation": "expect_column_values_to_not_be_null", "column": "payload", "success": True},
        {"expectation": "expect_column_values_to_be_between", "column": "sample_rate", "success": success},
    ]
    return {
        "run_id": run_id,
        "topic": "seismic",
        "group": "g",
        "planned_at": "2026-11-26T10:00:00+00:00",
        "reported_at": "2026-11-26T10:00:12.5+00:00",
        "partitions": {"0": part},
        "totals": {"records_read": end - start, "payload_bytes_read": 4096, "dead_letter": 1},
        "outcome": {"new": new, "rewritten": 0, "quarantined": 0, "dead_letter_records": 1},
        "table_versions": {"waveforms": 4, "quarantine": 0, "dead_letter": 2},
        "validation": {"success": success, "suites": [{"suite": "wavepipe_waveforms.v3", "checks": checks}]},
    }


def test_lineage_names_the_topic_with_its_ranges_and_the_tables_with_rows_and_assertions(tmp_path):
    settings = load_settings(home=tmp_path, bootstrap_servers="b1:9092,b2:9092")
    lineage = run_lineage(settings, [_report("r1", 10, 20, new=3), _report("r2", 20, 26, new=2, success=False)])
    (topic,) = [Serde.to_dict(d) for d in lineage.inputs]
    assert (topic["namespace"], topic["name"]) == ("kafka://b1:9092", "seismic")
    ranges = topic["inputFacets"]["wavepipe_offsetRanges"]
    assert ranges["group"] == "g" and ranges["partitions"] == {"0": {"start": 10, "end": 26, "records": 16}}
    outputs = {d["name"].rsplit("/", 1)[1]: d for d in (Serde.to_dict(o) for o in lineage.outputs)}
    assert set(outputs) == {"waveforms", "quarantine", "dead_letter", "qc"}
    assert outputs["waveforms"]["namespace"] == "file" and outputs["waveforms"]["name"] == settings.output_table
    assert outputs["waveforms"]["outputFacets"]["outputStatistics"]["rowCount"] == 5
    assert outputs["dead_letter"]["outputFacets"]["outputStatistics"]["rowCount"] == 2
    assert outputs["waveforms"]["facets"]["version"]["datasetVersion"] == "4"
    # the last run's validation, every expectation: a failed one is false
    assertions = outputs["waveforms"]["facets"]["dataQualityAssertions"]["assertions"]
    assert [(a["assertion"], a["column"], a["success"]) for a in assertions] == [
        ("expect_column_values_to_not_be_null", "payload", True),
        ("expect_column_values_to_be_between", "sample_rate", False),
    ]
    run = Serde.to_dict(lineage.run_facets["wavepipe_run"])
    assert run["run_ids"] == ["r1", "r2"] and run["outcome"]["new"] == 5 and run["validation_success"] is False
    assert run_lineage(settings, [{"run_id": "idle", "partitions": {}}]).outputs == []  # nothing read
    assert table_dataset_name("s3://lake/wave/tables/waveforms") == ("s3://lake", "wave/tables/waveforms")


def test_a_runs_metrics_and_their_names():
    report = _report("r1", 10, 20, new=3, lag_after=7) | {"quality": {"flagged": 2, "measured": 3}}
    metrics = run_metrics(report)
    assert metrics == {
        "runs": ("count", 1),
        "records_read": ("count", 10.0),
        "bytes_read": ("count", 4096.0),
        "waveforms_published": ("count", 3.0),
        "waveforms_quarantined": ("count", 0.0),
        "records_dead_lettered": ("count", 1.0),
        "waveforms_flagged": ("count", 2.0),
        "lag_before": ("gauge", 10.0),
        "lag_after": ("gauge", 7.0),
        "validation_passed": ("count", 1),
        "run_duration": ("timing", 12500.0),
    }
    idle = run_metrics({"run_id": "i", "partitions": {}, "totals": {}})
    assert idle == {"runs": ("count", 1)}
    assert stat_names("team.seismic", "lag_after") == ("wavepipe.lag_after", "wavepipe.team__seismic.lag_after")


def test_a_failed_validations_lineage_is_the_planned_ranges_and_the_assertions_and_no_output(tmp_path):
    from types import SimpleNamespace

    from wavepipe.plugins.lineage import failed_validation_lineage

    settings = load_settings(home=tmp_path, bootstrap_servers="b1:9092")
    plan = SimpleNamespace(topic="seismic", group="g", ranges=[SimpleNamespace(partition=0, start=5, end=9, size=4)])
    suites = _report("r1", 5, 9, new=0, success=False)["validation"]["suites"]
    lineage = failed_validation_lineage(settings, plan, suites)
    (topic,) = [Serde.to_dict(d) for d in lineage.inputs]
    assert topic["inputFacets"]["wavepipe_offsetRanges"]["partitions"] == {"0": {"start": 5, "end": 9, "records": 4}}
    checks = topic["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert [c["success"] for c in checks] == [True, False] and lineage.outputs == []
