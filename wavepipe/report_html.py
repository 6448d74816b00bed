"""The run's page: the JSON run report rendered for a person (one self-contained HTML file).

Every number shown comes from the JSON twin and carries its path there (``data-key``, dotted; list
items by index) and its raw value (``data-value``), so a test or a script can check the page
against the report. What could not be described (a plot, Data Docs, the trend) is listed under
"Notes"; ``write_plain`` is the page for when this one cannot be made.
"""

from __future__ import annotations

import base64
import functools
import json
from html import escape
from pathlib import Path
from typing import Any

import jinja2

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1d2430;max-width:1200px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #dde;padding-bottom:4px}
.sub{color:#667;font-size:13px} .badge{display:inline-block;padding:3px 10px;border-radius:12px;color:#fff;font-size:13px}
.ok{background:#1a7f37} .bad{background:#cf222e} .idle{background:#6e7781}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:12px}
.card{border:1px solid #dde;border-radius:8px;padding:8px 14px;min-width:110px}
.card .v{font-size:20px;font-weight:600} .card .l{font-size:12px;color:#667}
table{border-collapse:collapse;font-size:13px;margin-top:8px} th,td{border:1px solid #dde;padding:4px 8px;text-align:right}
th{background:#f6f8fa} td.t,th.t{text-align:left} th.g{text-align:center} h3{font-size:15px;margin:14px 0 4px} tr.fail td{background:#fff0f0} tr.pass td{background:#f0fff4} tr.warn td{background:#fff8e6}
.bar{background:#4c8bf5;height:10px;display:inline-block;vertical-align:middle}
code{background:#f6f8fa;padding:1px 4px;border-radius:4px}
tr.inner td{color:#556;font-size:12px} #waveforms .card{border-color:#4c8bf5} #bounds{margin-top:8px}
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


def _raw(value: Any) -> str:
    """A number's raw value for ``data-value``: what the JSON holds (``true``/``false`` for booleans)."""
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


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


#: The waveform cards the page leads with (``report["outcome"]``): key, label. An incremental
#: run's written waveforms are ``new``; a window run's are ``rewritten``, replacing the window's
#: earlier rows (``replaced``).
WAVEFORM_CARDS = [
    ("new", "new waveforms"),
    ("rewritten", "waveforms written into the window"),
    ("replaced", "earlier rows of the window replaced"),
    ("already_written", "already in the table (re-delivered)"),
    ("pending", "pending (incomplete, read again next run)"),
    ("quarantined", "quarantined"),
    ("other_window", "left to another window"),
    ("dead_letter_records", "records dead-lettered"),
]
#: Always shown (the rest only when not zero).
WAVEFORM_CARDS_SHOWN = {"pending", "quarantined", "dead_letter_records"}

#: The offsets and chunks behind them (``report["totals"]``).
CARDS = [
    ("offsets", "offsets planned"),
    ("records_read", "records read"),
    ("output", "chunks in output"),
    ("output_already_written", "of them written before"),
    ("pending", "chunks pending"),
    ("quarantined", "chunks quarantined"),
    ("dead_letter", "records dead-lettered"),
    ("gap", "gap"),
    ("lost", "lost"),
]

#: The run's steps in order, and the prefix of each one's inner timers in ``timings_s``.
STEPS = [("plan", None), ("consume", None), ("reassemble", "spark_"), ("validate", "validate_"), ("commit", None)]

#: The partition table's columns (key in the partition's entry, heading), under the heading of
#: what they count: offsets, chunks (records), bytes and seconds. The quarantined waveforms (by
#: the partition of their first chunk) and the reasons follow the chunks (``render``).
PARTITION_GROUPS = [
    (
        "offsets",
        [
            ("start", "start"),
            ("end", "end"),
            ("offsets", "offsets"),
            ("lag_before", "lag before"),
            ("safe_offset", "safe offset"),
            ("lag_after", "lag after"),
        ],
    ),
    (
        "chunks (records)",
        [
            ("output", "output"),
            ("output_already_written", "written before"),
            ("pending", "pending"),
            ("quarantined", "quarantined"),
            ("dead_letter", "dead-lettered"),
            ("gap", "gap (no record)"),
        ],
    ),
    ("read", [("payload_bytes_read", "bytes read"), ("output_bytes", "output bytes"), ("read_seconds", "seconds")]),
]


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("wavepipe", "resources"),
        autoescape=True,  # every value from the report is escaped (a topic or reason may hold "<")
        keep_trailing_newline=True,
    )
    env.filters.update(fmt=_fmt, mb=_mb, raw=_raw)
    return env.get_template("report.html.j2")


def _chunk_label(key: str, label: str, window: bool) -> str:
    if window and key == "output_already_written":
        return "of them kept as written (rows outside the window)"
    return label


def _partition_groups(report: dict) -> list[tuple[str, list[tuple[str, str]]]]:
    """``PARTITION_GROUPS`` for ``report``: a window run rewrites what its window held, so its
    "written before" column is shown only where a waveform kept its row outside the window."""
    if not report.get("window"):
        return PARTITION_GROUPS
    kept = any(p.get("output_already_written") for p in report["partitions"].values())
    return [
        (
            group,
            [
                (k, "kept outside the window") if k == "output_already_written" else (k, h)
                for k, h in columns
                if kept or k != "output_already_written"
            ],
        )
        for group, columns in PARTITION_GROUPS
    ]


def _by_partition(items: dict) -> list:
    return sorted(items.items(), key=lambda kv: int(kv[0]))


def _waveform_cards(report: dict) -> list[tuple[str, str, int]]:
    outcome = report.get("outcome") or {}
    shown = WAVEFORM_CARDS_SHOWN | ({"rewritten", "replaced"} if report.get("window") else {"new"})
    return [(key, label, outcome.get(key)) for key, label in WAVEFORM_CARDS if outcome.get(key) or key in shown]


def timing_groups(timings: dict[str, float]) -> list[dict[str, Any]]:
    """``timings_s`` by step, in the run's order: each step's seconds (``consume``: its slowest
    reader; the readers run side by side) and its inner timers (key, name, seconds) that took
    any time. Timers of no step (a later wavepipe's) come last, under ``other``."""
    numbers = {k: v for k, v in timings.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    groups, seen = [], set()
    for step, prefix in STEPS:
        key = "consume_max" if step == "consume" else step
        inner = [k for k in numbers if prefix and k.startswith(prefix)] + (["consume_sum"] if step == "consume" else [])
        seen.update(inner, {key})
        if key in numbers or any(k in numbers for k in inner):
            groups.append(
                {
                    "step": step,
                    "key": key if key in numbers else None,
                    "seconds": numbers.get(key),
                    "inner": [_timer(k, prefix, numbers[k]) for k in inner if numbers.get(k)],
                }
            )
    rest = [k for k in numbers if k not in seen]
    if rest:
        groups.append(
            {"step": "other", "key": None, "seconds": None, "inner": [_timer(k, "", numbers[k]) for k in rest]}
        )
    return groups


def _timer(key: str, prefix: str | None, seconds: float) -> tuple[str, str, float]:
    name = key.removeprefix(prefix or "").removesuffix("_s").replace("_", " ")
    return key, "all readers, added up" if key == "consume_sum" else name, seconds


def outcome_label(key: str, window: bool) -> str:
    """What a key of the report's ``waveforms`` counts, in the words of the page's cards."""
    if key == "output_new":
        return "waveforms written into the window" if window else "new waveforms"
    if key == "output_already_written":
        return "in the table outside the window, kept as written" if window else "already in the table (re-delivered)"
    if key.startswith("quarantined:"):
        return f"quarantined: {key.partition(':')[2]}"
    return dict(WAVEFORM_CARDS).get(key, key.replace("_", " "))


def _waveform_rows(report: dict) -> list[tuple[str, str, str, Any]]:
    """The waveforms table: (data key, label, the report's key, count): the report's ``waveforms``,
    and for a window run its replaced rows, in the words of the cards above it."""
    window = bool(report.get("window"))
    rows = [
        (f"waveforms.{k}", outcome_label(k, window), k, n) for k, n in sorted((report.get("waveforms") or {}).items())
    ]
    if window and rows:
        replaced = (report.get("outcome") or {}).get("replaced")
        rows.append(("outcome.replaced", dict(WAVEFORM_CARDS)["replaced"], "replaced", replaced))
    return rows


def _percent(share: float) -> str:
    return f"{share * 100:.3g}%"


def quarantine_share(report: dict) -> str | None:
    """The run's quarantined share in words, and how the run-level limit judged it (None: none
    quarantined). Judged are the waveforms the run completed: written or quarantined (pending
    and re-delivered ones are not); the limit (``validate_max_quarantined_share``) applies from
    ``validate_quarantine_judged_from`` of them on."""
    waveforms = report.get("waveforms") or {}
    quarantined = sum(n for k, n in waveforms.items() if k.startswith("quarantined") and isinstance(n, int))
    if not quarantined:
        return None
    judged = quarantined + (waveforms.get("output_new") or 0)
    said = f"{quarantined:,} of {judged:,} waveforms quarantined ({_percent(quarantined / judged)})"
    validation = report.get("validation") or {}
    thresholds = validation.get("thresholds") or {}
    limit, judged_from = (
        thresholds.get("validate_max_quarantined_share"),
        thresholds.get("validate_quarantine_judged_from"),
    )
    if limit is None or judged_from is None:
        return said + "."
    rule = f"the limit of {_percent(limit)} applies from {judged_from:,} waveforms on"
    if judged < judged_from:
        return f"{said}; {rule}, so this run's share was not judged."
    if quarantined / judged > limit:
        above = f"{said}: above the limit of {_percent(limit)} ({rule})"
        if validation.get("success") is False:
            return f"{above}, which failed the run."
        return f"{above}; the run was judged before quality rules quarantined some as it published them."
    return f"{said}: within the limit of {_percent(limit)} ({rule})."


def _named(report: dict) -> dict | None:
    """What the page names of the run's quarantined waveforms and dead letters, and how many it
    leaves to the tables (None: the report names none, an earlier wavepipe's)."""
    named = report.get("named")
    if not isinstance(named, dict):
        return None
    out = {}
    for kind in ("quarantined", "dead_letter"):
        entries = [e for e in named.get(kind) or [] if isinstance(e, dict)]
        total = named.get(f"{kind}_total") or 0
        out[kind] = {"entries": entries, "total": total, "more": max(0, total - len(entries))}
    out["waveforms"] = named.get("quarantined_waveforms") or {}
    out["reasons"] = named.get("quarantined_reasons") or {}
    return out


def named_entries(report: dict, cap: int) -> list[tuple[str, list[dict], int]]:
    """(kind in words, its first ``cap`` named entries, how many more) of the run's quarantined
    waveforms and dead letters, for a summary in text."""
    named = _named(report) or {}
    return [
        (words, named[kind]["entries"][:cap], named[kind]["total"] - len(named[kind]["entries"][:cap]))
        for kind, words in (("quarantined", "quarantine"), ("dead_letter", "dead letter"))
        if kind in named and named[kind]["total"]
    ]


def render(report: dict, *, trend: list[dict], plot_png: Path | None = None, json_name: str | None = None) -> str:
    groups = timing_groups(report.get("timings_s", {}))
    window = bool(report.get("window"))
    return _template().render(
        report=report,
        style=STYLE,
        status=_status(report),
        cards=[(k, _chunk_label(k, label, window)) for k, label in CARDS],
        waveform_cards=_waveform_cards(report),
        partition_groups=_partition_groups(report),
        waveform_rows=_waveform_rows(report),
        share=quarantine_share(report),
        named=_named(report),
        partitions=_by_partition(report["partitions"]),
        commits=_by_partition(report.get("commit") or {}),
        timings=groups,
        timings_top=max((g["seconds"] or 0 for g in groups), default=0) or 1,
        trend=trend,
        json_name=json_name,
        plot_png=_png(plot_png),
        flagged_png=_png((report.get("quality") or {}).get("plot")),
    )


def _png(path: str | Path | None) -> str | None:
    """The PNG at ``path`` as base64 text for an ``img`` (None: no path, or no file there)."""
    if path is None or not Path(path).exists():
        return None
    return base64.b64encode(Path(path).read_bytes()).decode()


def write(report: dict, path: Path, *, trend: list[dict], plot_png: Path | None = None) -> Path:
    from wavepipe.contracts.runfiles import write_text_atomic

    write_text_atomic(path, render(report, trend=trend, plot_png=plot_png, json_name=f"{report['run_id']}.json"))
    return path


def render_plain(report: dict) -> str:
    """A page that cannot fail on any report: its notes and the report as JSON text. Written without
    the template on purpose, so that a broken or missing template still leaves this page."""
    run_id = escape(str(report.get("run_id")))
    notes = "".join(f"<li>{escape(str(n))}</li>" for n in report.get("notes") or [])
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>wavepipe run {run_id}</title>'
        f"<style>{STYLE}</style></head><body><h1>Run <code>{run_id}</code></h1>"
        "<p>The full page could not be made; the report follows as JSON.</p>"
        + (f'<h2>Notes</h2><ul id="notes">{notes}</ul>' if notes else "")
        + f"<h2>Report</h2><pre>{escape(json.dumps(report, indent=1, default=str))}</pre></body></html>\n"
    )


def write_plain(report: dict, path: Path) -> Path:
    """``render_plain`` of ``report`` to ``path`` (the fallback when ``write`` fails)."""
    from wavepipe.contracts.runfiles import write_text_atomic

    write_text_atomic(path, render_plain(report))
    return path
