"""The run page names what the run set aside: each quarantined waveform and dead-lettered record
(id, source, reason, detail, where), the first few of many; it says how the quarantined share was
judged, counts waveforms apart from chunks, and a window run's page uses one set of numbers."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pyarrow as pa

from tests.unit.test_report import CONSUMED, PLAN, _reassembled, published, validated
from tests.unit.test_report_html import _lookup, parse_numbers
from wavepipe import report_html
from wavepipe.consumers.staging import dead_letter_row
from wavepipe.contracts.report import build_report, named_record
from wavepipe.contracts.rows import DEAD_LETTER_SCHEMA
from wavepipe.spark_apps.classify import QUARANTINE_SCHEMA
from wavepipe.spark_apps.rejections import named

EVIL = '<script>alert("x")</script>'
THRESHOLDS = {"validate_max_quarantined_share": 0.1, "validate_quarantine_judged_from": 100}


def _quarantine(*rows: dict) -> pa.Table:
    now = datetime(2026, 11, 27, tzinfo=UTC)
    base = {
        "topic": "t",
        "checksum": "c",
        "output_checksum": None,
        "run_id": "r1",
        "quarantined_at": now,
        "chunk_count": 4,
        "detail": None,
    }
    return pa.Table.from_pylist([{**base, **r} for r in rows], schema=QUARANTINE_SCHEMA)


def _dead(*rows: tuple[int, list, str, str]) -> pa.Table:
    made = [
        dead_letter_row("t", 0, offset, 0, b"k", headers, b"v", reason, detail)
        for offset, headers, reason, detail in rows
    ]
    return pa.Table.from_pylist(made, schema=DEAD_LETTER_SCHEMA)


def _ward(i: int, partition: int = 0) -> dict:
    return {
        "waveform_id": f"ecg-{i}",
        "reason": "too_large",
        "detail": "1500000 bytes by header; the maximum is 1000000",
        "partition": partition,
        "first_offset": 10 + 4 * i,
        "last_offset": 13 + 4 * i,
        "records": 4,
        "total_size": 1_500_000,
        "source": "ward-1",
    }


def test_named_takes_the_rows_the_run_publishes_in_offset_order_and_counts_the_rest():
    quarantine = _quarantine(*(_ward(i, partition=i % 2) for i in range(25)))
    dead = _dead(
        (7, [("wp-id", b"ecg-x"), ("wp-source", b"ward-2")], "malformed_header", "wp-seq is not an integer: 'two'"),
        (3, None, "missing_header", "no wp-version header"),
    )
    found = named(quarantine, dead, cap=20)
    assert found.quarantined_total == 25 and len(found.quarantined) == 20
    first = found.quarantined[0]
    assert (first.waveform_id, first.source, first.reason, first.partition, first.first_offset) == (
        "ecg-0",
        "ward-1",
        "too_large",
        0,
        10,
    )
    assert first.detail == "1500000 bytes by header; the maximum is 1000000" and first.chunks == 4
    assert [w.partition for w in found.quarantined[:13]] == [0] * 13  # partition, then offset
    assert found.quarantined_waveforms == {0: 13, 1: 12}
    assert found.quarantined_reasons == {0: {"too_large": 13}, 1: {"too_large": 12}}
    assert found.dead_letter_total == 2
    assert [(d.first_offset, d.reason, d.waveform_id, d.source) for d in found.dead_letter] == [
        (3, "missing_header", None, None),
        (7, "malformed_header", "ecg-x", "ward-2"),
    ]
    # a waveform with two reasons is one waveform
    twice = named(_quarantine(_ward(1), {**_ward(1), "reason": "id_conflict"}), None)
    assert twice.quarantined_total == 1 and twice.quarantined_waveforms == {0: 1} and len(twice.quarantined) == 2
    assert named(None, None).quarantined_total == 0


def test_a_producers_long_text_is_cut_in_the_report_not_in_the_table():
    found = named(_quarantine({**_ward(0), "waveform_id": "x" * 5000, "detail": "d" * 5000}), None)
    assert len(found.quarantined[0].waveform_id) == 300 and found.quarantined[0].waveform_id.endswith("\u2026")


def _report(quarantine=None, dead=None, *, waveforms=None, success=True, window=None, replaced=None, **p0):
    result = _reassembled(dead_letter=1, **p0)
    result.waveforms = waveforms or {"output_new": 3, "quarantined:too_large": 3}
    fields, done = {"success": success, "thresholds": THRESHOLDS}, {}
    if quarantine is not None or dead is not None:
        (done if success else fields)["named"] = dataclasses.asdict(named(quarantine, dead))
    if replaced is not None:
        done["replaced_rows"] = replaced
    plan = dataclasses.replace(PLAN, window=window) if window else PLAN
    report = build_report(
        plan,
        CONSUMED,
        result,
        {"plan": 0.1},
        validation=validated(**fields),
        published=published(**done) if success else None,
    )
    return json.loads(json.dumps(report))  # as the page is made again from the JSON twin


def test_the_page_names_each_quarantined_waveform_and_dead_letter():
    quarantine = _quarantine(*(_ward(i) for i in range(3)))
    dead = _dead((19, [("wp-id", b"ecg-9"), ("wp-source", b"ward-3")], "unknown_version", "wp-version 9 is not known"))
    report = _report(quarantine, dead)
    assert report["named"]["quarantined_total"] == 3 and report["named"]["quarantined_waveforms"] == {"0": 3}
    page = report_html.render(report, trend=[])
    section = page[page.index('id="set-aside"') : page.index("<h2>Offsets and chunks</h2>")]
    for i in range(3):
        assert f"<code>ecg-{i}</code>" in section
    assert section.count("ward-1") == 3 and "too_large" in section
    assert "1500000 bytes by header; the maximum is 1000000" in section
    assert "<code>ecg-9</code>" in section and "ward-3" in section and "wp-version 9 is not known" in section
    values, _ = parse_numbers(page)
    assert values["named.quarantined.1.first_offset"] == "14" and values["named.dead_letter.0.first_offset"] == "19"
    for key, raw in values.items():  # every number shown is the report's
        if key:
            assert raw == ("" if _lookup(report, key) is None else str(_lookup(report, key))), key
    assert "more (see the" not in section


def test_the_page_names_the_first_twenty_and_counts_the_others():
    report = _report(
        _quarantine(*(_ward(i) for i in range(23))), _dead(*((i, None, "empty_value", "") for i in range(21)))
    )
    page = report_html.render(report, trend=[])
    assert "<code>ecg-19</code>" in page and "<code>ecg-20</code>" not in page
    assert "and 3 more (see the quarantine table)" in page
    assert "and 1 more (see the dead-letter table)" in page


def test_what_a_producer_sent_is_escaped_on_the_page():
    quarantine = _quarantine({**_ward(0), "waveform_id": EVIL, "source": EVIL, "detail": EVIL, "reason": EVIL})
    dead = _dead((1, [("wp-id", EVIL.encode()), ("wp-source", EVIL.encode())], "malformed_header", EVIL))
    page = report_html.render(_report(quarantine, dead), trend=[])
    assert "<script>" not in page
    section = page[page.index('id="set-aside"') : page.index("<h2>Offsets and chunks</h2>")]
    assert section.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") == 7


def test_a_report_that_names_nothing_still_renders_and_says_where_the_names_are():
    report = _report()
    report.pop("named")  # an earlier wavepipe's report
    page = report_html.render(report, trend=[])
    assert "the quarantine and dead-letter tables hold them" in page
    assert named_record(named(None, None))["quarantined"] == []


def test_the_page_says_why_a_share_above_the_limit_did_not_fail_the_run():
    page = report_html.render(_report(_quarantine(*(_ward(i) for i in range(3)))), trend=[])
    assert (
        "3 of 6 waveforms quarantined (50%); the limit of 10% applies from 100 waveforms on, "
        "so this run&#39;s share was not judged." in page
    )
    many = {"output_new": 150, "quarantined:too_large": 50}
    page = report_html.render(_report(waveforms=many, success=False), trend=[])
    assert "50 of 200 waveforms quarantined (25%): above the limit of 10%" in page and "which failed the run" in page
    few = {"output_new": 195, "quarantined:too_large": 5}
    assert "5 of 200 waveforms quarantined (2.5%): within the limit of 10%" in report_html.render(
        _report(waveforms=few), trend=[]
    )
    assert report_html.quarantine_share(_report(waveforms={"output_new": 4})) is None


def test_the_partition_table_counts_waveforms_apart_from_chunks():
    quarantine = _quarantine(*(_ward(i) for i in range(3)))
    report = _report(quarantine, quarantined=12, output=1, quarantine_reasons={"too_large": 12})
    page = report_html.render(report, trend=[])
    table = page[page.index('id="partitions"') :]
    table = table[: table.index("</table>")]
    assert '<th class="g" colspan="6">chunks (records)</th>' in table and "quarantined waveforms" in table
    values, _ = parse_numbers(page)
    assert values["partitions.0.quarantined"] == "12" and values["named.quarantined_waveforms.0"] == "3"
    assert "too_large: 3 waveforms, 12 chunks" in table


def test_a_window_runs_page_uses_one_set_of_numbers_and_words():
    window = {"start": "2026-11-20T00:00:00+00:00", "end": "2026-11-20T00:15:00+00:00", "offsets": {"0": [10, 20]}}
    report = _report(waveforms={"output_new": 44}, window=window, replaced=44)
    page = report_html.render(report, trend=[])
    bounds = page[page.index('id="bounds"') :]
    bounds = bounds[: bounds.index("</p>")]
    assert "this run wrote" in bounds and "waveforms into it, replacing" in bounds
    assert "earlier rows of the window in the output table" in bounds
    outcomes = page[page.index('id="outcomes"') :]
    outcomes = outcomes[: outcomes.index("</table>")]
    assert "waveforms written into the window" in outcomes and "earlier rows of the window replaced" in outcomes
    assert "output_new</td>" not in outcomes  # the key is named, not shown as the label
    values, _ = parse_numbers(page)
    assert values["waveforms.output_new"] == values["outcome.rewritten"] == "44"
    assert values["outcome.replaced"] == "44"
    assert "of them written before" not in page and "written before</th>" not in page


def test_a_share_above_the_limit_in_a_run_that_passed_says_when_it_was_judged():
    """quarantining quality rules hold waveforms back as the run publishes, after the run-level judgement"""
    page = report_html.render(_report(waveforms={"output_new": 150, "quarantined:qc_dead_channel": 50}), trend=[])
    assert "above the limit of 10%" in page and "judged before quality rules quarantined some" in page


def test_the_runs_summary_in_the_terminal_names_the_first_ones_and_says_how_the_share_was_judged():
    from wavepipe.cli import NAMED_IN_SUMMARY, _set_aside_lines

    quarantine = _quarantine(*(_ward(i) for i in range(NAMED_IN_SUMMARY + 2)))
    dead = _dead((19, [("wp-id", b"ecg-9"), ("wp-source", b"ward-3")], "unknown_version", "wp-version 9 is not known"))
    lines = _set_aside_lines(_report(quarantine, dead))
    assert lines[0].startswith("  3 of 6 waveforms quarantined (50%); the limit of 10% applies from 100"), lines
    assert lines[1] == "  quarantine: ecg-0 (source ward-1): too_large: 1500000 bytes by header; the maximum is 1000000"
    assert "  quarantine: and 2 more (the run's page, the quarantine table)" in lines
    assert lines[-1] == "  dead letter: ecg-9 (source ward-3): unknown_version: wp-version 9 is not known"
    assert _set_aside_lines(_report()) == [
        "  3 of 6 waveforms quarantined (50%); the limit of 10% applies from 100 "
        "waveforms on, so this run's share was not judged."
    ]
