"""The pipeline's assets and the events a committed run emits (pure logic: no Airflow service)."""

from __future__ import annotations

from types import SimpleNamespace

from wavepipe.plugins.assets import location_uri, published_extra, table_assets, table_rows, topic_asset
from wavepipe.plugins.downstream import published_runs


def _report(**outcome) -> dict:
    base = {"new": 0, "rewritten": 0, "quarantined": 0, "dead_letter_records": 0}
    return {
        "run_id": "r1",
        "topic": "seismic",
        "group": "g",
        "window": None,
        "outcome": {**base, **outcome},
        "table_versions": {"waveforms": 7, "quarantine": 3, "dead_letter": None},
    }


def test_a_run_announces_only_the_tables_it_put_rows_in():
    assert published_extra(_report()) == {}, "an idle run (or one that only left pending chunks) emits nothing"
    events = published_extra(_report(new=4, dead_letter_records=2))
    assert sorted(events) == ["dead_letter", "waveforms"]
    assert events["waveforms"] == {
        "run_id": "r1",
        "topic": "seismic",
        "group": "g",
        "rows": 4,
        "table_version": 7,
        "window": None,
    }
    assert events["dead_letter"]["rows"] == 2 and events["dead_letter"]["table_version"] is None
    # a window run rewrites its window's waveforms: those are its rows
    assert table_rows(_report(rewritten=3, quarantined=1)) == {
        "waveforms": 3,
        "quarantine": 1,
        "dead_letter": 0,
        "qc": 0,
    }
    # the qc table's rows: the hours its quality summary says it recomputed
    measured = {**_report(new=4), "quality": {"measured": 4, "qc_hours": 2}}
    assert published_extra(measured)["qc"]["rows"] == 2


def test_assets_are_named_by_location_and_the_topic_as_the_kafka_provider_names_it(tmp_path):
    assert location_uri("s3://lake/wavepipe/tables/waveforms") == "s3://lake/wavepipe/tables/waveforms"
    assert location_uri(str(tmp_path / "t")) == f"file://{tmp_path}/t"
    tables = table_assets({"home": str(tmp_path)})
    assert {n: a.uri for n, a in tables.items()} == {
        n: f"file://{tmp_path}/tables/{n}" for n in ("waveforms", "quarantine", "dead_letter", "qc")
    }
    assert (
        table_assets({"tables_uri": "s3://lake/t", "home": str(tmp_path)})["waveforms"].uri == "s3://lake/t/waveforms"
    )
    assert topic_asset("b1:9092, b2:9092", "seismic").uri == "kafka://b1:9092/seismic"
    assert topic_asset("b1:9092", "seismic", "g1").uri == "kafka://b1:9092/seismic?group=g1"


def test_a_downstream_run_finds_the_publishing_runs_among_its_events():
    from airflow.sdk import Asset, AssetAlias

    asset = Asset(uri="file:///h/tables/waveforms")
    events = {
        asset: [
            SimpleNamespace(
                asset=asset, extra={**published_extra(_report(new=2))["waveforms"], "run_id": "r2", "table_version": 9}
            ),
            SimpleNamespace(asset=asset, extra=published_extra(_report(new=4))["waveforms"]),
            SimpleNamespace(asset=asset, extra={"from_trigger": True}),  # not a publish
        ]
    }
    # Airflow lists an event that came through an alias under the alias as well
    events[AssetAlias("ingest__published")] = [events[asset][1]]
    runs = published_runs(events)
    assert [(r["table_version"], r["rows"], r["uri"]) for r in runs] == [(7, 4, asset.uri), (9, 2, asset.uri)]
    assert published_runs(None) == []


def test_quality_breaches_are_an_event_of_their_own_only_when_a_rule_was_broken(tmp_path):
    from wavepipe.plugins.assets import quality_asset, quality_extra

    assert quality_asset({"home": str(tmp_path)}).uri == f"file://{tmp_path}/tables/waveforms?wavepipe=quality"
    assert quality_extra(_report(new=4)) is None, "not measured"
    calm = _report(new=4) | {"quality": {"flagged": 0, "measured": 4, "by_rule": {}, "sources": []}}
    assert quality_extra(calm) is None, "measured, nothing broken: no event, so an alert DAG does not run"
    sources = [{"source": "ward-1", "flagged": 2}, {"source": "ward-2", "flagged": 0}]
    breached = _report(new=4) | {"quality": {"flagged": 2, "by_rule": {"dead_channel": 2}, "sources": sources}}
    assert quality_extra(breached) == {
        "run_id": "r1", "topic": "seismic", "group": "g", "flagged": 2, "by_rule": {"dead_channel": 2},
        "sources": ["ward-1"], "table_version": 7,
    }  # fmt: skip


def test_the_alert_dag_says_each_run_that_broke_quality_rules_once():
    from wavepipe.plugins import downstream

    breach = {"run_id": "r1", "topic": "t", "group": "g", "flagged": 2, "by_rule": {"dead_channel": 1, "clipped": 1},
              "sources": ["ecg-1", "mic-1"], "table_version": 3}  # fmt: skip
    # an event through the alias is listed under the alias and the asset: one line for it
    events = {
        "quality": [SimpleNamespace(extra=breach)],
        "alias": [SimpleNamespace(extra=breach), SimpleNamespace(extra={"run_id": "r0", "rows": 4})],
    }
    said = []
    lines = downstream.alert(events, say=lambda fmt, line: said.append(line))
    assert (
        lines
        == said
        == ["run r1 (t, group g): 2 waveforms flagged dead_channel 1, clipped 1; most flagged: ecg-1, mic-1"]
    )
    assert downstream.alert(None) == []
