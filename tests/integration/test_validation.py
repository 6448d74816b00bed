"""The validation gate on the real broker, real Spark and Great Expectations: output that breaks an
expectation is not published, no offset moves and no dead letter goes out; after the fix (the data,
or a threshold in config) the retry passes, publishes and commits."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from pyspark.sql import functions as F

from tests.helpers import (
    assert_accounted,
    headless_chromium,
    open_offline,
    output_rows,
    produce_in_order,
    quarantine_reasons,
    read_topic,
    waveform_records,
)
from tests.integration.test_bad_input import assert_the_page_names_what_was_set_aside
from tests.unit.test_report_html import parse_numbers
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.producer import produce_demo
from wavepipe.contracts.errors import ValidationFailedError
from wavepipe.contracts.report import validation_trend
from wavepipe.contracts.runfiles import Step, html_path, json_path
from wavepipe.contracts.steps import Published, Reassembled
from wavepipe.engine_client import EngineLostError
from wavepipe.local.engine_server import LocalEngine
from wavepipe.offline_docs import remote_urls
from wavepipe.run_store import RunStore
from wavepipe.spark_apps.tables import delta_version

pytestmark = pytest.mark.integration


def _published_nothing(settings) -> None:
    for table in (settings.output_table, settings.quarantine_table, settings.dead_letter_table):
        assert delta_version(table) is None, f"{table.rsplit('/', 1)[-1]} was published"


def _hostile(waveform_id: str, rate: float) -> list:
    """The records of one small waveform at ``rate`` Hz (anything the protocol allows)."""
    import numpy as np

    from tests.helpers import START
    from wavepipe.contracts.protocol import split_waveform

    samples = np.arange(4.0)
    return split_waveform(
        samples, waveform_id=waveform_id, sample_rate=rate, start_time=START, source="hostile", chunk_size=16
    )


def test_a_waveform_failing_an_expectation_is_quarantined_by_name_and_the_run_commits(settings, spark):
    # audio is 16 kHz, seismic 100 Hz, ECG 500 Hz: a 1 kHz ceiling fails the audio waveforms. At
    # 5e-324 Hz the duration of 4 samples is infinite: caught as non-finite, never compared
    settings = settings.replace(validate_sample_rate_max=1000.0)
    ensure_topic(settings, partitions=1)
    sent = produce_demo(settings, count=6, target_bytes=16 * 1024)
    # below the default floor of 1e-3 Hz: before suite v2, one such waveform failed every run of the group
    produce_in_order(settings, _hostile("rate-1e-9", 1e-9) + _hostile("rate-5e-324", 5e-324), partition=0)

    report = pipeline.run_once(settings, run_id="screen")

    assert_accounted(spark, settings, report)
    audio = sorted(s.waveform_id for s in sent if "audio" in s.waveform_id)
    rate = "expect_column_values_to_be_between(sample_rate)"
    finite = "expect_column_values_to_be_in_set(numbers_finite)"
    assert quarantine_reasons(spark, settings) == {**dict.fromkeys([*audio, "rate-1e-9"], rate), "rate-5e-324": finite}
    assert sorted(r[0] for r in output_rows(spark, settings)) == sorted(
        s.waveform_id for s in sent if "audio" not in s.waveform_id
    )
    # the quarantine table as another Delta reader sees it: each row says what failed, with the value
    import deltalake

    rows = deltalake.DeltaTable(str(settings.quarantine_table)).to_pyarrow_table().to_pylist()
    details = {r["waveform_id"]: r["detail"] for r in rows}
    assert "sample_rate=16000" in details[audio[0]], details[audio[0]]
    assert "sample rate between 0.001 Hz and 1,000 Hz" in details[audio[0]], "the detail says the bounds used"
    assert "finite" in details["rate-5e-324"] and "sample_rate=4.94066e-324" in details["rate-5e-324"]
    end = report["partitions"]["0"]["end"]
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: end}, "the group went on"
    assert report["outcome"]["new"] == len(sent) - len(audio) and report["outcome"]["quarantined"] == len(audio) + 2
    assert report["waveforms"][f"quarantined:{rate}"] == len(audio) + 1
    assert report["partitions"]["0"]["quarantine_reasons"][rate] > 0
    suites = {s["suite"]: s for s in report["validation"]["suites"]}
    per_waveform, per_run = suites["wavepipe_waveforms.v3"], suites["wavepipe_run.v3"]
    assert report["validation"]["success"] and not per_waveform["success"] and not per_waveform["gates_run"]
    assert per_run["success"] and per_run["gates_run"]
    assert per_waveform["validated_in"] == "client"
    assert report["validation"]["quarantined"]["waveforms"] == {rate: len(audio) + 1, finite: 1}


def test_a_window_run_quarantines_a_failing_waveform_whose_row_lies_outside_the_window_once(settings, spark):
    """A waveform spread over partitions (seq 0 inside partition 1's window, seq 1 on partition 0
    after its window's end, read because another waveform there straddles the end) is the
    window's, and its row's first offset lies outside the window. When it fails an expectation,
    its quarantine row must be replaced by the next run of the window: not refused by
    ``replaceWhere``, not written twice."""
    from datetime import timedelta

    from tests.helpers import assert_delta_rs_reads_as_spark, quarter_hour_ago

    # the quarantine table exists already (another topic's run), so the window run replaces rows in it
    other = settings.replace(topic=f"{settings.topic}-other")
    ensure_topic(other, partitions=1)
    produce_in_order(other, _hostile("elsewhere", 1e-9))
    assert pipeline.run_once(other)["waveforms"] == {"quarantined:expect_column_values_to_be_between(sample_rate)": 1}
    ensure_topic(settings, partitions=2)
    t0 = quarter_hour_ago(2)
    inside, after = t0 + timedelta(minutes=1), t0 + timedelta(minutes=16)
    slow = _hostile("slow", 1e-9)  # two chunks, under the 1e-3 Hz floor
    good, _ = waveform_records("good", 2, seed=3)
    produce_in_order(settings, [good[0]], partition=0, when=inside)  # p0 offset 0: the window's
    produce_in_order(settings, [slow[1], good[1]], partition=0, when=after)  # p0 offsets 1, 2: after it
    produce_in_order(settings, [slow[0]], partition=1, when=inside)  # p1 offset 0: the window's
    window = (t0, t0 + timedelta(minutes=15))

    rate = "expect_column_values_to_be_between(sample_rate)"
    for attempt in range(2):  # the second run of the window replaces what the first wrote
        report = pipeline.run_once(settings, window=window)
        assert report["status"] == "window_replaced", report
        assert report["window"]["offsets"] == {"0": [0, 1], "1": [0, 1]}, report["window"]
        assert report["partitions"]["0"]["end"] == 3, "read on to complete the good waveform"
        assert report["waveforms"] == {"output_new": 1, f"quarantined:{rate}": 1}, (attempt, report["waveforms"])
        assert quarantine_reasons(spark, settings) == {"slow": rate, "elsewhere": rate}
        rows = spark.read.format("delta").load(str(settings.quarantine_table)).where("waveform_id = 'slow'").collect()
        assert [(r["waveform_id"], r["partition"], r["first_offset"]) for r in rows] == [("slow", 0, 1)], rows
        assert [r[0] for r in output_rows(spark, settings)] == ["good"]
        # its page names the quarantined waveform, and says one thing about what the window holds
        section = assert_the_page_names_what_was_set_aside(settings, report["run_id"])
        assert "<code>slow</code>" in section and rate in section
        page = html_path(settings, report["run_id"]).read_text()
        values, _ = parse_numbers(page)
        assert values["outcome.rewritten"] == values["waveforms.output_new"] == "1"
        assert values["outcome.replaced"] == str(report["outcome"]["replaced"]) == str(attempt), report["outcome"]
        assert "of them written before" not in page and "earlier rows of the window replaced" in page
    assert assert_delta_rs_reads_as_spark(spark, settings.quarantine_table) == 2


def test_a_waveform_another_group_published_since_the_reassembly_is_quarantined_not_published_twice(settings, spark):
    """Between a run's reassembly (its waveforms new) and its validation (an Airflow task later),
    another group on the same topic publishes the same waveforms: the validation looks the table
    up again (it moved) and quarantines them as ``published_by_other_run``; each id has one row."""
    ensure_topic(settings, partitions=1)
    sent = produce_demo(settings, count=3, target_bytes=16 * 1024)
    plan = pipeline.plan_step(settings, "slow-one")
    pipeline.consume_all(settings, plan.run_id, [0])
    assert pipeline.reassemble_step(settings, plan.run_id).waveforms == {"output_new": len(sent)}

    other = pipeline.run_once(settings.replace(group=f"{settings.group}-other"), run_id="quick-one")
    assert other["waveforms"] == {"output_new": len(sent)}

    validated = pipeline.validate_step(settings, plan.run_id)
    taken = "expect_column_values_to_be_in_set(published_by_other_run)"
    assert validated.success and validated.quarantined.waveforms == {taken: len(sent)}
    report = pipeline.commit_step(settings, plan.run_id)
    assert_accounted(spark, settings, report)
    assert sorted(r[0] for r in output_rows(spark, settings)) == sorted(s.waveform_id for s in sent)
    assert quarantine_reasons(spark, settings) == {s.waveform_id: taken for s in sent}


def test_a_run_that_quarantines_too_large_a_share_commits_nothing_until_the_limit_is_relaxed(settings, spark):
    # a run-level expectation still fails the run: more than a fifth of the waveforms quarantined
    settings = settings.replace(
        dead_letter_topic=f"{settings.topic}-dlq",
        validate_sample_rate_max=1000.0,
        validate_max_quarantined_share=0.2,
        validate_quarantine_judged_from=2,
    )
    ensure_topic(settings, partitions=1)
    ensure_topic(settings, settings.dead_letter_topic, partitions=1)
    sent = produce_demo(settings, count=6, target_bytes=16 * 1024)
    produce_in_order(settings, [(b"junk", [], b"no headers at all")], partition=0)

    with pytest.raises(ValidationFailedError) as failed:
        pipeline.run_once(settings, run_id="gate")
    message = str(failed.value)
    audio = sum(1 for s in sent if "audio" in s.waveform_id)
    assert "wavepipe_run.v3: expect_column_values_to_be_between on quarantined_share: 1 rows" in message, message
    assert "sample_rate" not in message, "a waveform's failure is not the run's"
    assert str(html_path(settings, "gate")) in message
    _published_nothing(settings)
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: None}
    assert read_topic(settings, settings.dead_letter_topic) == [], "no dead letter went out"
    report = json.loads(json_path(settings, "gate").read_text())
    assert report["status"] == "validation_failed" and report["validation"]["success"] is False
    assert report["outcome"]["quarantined"] == audio, "the page says what the run would have quarantined"
    assert "validation failed" in html_path(settings, "gate").read_text()
    # ... and names them, and the record it would have dead-lettered, though it published nothing
    failed_page = html_path(settings, "gate").read_text()
    audio_ids = sorted(s.waveform_id for s in sent if "audio" in s.waveform_id)
    assert sorted(e["waveform_id"] for e in report["named"]["quarantined"]) == audio_ids
    assert all(f"<code>{wid}</code>" in failed_page for wid in audio_ids)
    assert [(e["first_offset"], e["reason"]) for e in report["named"]["dead_letter"]] == [(6, "missing_header")]
    assert f"{audio} of 6 waveforms quarantined" in failed_page and "which failed the run" in failed_page
    with pytest.raises(RuntimeError, match="not validated"):
        pipeline.commit_step(settings, "gate")  # the commit refuses on its own, too
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: None}

    relaxed = settings.replace(validate_max_quarantined_share=0.5)
    report = pipeline.run_once(relaxed)  # resumes the failed run
    assert report["run_id"] == "gate" and report["validation"]["success"]
    assert_accounted(spark, relaxed, report)
    assert sorted(r[0] for r in output_rows(spark, relaxed)) == sorted(
        s.waveform_id for s in sent if "audio" not in s.waveform_id
    )
    assert len(quarantine_reasons(spark, relaxed)) == audio
    end = report["partitions"]["0"]["end"]
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: end}
    assert len(read_topic(settings, settings.dead_letter_topic)) == 1
    assert [(e["run_id"], e["success"]) for e in validation_trend(settings)] == [("gate", False), ("gate", True)]
    section = assert_the_page_names_what_was_set_aside(relaxed, "gate")
    assert f"{audio} of 6 waveforms quarantined" in section and "within the limit of 50%" in section

    # the page shows the JSON twin's numbers, and links the Data Docs that GX built
    values, _ = parse_numbers(html_path(settings, "gate").read_text())
    for key in (
        "outcome.new",
        "outcome.quarantined",
        "outcome.dead_letter_records",
        "totals.output",
        "totals.dead_letter",
        "partitions.0.end",
        "partitions.0.lag_before",
        "partitions.0.lag_after",
        "commit.0.after",
    ):
        node = report
        for part in key.split("."):
            node = node[part]
        assert values[key] == str(node), key
    assert report["partitions"]["0"]["lag_after"] == 0 and report["partitions"]["0"]["lag_before"] == end
    docs = report["validation"]["data_docs_index"]
    assert docs.startswith("file://") and (settings.gx_dir / "uncommitted" / "data_docs").is_dir()
    _assert_docs_render_offline(docs, [s["data_docs"] for s in report["validation"]["suites"]], run_id="gate")
    _assert_docs_say_what_was_checked(docs, {s["suite"]: s["data_docs"] for s in report["validation"]["suites"]})
    _assert_docs_show_what_was_observed({s["suite"]: s["data_docs"] for s in report["validation"]["suites"]}, audio)
    assert report["validation"]["plot"] and (settings.reports_dir / "gate" / "waveforms.png").stat().st_size > 1000


def _page_text(url: str) -> str:
    """A Data Docs page's visible words (scripts and styles left out), spaces collapsed."""
    import html
    import re

    page = Path(unquote(urlparse(url).path)).read_text()
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def _assert_docs_say_what_was_checked(index: str, pages: dict[str, str]) -> None:
    """The gate's Data Docs (``validate_sample_rate_max`` 1000, the share relaxed to 0.5) state the
    thresholds used and what each suite ran on, and no page of the site carries GX's newsletter
    footer, tutorials banner or walkthrough script."""
    waveforms, run = _page_text(pages["wavepipe_waveforms.v3"]), _page_text(pages["wavepipe_run.v3"])
    assert "sample rate between 0.001 Hz and 1,000 Hz" in waveforms, waveforms
    assert "validate_sample_rate_min..max" not in waveforms
    assert "Data asset: the run's new waveforms (one row each)" in waveforms
    assert "at most 50% (validate_max_quarantined_share), judged once the run has 2 waveforms" in run, run
    assert "Data asset: the run as a whole (one row)" in run
    site = Path(unquote(urlparse(index).path)).parent
    for page in site.rglob("*.html"):
        text = page.read_text()
        for gx_own in ("greatexpectations.io/newsletter", 'id="ge-cta-footer"', "ge-walkthrough-modal"):
            assert gx_own not in text, (gx_own, page)
        assert "Data asset: None" not in text, page


def _assert_docs_show_what_was_observed(pages: dict[str, str], audio: int) -> None:
    """Every expectation of the gate's Data Docs shows what it observed (no "--"): the sample rates
    seen (the demo's 100 Hz seismic to 16 kHz audio) with how many lie outside the bounds, and the
    run's quarantined share with every reason behind it."""
    waveforms, run = _page_text(pages["wavepipe_waveforms.v3"]), _page_text(pages["wavepipe_run.v3"])
    observed = [cell.split(" Observed Value ")[-1] for cell in waveforms.split(" Status Expectation")[1:]]
    assert observed and not any(" -- " in f" {cell} " for cell in observed), observed
    assert f"Hz to 16,000 Hz in 6 waveforms; {audio} outside" in waveforms, waveforms
    rate = "expect_column_values_to_be_between(sample_rate)"
    assert f"{audio} of 6 waveforms quarantined ({rate} {audio})" in run, run


def test_the_data_docs_list_a_quarantine_by_size_beside_the_expectations(settings, spark):
    settings = settings.replace(max_waveform_bytes=1000, validate_quarantine_judged_from=2)
    ensure_topic(settings, partitions=1)
    big, _ = waveform_records("big", 4, seed=1)  # 1024 bytes by its header
    small, _ = waveform_records("small", 3, seed=2)
    produce_in_order(settings, [*big, *small])

    report = pipeline.run_once(settings)
    assert report["waveforms"] == {"output_new": 1, "quarantined:too_large": 1}
    pages = {s["suite"]: s["data_docs"] for s in report["validation"]["suites"]}
    run = _page_text(pages["wavepipe_run.v3"])
    assert "50%: 1 of 2 waveforms quarantined (too_large 1)" in run, run
    assert " -- " not in _page_text(pages["wavepipe_waveforms.v3"]).split("Observed Value", 1)[1]


def _assert_docs_render_offline(index: str, pages: list[str], run_id: str) -> None:
    """The Data Docs load nothing from the network and render in Chromium with it cut off: the
    index's table filled by its scripts (this run listed), every stylesheet and script loaded,
    Font Awesome's icons in the results pages."""
    site = Path(unquote(urlparse(index).path)).parent
    for html in site.rglob("*.html"):
        assert remote_urls(html.read_text()) == [], html
    with headless_chromium() as browser:
        page, asked = open_offline(browser, index)
        page.wait_for_selector("table tbody tr td")  # bootstrap-table filled it from the page's data
        rows = page.locator("table tbody tr", has_text=run_id)
        assert rows.count() >= 2, page.inner_text("body")[:2000]  # a result per suite at least
        assert page.evaluate("typeof jQuery === 'function' && typeof jQuery.fn.bootstrapTable === 'function'")
        for url in pages:
            page, more = open_offline(browser, url)
            asked += more
            # Bootstrap's stylesheet applied (its reboot sets the body's margin to 0, a browser's is 8px)
            assert page.evaluate("getComputedStyle(document.body).margin") == "0px", url
            page.evaluate("document.fonts.ready")
            assert page.evaluate("document.fonts.check('900 16px \"Font Awesome 6 Free\"')"), url
        assert asked == [], f"the Data Docs could not load {asked}"


def test_a_staged_chunk_damaged_after_it_was_read_publishes_nothing_and_the_retry_reads_kafka_again(
    settings, own_engine, spark, monkeypatch
):
    """The DAG's separate steps: a staged chunk is damaged on disk after its reader hashed it (a bad
    disk, a bad writer). The reassembly trusts the reader's hash, validation passes on the
    metadata, and the one write at publish hashes the bytes again: the write fails, nothing is
    published, and the run's staged copies are dropped, so the retry reads the range from Kafka
    again. A reassembly is killed half way on the test's own Spark engine, which the next step
    starts again; the other steps run on the shared one (a run's state is in its home)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wavepipe.run_store import staged_paths
    from wavepipe.spark_apps.publish import StagedChunksChangedError

    ensure_topic(settings, partitions=1)
    records, digests = [], {}
    for i in range(4):
        recs, digest = waveform_records(f"w{i}", 3, seed=10 + i)
        records += recs
        digests[f"w{i}"] = digest
    produce_in_order(settings, records, partition=0)
    plan = pipeline.plan_step(settings, "damaged")
    for p in pipeline.partitions_to_read(plan):
        pipeline.consume_step(settings, "damaged", p)
    pipeline.reassemble_step(settings, "damaged")
    assert RunStore(settings).load_result("damaged", Step.REASSEMBLE, Reassembled).verified["while_read"] == 4

    staged = Path(staged_paths(RunStore(settings), "damaged", plan.range_for(0))[0])
    table = pq.read_table(staged).to_pylist()
    table[4]["payload"] = bytes(len(table[4]["payload"]))  # w1's second chunk, zeroed on disk
    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(staged)), staged)

    with pytest.raises(
        StagedChunksChangedError,
        match=r"staged chunks changed on disk: .* w1 no longer hash to "
        r".* reads its planned ranges again from Kafka",
    ):
        pipeline.validate_step(settings, "damaged")
    _published_nothing(settings)
    assert not staged.exists()
    with pytest.raises(RuntimeError, match="partition 0 was never consumed"):
        pipeline.commit_step(settings, "damaged")
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: None}
    for p in pipeline.partitions_to_read(plan):  # the retry: read again from Kafka
        pipeline.consume_step(settings, "damaged", p)

    # a reassembly that dies half way leaves no result, and validation refuses what it left behind
    monkeypatch.setenv("WAVEPIPE_FAILPOINTS", "reassemble.after_write=kill-app")
    with pytest.raises(
        EngineLostError, match=r"the Spark engine's JVM \(pid \d+\) exited during Spark step reassemble"
    ):
        pipeline.reassemble_step(own_engine, "damaged")
    monkeypatch.delenv("WAVEPIPE_FAILPOINTS")
    with pytest.raises(RuntimeError, match="no reassembly result"):
        pipeline.validate_step(settings, "damaged")
    _published_nothing(settings)

    # the fix: made again from the staged chunks, on the killed engine, started again by the step
    killed = LocalEngine(own_engine)
    assert killed.pid() is None
    pipeline.reassemble_step(own_engine, "damaged")
    assert killed.pid() is not None
    assert pipeline.validate_step(settings, "damaged").success
    assert RunStore(settings).load_result("damaged", Step.PUBLISH, Published).table_versions["waveforms"] is not None
    report = pipeline.commit_step(settings, "damaged")
    assert_accounted(spark, settings, report)
    out = spark.read.format("delta").load(str(settings.output_table))
    assert {
        r[0]: r[1] for r in out.select("waveform_id", F.concat(F.lit("sha256:"), F.sha2("payload", 256))).collect()
    } == digests
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 12}
