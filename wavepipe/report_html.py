"""The run's page: the JSON run report rendered for a person (one self-contained HTML file).

Every number shown comes from the JSON twin and carries its path there (``data-key``, dotted; list
items by index) and its raw value (``data-value``), so a test or a script can check the page
against the report. What could not be described (a plot, Data Docs, the trend) is listed under
"Notes"; ``write_plain`` is the page for when this one cannot be made.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d2430;max-width:1200px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #dde;padding-bottom:4px}
.sub{color:#667;font-size:13px} .badge{display:inline-block;padding:3px 10px;border-radius:12px;color:#fff;font-size:13px}
.ok{background:#1a7f37} .bad{background:#cf222e} .idle{background:#6e7781}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:12px}
.card{border:1px solid #dde;border-radius:8px;padding:8px 14px;min-width:110px}
.card .v{font-size:20px;font-weight:600} .card .l{font-size:12px;color:#667}
table{border-collapse:collapse;font-size:13px;margin-top:8px} th,td{border:1px solid #dde;padding:4px 8px;text-align:right}
th{background:#f6f8fa} td.t,th.t{text-align:left} tr.fail td{background:#fff0f0} tr.pass td{background:#f0fff4}
.bar{background:#4c8bf5;height:10px;display:inline-block;vertical-align:middle}
code{background:#f6f8fa;padding:1px 4px;border-radius:4px}
"""


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return str(value)


def _num(key: str, value: Any, tag: str = "td") -> str:
    raw = "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return f'<{tag} data-key="{escape(key)}" data-value="{escape(raw)}">{escape(_fmt(value))}</{tag}>'


def _mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:,.1f} MB"


def _status(report: dict) -> tuple[str, str]:
    if report.get("window") and report.get("status") == "window_replaced":
        w = report["window"]
        return "ok", f"window [{w['start']}, {w['end']}) replaced; no offset committed"
    if report.get("commit") is not None:
        return ("idle", "nothing new") if report.get("skipped") else ("ok", "committed")
    validation = report.get("validation") or {}
    if validation and not validation.get("success"):
        return "bad", "validation failed: not published, not committed"
    return "idle", report.get("status") or "in progress"


def _cards(report: dict) -> str:
    t = report["totals"]
    items = [
        ("offsets", "offsets planned"),
        ("records_read", "records read"),
        ("output", "chunks in output"),
        ("output_already_written", "of them written before"),
        ("pending", "pending"),
        ("quarantined", "quarantined"),
        ("dead_letter", "dead-lettered"),
        ("gap", "gap"),
        ("lost", "lost"),
    ]
    cards = [
        f'<div class="card"><div class="v" data-key="totals.{k}" data-value="{t.get(k, 0)}">'
        f'{_fmt(t.get(k, 0))}</div><div class="l">{escape(label)}</div></div>'
        for k, label in items
    ]
    cards.append(
        f'<div class="card"><div class="v">{_mb(t.get("payload_bytes_read"))}</div>'
        f'<div class="l">payload read</div></div>'
    )
    tp = report.get("throughput_mb_s")
    cards.append(
        f'<div class="card"><div class="v" data-key="throughput_mb_s" data-value="{"" if tp is None else tp}">'
        f'{_fmt(tp)}</div><div class="l">MB/s end to end</div></div>'
    )
    return '<div class="cards">' + "".join(cards) + "</div>"


PARTITION_COLUMNS = [
    ("start", "start"),
    ("end", "end"),
    ("offsets", "offsets"),
    ("lag_before", "lag before"),
    ("safe_offset", "safe offset"),
    ("lag_after", "lag after"),
    ("output", "output"),
    ("output_already_written", "written before"),
    ("pending", "pending"),
    ("quarantined", "quarantined"),
    ("dead_letter", "dead letter"),
    ("gap", "gap"),
    ("payload_bytes_read", "bytes read"),
    ("output_bytes", "output bytes"),
    ("read_seconds", "read s"),
]


def _partitions(report: dict) -> str:
    head = (
        '<tr><th class="t">partition</th>'
        + "".join(f"<th>{escape(h)}</th>" for _, h in PARTITION_COLUMNS)
        + '<th class="t">quarantine reasons</th></tr>'
    )
    rows = []
    for p, part in sorted(report["partitions"].items(), key=lambda kv: int(kv[0])):
        cells = "".join(_num(f"partitions.{p}.{k}", part.get(k)) for k, _ in PARTITION_COLUMNS)
        reasons = ", ".join(f"{escape(r)}: {n}" for r, n in sorted(part.get("quarantine_reasons", {}).items()))
        lost = f" (lost {part['lost'][0]}..{part['lost'][1]})" if part.get("lost") else ""
        rows.append(
            f'<tr><td class="t">{escape(part["topic"])}[{p}]{escape(lost)}</td>{cells}'
            f'<td class="t">{reasons or "–"}</td></tr>'
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _waveforms(report: dict) -> str:
    items = sorted((report.get("waveforms") or {}).items())
    if not items:
        return "<p>No waveforms in this run.</p>"
    rows = "".join(f'<tr><td class="t">{escape(k)}</td>{_num(f"waveforms.{k}", v)}</tr>' for k, v in items)
    return f'<table><tr><th class="t">waveforms</th><th>count</th></tr>{rows}</table>'


def _timings(report: dict) -> str:
    timings = {k: v for k, v in report.get("timings_s", {}).items() if isinstance(v, (int, float))}
    if not timings:
        return ""
    top = max(timings.values()) or 1
    rows = "".join(
        f'<tr><td class="t">{escape(k)}</td>{_num(f"timings_s.{k}", v)}'
        f'<td class="t"><span class="bar" style="width:{int(300 * v / top)}px"></span></td></tr>'
        for k, v in timings.items()
    )
    return f'<table><tr><th class="t">stage</th><th>seconds</th><th class="t"></th></tr>{rows}</table>'


def _validation(report: dict) -> str:
    v = report.get("validation")
    if not v:
        return "<p>Not validated (nothing new was read).</p>" if report.get("skipped") else "<p>Not validated yet.</p>"
    verdict = '<span class="badge ok">passed</span>' if v["success"] else '<span class="badge bad">failed</span>'
    docs = (
        f' · <a href="{escape(v["data_docs_index"])}">Great Expectations Data Docs</a>'
        if v.get("data_docs_index")
        else ""
    )
    out = [
        f"<p>{verdict} suite version {escape(str(v.get('suite_version')))}, checked {escape(str(v.get('checked_at')))}"
        f"{docs}</p>"
    ]
    rows = []
    for i, s in enumerate(v.get("suites", [])):
        link = f'<a href="{escape(s["data_docs"])}">results</a>' if s.get("data_docs") else ""
        rows.append(
            f'<tr class="{"pass" if s["success"] else "fail"}"><td class="t">{escape(s["suite"])}</td>'
            f"{_num(f'validation.suites.{i}.evaluated', s['evaluated'])}"
            f"{_num(f'validation.suites.{i}.failed_count', s['failed_count'])}"
            f'<td class="t">{link}</td></tr>'
        )
    out.append(
        '<table><tr><th class="t">suite</th><th>expectations</th><th>failed</th><th class="t"></th></tr>'
        + "".join(rows)
        + "</table>"
    )
    failed = [(i, j, f) for i, s in enumerate(v.get("suites", [])) for j, f in enumerate(s["failed"])]
    if failed:
        body = "".join(
            f'<tr class="fail"><td class="t">{escape(f["expectation"])}</td>'
            f'<td class="t">{escape(str(f.get("column") or f.get("column_A") or f.get("column_list") or ""))}</td>'
            f"{_num(f'validation.suites.{i}.failed.{j}.unexpected_count', f.get('unexpected_count'))}"
            f'<td class="t">{escape(str(f.get("examples") or f.get("error") or ""))}</td>'
            f'<td class="t">{escape(f.get("description") or "")}</td></tr>'
            for i, j, f in failed
        )
        out.append(
            '<table><tr><th class="t">failed expectation</th><th class="t">column</th><th>rows</th>'
            '<th class="t">examples</th><th class="t">what it checks</th></tr>' + body + "</table>"
        )
    return "".join(out)


def _trend(trend: list[dict]) -> str:
    if not trend:
        return "<p>No validations recorded yet.</p>"
    rows = "".join(
        f'<tr class="{"pass" if e["success"] else "fail"}"><td class="t">{escape(e["run_id"])}</td>'
        f'<td class="t">{escape(e["checked_at"])}</td><td class="t">{"passed" if e["success"] else "failed"}</td>'
        f"<td>{_fmt(e['waveforms'])}</td><td>{_fmt(e['staged_records'])}</td><td>{_fmt(e['failed'])}</td>"
        f'<td class="t">{escape(", ".join(e.get("failed_expectations", [])))}</td></tr>'
        for e in reversed(trend)
    )
    return (
        '<table><tr><th class="t">run</th><th class="t">checked</th><th class="t">outcome</th><th>waveforms</th>'
        '<th>staged records</th><th>failed</th><th class="t">failed expectations</th></tr>' + rows + "</table>"
    )


def _notes(report: dict) -> str:
    """What could not be described for this run (a plot, Data Docs, the trend): never a failure."""
    notes = report.get("notes") or []
    if not notes:
        return ""
    items = "".join(f"<li>{escape(str(n))}</li>" for n in notes)
    return f'<h2>Notes</h2><ul id="notes">{items}</ul>'


def render(report: dict, *, trend: list[dict], plot_png: Path | None = None, json_name: str | None = None) -> str:
    badge_class, badge_text = _status(report)
    plot = ""
    if plot_png is not None and plot_png.exists():
        data = base64.b64encode(plot_png.read_bytes()).decode()
        plot = f'<h2>A few reassembled waveforms</h2><img alt="waveforms" src="data:image/png;base64,{data}">'
    twin = f' · <a href="{escape(json_name)}">JSON report</a>' if json_name else ""
    commit = report.get("commit") or {}
    commit_rows = "".join(
        f'<tr><td class="t">{escape(p)}</td>{_num(f"commit.{p}.before", c.get("before"))}'
        f"{_num(f'commit.{p}.after', c.get('after'))}</tr>"
        for p, c in sorted(commit.items(), key=lambda kv: int(kv[0]))
    )
    commit_html = (
        (
            '<table><tr><th class="t">partition</th><th>committed before</th><th>after</th></tr>'
            + commit_rows
            + "</table>"
        )
        if commit_rows
        else "<p>No offsets were committed by this run.</p>"
    )
    errors = "".join(f"<li>{escape(e)}</li>" for e in report.get("balance_errors", []))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>wavepipe run {escape(report["run_id"])}</title>
<style>{STYLE}</style></head><body>
<h1>Run <code data-key="run_id" data-value="{escape(report["run_id"])}">{escape(report["run_id"])}</code>
 <span class="badge {badge_class}" id="status">{escape(badge_text)}</span></h1>
<div class="sub">{escape(report["topic"])} · group {escape(report["group"])} · planned {escape(report["planned_at"])}
 · reported {escape(report["reported_at"])}{twin}</div>
{f'<p class="sub">Skipped: {escape(report["skipped"])}</p>' if report.get("skipped") else ""}
{f"<h2>Counts do not add up</h2><ul>{errors}</ul>" if errors else ""}
{_notes(report)}
{_cards(report)}
<h2>Validation</h2>{_validation(report)}
<h2>Partitions</h2>{_partitions(report)}
<h2>Offsets committed</h2>{commit_html}
<h2>Waveforms</h2>{_waveforms(report)}
{plot}
<h2>Stage timings</h2>{_timings(report)}
<h2>Validation trend (last {len(trend)})</h2>{_trend(trend)}
</body></html>
"""


def write(report: dict, path: Path, *, trend: list[dict], plot_png: Path | None = None) -> Path:
    from wavepipe.plan import write_text_atomic

    write_text_atomic(path, render(report, trend=trend, plot_png=plot_png, json_name=f"{report['run_id']}.json"))
    return path


def render_plain(report: dict) -> str:
    """A page that cannot fail on any report: its notes and the report as JSON text."""
    import json

    run_id = escape(str(report.get("run_id")))
    text = escape(json.dumps(report, indent=1, default=str))
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>wavepipe run {run_id}</title>'
        f"<style>{STYLE}</style></head><body><h1>Run <code>{run_id}</code></h1>"
        f"<p>The full page could not be made; the report follows as JSON.</p>{_notes(report)}"
        f"<h2>Report</h2><pre>{text}</pre></body></html>\n"
    )


def write_plain(report: dict, path: Path) -> Path:
    """``render_plain`` of ``report`` to ``path`` (the fallback when ``write`` fails)."""
    from wavepipe.plan import write_text_atomic

    write_text_atomic(path, render_plain(report))
    return path
