"""The run page shows the numbers its JSON twin holds (parsed back out of the HTML and compared)."""

import html
import json
from html.parser import HTMLParser

from tests.unit.test_report import CONSUMED, PLAN, _reassembled, published, validated
from wavepipe import report_html
from wavepipe.contracts.report import build_report, failed_expectations, spark_jobs_summary


class _Numbers(HTMLParser):
    def __init__(self):
        super().__init__()
        self.values: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("data-key"):
            self.values[attrs["data-key"]] = attrs.get("data-value", "")
            self._open = attrs["data-key"]

    def handle_data(self, data):
        if self._open:
            self.texts[self._open] = self.texts.get(self._open, "") + data

    def handle_endtag(self, tag):
        self._open = None


def _lookup(report: dict, key: str):
    node = report
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def parse_numbers(html: str) -> tuple[dict[str, str], dict[str, str]]:
    parser = _Numbers()
    parser.feed(html)
    return parser.values, parser.texts


VALIDATION = {
    "run_id": "r1",
    "group": "g",
    "topic": "t",
    "success": False,
    "suite_version": 1,
    "checked_at": "2026-11-22T00:00:00Z",
    "data_docs_index": "file:///d/index.html",
    "plot": None,
    "thresholds": {},
    "rows": {"waveforms": 11, "waveform_bytes": 1100, "staged_records": 15},
    "timings": {"expectations_s": 1.5},
    "suites": [
        {
            "suite": "wavepipe_run.v3",
            "gates_run": True,
            "success": False,
            "evaluated": 24,
            "failed_count": 1,
            "data_docs": "file:///d/v.html",
            "failed": [
                {
                    "expectation": "expect_column_values_to_be_between",
                    "column": "sample_rate",
                    "description": "sample rate within bounds",
                    "unexpected_count": 2,
                    "unexpected_percent": 18.18,
                    "examples": [16000.0, 16000.0],
                    "error": None,
                }
            ],
        },
        {
            "suite": "wavepipe_waveforms.v3",
            "gates_run": False,
            "success": True,
            "evaluated": 5,
            "failed_count": 0,
            "data_docs": None,
            "failed": [],
        },
    ],
}


def _report(validation=VALIDATION, commit=None, publish=None):
    report = build_report(
        PLAN,
        CONSUMED,
        _reassembled(dead_letter=1),
        {"plan": 0.1, "reassemble": 9.5},
        validation=validated(**validation),
        published=publish,
    )
    if commit:
        report["commit"] = commit
    return report


def test_every_number_on_the_page_is_the_reports():
    report = _report(commit={"0": {"before": 10, "after": 14}, "1": {"before": None, "after": 5}})
    jobs = [{"id": 3, "kind": "aggregate", "s": 0.25, "status": "SUCCEEDED", "stages": 2, "operation": "ab12"}]
    report["spark_jobs"] = spark_jobs_summary({"reassemble": jobs * 4})
    html = report_html.render(report, trend=[])
    values, texts = parse_numbers(html)
    assert len(values) > 40
    for key, raw in values.items():
        if not key:
            continue
        expected = _lookup(report, key)
        assert raw == (
            "" if expected is None else str(expected).lower() if isinstance(expected, bool) else str(expected)
        ), key
        shown = texts.get(key, "").replace(",", "")
        if isinstance(expected, int) and not isinstance(expected, bool):
            assert shown == str(expected), (key, shown)
    for p, part in report["partitions"].items():  # each partition's counts are on the page
        for field in ("start", "end", "output", "pending", "quarantined", "dead_letter", "gap", "lag_before"):
            assert values[f"partitions.{p}.{field}"] == ("" if part[field] is None else str(part[field]))
    for field in ("offsets", "output", "pending", "quarantined", "dead_letter"):
        assert values[f"totals.{field}"] == str(report["totals"][field])
    assert values["commit.0.after"] == "14"
    assert (values["spark_jobs.count"], values["spark_jobs.seconds"]) == ("4", "1.0") and "reassemble 4" in html
    assert "committed" in html


def test_a_failed_validation_names_the_expectation_on_the_page_and_in_the_message():
    report = _report()
    html = report_html.render(
        report,
        trend=[
            {
                "run_id": "r0",
                "checked_at": "t",
                "success": True,
                "waveforms": 3,
                "staged_records": 9,
                "failed": 0,
                "failed_expectations": [],
            }
        ],
    )
    assert "validation failed" in html and "expect_column_values_to_be_between" in html and "sample_rate" in html
    assert "file:///d/index.html" in html  # Data Docs linked
    assert '<td class="t">r0</td>' in html  # the trend
    (line,) = failed_expectations(report["validation"]["suites"])
    assert "sample_rate" in line and "2 rows" in line and "16000.0" in line


def test_a_per_waveform_failure_shows_as_quarantine_not_as_a_failed_run():
    suites = [
        {**VALIDATION["suites"][0], "success": True, "failed_count": 0, "failed": []},
        {**VALIDATION["suites"][1], "success": False, "failed_count": 1, "failed": VALIDATION["suites"][0]["failed"]},
    ]
    report = _report({**VALIDATION, "success": True, "suites": suites}, publish=published())
    html = report_html.render(report, trend=[])
    assert "validation failed" not in html and "quarantines the waveform" in html
    assert '<tr class="warn"><td class="t">expect_column_values_to_be_between</td>' in html
    assert failed_expectations(suites, gating_only=True) == [], "a quarantine is no reason to fail the run"
    assert len(failed_expectations(suites)) == 1


def test_text_from_the_data_is_escaped():
    evil = "<script>alert(1)</script>"
    validation = json.loads(json.dumps(VALIDATION))
    validation["data_docs_index"] = f'file:///d/"{evil}'
    validation["suites"][0]["failed"][0].update(examples=[evil], column=evil, description=evil)
    report = _report(validation=validation)
    report["skipped"] = evil
    report["topic"] = evil
    report["partitions"]["0"]["quarantine_reasons"] = {evil: 1}
    html = report_html.render(
        report,
        trend=[
            {
                "run_id": evil,
                "checked_at": evil,
                "success": False,
                "waveforms": 1,
                "staged_records": 1,
                "failed": 1,
                "failed_expectations": [evil],
            }
        ],
    )
    assert "<script>" not in html and html.count("&lt;script&gt;") >= 8


def test_the_plain_page_does_not_need_the_template(monkeypatch):
    """the fallback page is made without the template, so a broken template still leaves a page"""
    report = _report()
    report["notes"] = ["the run's page failed: <boom>"]

    def broken():
        raise OSError("report.html.j2 is missing")

    monkeypatch.setattr(report_html, "_template", broken)
    page = report_html.render_plain(report)
    assert "<li>the run&#x27;s page failed: &lt;boom&gt;</li>" in page
    assert json.loads(html.unescape(page.split("<pre>", 1)[1].split("</pre>", 1)[0]))["run_id"] == report["run_id"]


def _with(report: dict, **changes) -> dict:
    return {**report, **changes}


def test_the_page_leads_with_waveforms_and_states_what_bounded_the_run():
    import dataclasses

    result = _reassembled(dead_letter=1)
    result.waveforms = {"output_new": 20, "pending": 2, "quarantined:size_mismatch": 1, "quarantined:incomplete": 2}
    capped = dataclasses.replace(PLAN, caps={"records_per_partition": 1000})
    report = build_report(capped, CONSUMED, result, {"plan": 0.1})
    assert report["outcome"] == {
        "new": 20,
        "rewritten": 0,
        "replaced": 0,
        "already_written": 0,
        "pending": 2,
        "quarantined": 3,
        "other_window": 0,
        "dead_letter_records": 1,
    }
    page = report_html.render(report, trend=[])
    values, _ = parse_numbers(page)
    # the waveform cards come first, before the offsets and chunks
    assert page.index('data-key="outcome.new"') < page.index('data-key="totals.offsets"')
    assert values["outcome.new"] == "20" and values["outcome.quarantined"] == "3"
    assert values["outcome.dead_letter_records"] == "1" and "outcome.rewritten" not in values
    assert "new waveforms" in page and values["caps.records_per_partition"] == "1000"
    assert "Capped at" in page and "records per partition" in page and "Incremental" in page

    window = {"start": "2026-11-20T00:00:00+00:00", "end": "2026-11-20T00:15:00+00:00", "offsets": {"0": [10, 20]}}
    report = build_report(
        dataclasses.replace(PLAN, window=window),
        CONSUMED,
        result,
        {"plan": 0.1},
        validation=validated(),
        published=published(replaced_rows=18),
    )
    assert report["outcome"]["rewritten"] == 20 and report["outcome"]["replaced"] == 18 and report["window"] == window
    assert report["outcome"]["new"] == 0
    page = report_html.render(report, trend=[])
    values, _ = parse_numbers(page)
    assert values["outcome.rewritten"] == "20" and values["outcome.replaced"] == "18" and "outcome.new" not in values
    assert "earlier rows of the window replaced" in page
    assert "Window [2026-11-20T00:00:00+00:00, 2026-11-20T00:15:00+00:00)" in page and "No cap." in page
    # not validated yet (or Delta did not say): the count is unknown, not zero
    report = build_report(dataclasses.replace(PLAN, window=window), CONSUMED, result, {"plan": 0.1})
    assert report["outcome"]["replaced"] is None
    assert parse_numbers(report_html.render(report, trend=[]))[0]["outcome.replaced"] == ""


def test_timings_are_grouped_by_step_and_idle_timers_left_out():
    timings = {
        "plan": 0.2,
        "consume_sum": 3.0,
        "consume_max": 1.6,
        "reassemble": 4.0,
        "spark_spark_app_s": 3.5,
        "spark_classify_s": 0.5,
        "validate": 2.0,
        "validate_expectations_s": 1.2,
        "validate_plot_wait_s": 0,
        "commit": 0.1,
        "later_timer_s": 0.3,
    }
    groups = report_html.timing_groups(timings)
    assert [(g["step"], g["seconds"]) for g in groups] == [
        ("plan", 0.2),
        ("consume", 1.6),
        ("reassemble", 4.0),
        ("validate", 2.0),
        ("commit", 0.1),
        ("other", None),
    ]
    by_step = {g["step"]: [name for _, name, _ in g["inner"]] for g in groups}
    assert by_step["reassemble"] == ["spark app", "classify"] and by_step["validate"] == ["expectations"]
    assert by_step["consume"] == ["all readers, added up"] and by_step["other"] == ["later timer"]
    page = report_html.render(_with(_report(), timings_s=timings), trend=[])
    assert "plot wait" not in page and 'data-key="timings_s.spark_spark_app_s"' in page


def test_the_cli_summary_says_what_the_page_leads_with(capsys):
    import dataclasses

    from wavepipe.cli import _print_report

    result = _reassembled(dead_letter=1)
    result.waveforms = {"output_new": 20, "pending": 2, "quarantined:incomplete": 2}
    _print_report(build_report(PLAN, CONSUMED, result, {"plan": 0.1}))
    line = capsys.readouterr().out.splitlines()[0]
    assert "20 new waveforms, 2 pending, 2 quarantined, 1 records dead-lettered" in line
    window = {"start": "a", "end": "b", "offsets": {"0": [10, 20], "1": [0, 5]}}
    report = build_report(
        dataclasses.replace(PLAN, window=window),
        CONSUMED,
        result,
        {"plan": 0.1},
        validation=validated(),
        published=published(replaced_rows=7),
    )
    _print_report(report)
    out = capsys.readouterr().out
    assert "20 waveforms written into the window" in out and "window [a, b): 7 earlier rows of it were replaced" in out


def test_the_quality_section_names_each_flagged_source_worst_first_with_its_numbers():
    import pyarrow as pa

    from wavepipe.contracts.quality import DEFAULT_RULES, parse_rules
    from wavepipe.spark_apps.quality import summarize

    rows = pa.table(
        {
            "source": ["ward-0", "mic-1", "station-01"],
            "qc_flags": [["dead_channel"], ["clipped"], []],
            "gap_s": [None, 0.0, 40.0],
            "latency_s": [60.0, 61.5, 62.0],
            "qc_dead": [[False, True], [False, False], [False]],
            "qc_spikes": [[1, 0], [0, 0], [3]],
            "qc_clipped_share": [[0.0, 0.0], [0.27, 0.0], [0.0]],
        }
    )
    report = _with(_report(), quality=summarize(rows, parse_rules(DEFAULT_RULES)))
    page = report_html.render(report, trend=[])
    values, _ = parse_numbers(page)
    assert (values["quality.flagged"], values["quality.measured"]) == ("2", "3")
    assert values["quality.by_rule.dead_channel"] == "1" and values["quality.sources.0.dead_channels"] == "1"
    section = page[page.index("<h2>Quality</h2>") : page.index("<h2>Partitions</h2>")]
    assert section.index("ward-0") < section.index("station-01") and "dead_channel: 1" in section
    assert "<b>late</b> when latency_s above 3600" in section
    assert "Not measured" in report_html.render(_with(_report(), quality=None), trend=[])
