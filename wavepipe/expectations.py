"""The validation gate's expectation suites, kept as code and versioned (``SUITE_VERSION``).

Two suites, run by Great Expectations (``spark_apps/validate.py`` builds the columns named here):

* ``wavepipe_waveforms``: per waveform, on the run's new waveforms (one row each) before they are
  published. A waveform that fails one of these is quarantined with the expectation's name as its
  reason (``quarantine_reason``); it never fails the run, so one producer's bad waveforms cannot
  stall the group.
* ``wavepipe_run``: the run as a whole (one row). A failure here fails the run: nothing is
  published and no offset moves until it passes.

Every expectation here can fail on some input (each has a test that makes it fail). What the
data path guarantees by construction (a checksum verified before the row exists, a reader's
offsets inside its range) is enforced where it is made, not re-checked here.

Thresholds come from the settings (``validate_*``); each expectation's description states the
values used, so the Data Docs read "sample rate between 0.001 Hz and 1e+09 Hz", not a setting's
name. Each result is shown with what was observed (``show_observed``: the range of values seen, the
waveforms outside, the quarantined share and every quarantine reason behind it) and the data it
was run on (``ASSETS``). Change an expectation's meaning, add or remove one: bump
``SUITE_VERSION`` (it is recorded in every run's report and in the validation history).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from wavepipe.contracts.config import Settings

SUITE_VERSION = 3
WAVEFORM_SUITE = "wavepipe_waveforms"
RUN_SUITE = "wavepipe_run"

#: The run-level frame's columns (``spark_apps.validate.run_frame``).
RUN_COLUMNS = ("waveforms_judged", "quarantined", "quarantined_share")
#: The run-level frame's column that lists the quarantined waveforms by reason, every reason
#: (the reassembly's too_large, checksum_mismatch, ... and the expectations'), e.g.
#: ``too_large 3, checksum_mismatch 1``; shown with the share, never checked (``run_frame``).
REASONS_COLUMN = "quarantine_reasons"

#: What each suite is run on: the Data Docs' "Data asset".
ASSETS = {
    WAVEFORM_SUITE: "the run's new waveforms (one row each)",
    RUN_SUITE: "the run as a whole (one row)",
}


def parse_utc(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def start_time_bounds(settings: Settings, now: datetime) -> tuple[datetime, datetime]:
    """UTC bounds, timezone-aware: PySpark turns a naive datetime into a timestamp in the local
    time zone of the process, an aware one exactly."""
    low = parse_utc(settings.validate_start_time_min).astimezone(UTC)
    high = now.astimezone(UTC) + timedelta(seconds=settings.validate_start_time_max_ahead_s)
    return low, high


def _number(value: float) -> str:
    """A threshold or an observed number as a reader writes it: 500, 0.001, 12,000, 1e+09."""
    return f"{value:,g}" if abs(value) < 1e6 else f"{value:g}"


def _percent(share: float) -> str:
    return f"{share * 100:.4g}%"


def _utc_text(value) -> str:
    """A time (datetime, ISO text, pandas or NumPy timestamp) as UTC ISO text to the second."""
    import pandas as pd

    stamp = pd.Timestamp(parse_utc(value) if isinstance(value, str) else value)
    stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def waveform_expectations(settings: Settings, now: datetime) -> list:
    """Per waveform: a row that fails one is quarantined, named by ``quarantine_reason``."""
    import great_expectations as gx

    E = gx.expectations
    if settings.validate_sample_rate_min > settings.validate_sample_rate_max:
        raise ValueError("validate_sample_rate_min is above validate_sample_rate_max")
    low, high = start_time_bounds(settings, now)
    return [
        E.ExpectColumnValuesToBeInSet(
            column="numbers_finite",
            value_set=[True],
            description="sample rate and duration are finite numbers (a rate of 5e-324 Hz makes the duration "
            "infinite; non-finite values are caught, never compared)",
        ),
        E.ExpectColumnValuesToBeBetween(
            column="sample_rate",
            min_value=settings.validate_sample_rate_min,
            max_value=settings.validate_sample_rate_max,
            description=f"sample rate between {_number(settings.validate_sample_rate_min)} Hz and "
            f"{_number(settings.validate_sample_rate_max)} Hz (validate_sample_rate_min, validate_sample_rate_max)",
        ),
        E.ExpectColumnValuesToBeBetween(
            column="start_time",
            min_value=low,
            max_value=high,
            description=f"start time between {_utc_text(low)} and {_utc_text(high)} (validate_start_time_min, "
            f"and the validation's time + validate_start_time_max_ahead_s = "
            f"{_number(settings.validate_start_time_max_ahead_s)} s)",
        ),
        E.ExpectColumnValuesToBeInSet(
            column="published_by_other_run",
            value_set=[False],
            description="one row per waveform id in the output table: no other run published this id since the "
            "reassembly looked",
        ),
    ]


def run_expectations(settings: Settings) -> list:
    """The run as a whole (``RUN_COLUMNS``, one row): a failure fails the run."""
    import great_expectations as gx

    E = gx.expectations
    return [
        E.ExpectColumnValuesToBeBetween(
            column="quarantined_share",
            max_value=settings.validate_max_quarantined_share,
            description=f"share of the run's waveforms quarantined (every reason) at most "
            f"{_percent(settings.validate_max_quarantined_share)} (validate_max_quarantined_share), judged once the "
            f"run has {settings.validate_quarantine_judged_from:,} waveforms (validate_quarantine_judged_from)",
        ),
    ]


def run_frame(waveforms: dict[str, int], judged_from: int):
    """The run-level suite's one row (``RUN_COLUMNS``, then ``REASONS_COLUMN``), from the run's
    waveform counts once validation quarantined what failed a per-waveform expectation
    (``steps.settled``: ``quarantined:<reason>`` keys): the waveforms judged (new and quarantined;
    re-deliveries and pending ones are not judged), the quarantined ones, their share, None (not
    judged) below ``judged_from`` waveforms, and every reason with its count, the most first."""
    import pandas as pd

    reasons = {k.partition(":")[2] or k: n for k, n in waveforms.items() if k.startswith("quarantined") and n}
    quarantined = sum(n for k, n in waveforms.items() if k.startswith("quarantined"))
    judged = waveforms.get("output_new", 0) + quarantined
    share = quarantined / judged if judged and judged >= judged_from else None
    listed = ", ".join(f"{reason} {n:,}" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    return pd.DataFrame(
        {
            "waveforms_judged": [judged],
            "quarantined": [quarantined],
            "quarantined_share": [share],
            REASONS_COLUMN: [listed or None],
        },
        columns=[*RUN_COLUMNS, REASONS_COLUMN],
    ).astype({"quarantined_share": "float64"})


#: Units of the checked columns, said with their observed values.
_UNITS = {"sample_rate": " Hz"}


def observed_value(expectation_type: str, kwargs: dict, frame) -> str | None:
    """What an expectation saw in ``frame`` (the frame its suite ran on), in words for the Data
    Docs' "Observed Value": for a range, the lowest and highest value and how many rows lie
    outside the bounds; for a set, each value's count; for the run's quarantined share, the share,
    the waveforms it counts and every quarantine reason. None: nothing to say (no such column)."""
    import pandas as pd

    column = kwargs.get("column")
    if column not in getattr(frame, "columns", ()):
        return None
    if column == "quarantined_share" and len(frame) == 1:
        return _run_share(frame.iloc[0])
    values = frame[column].dropna()
    rows = f"{len(frame):,} waveform{'s' if len(frame) != 1 else ''}"
    if not len(values):
        return f"no values in {rows}"
    if expectation_type == "expect_column_values_to_be_in_set":
        counts = values.value_counts()
        return ", ".join(f"{value}: {n:,}" for value, n in counts.items()) + f" (of {rows})"
    if expectation_type == "expect_column_values_to_be_between":
        timed = pd.api.types.is_datetime64_any_dtype(values) or isinstance(values.iloc[0], datetime)
        beyond = 0  # times pandas cannot hold (before 1677 or after 2262): outside any bound it can
        if timed:
            parsed = pd.to_datetime(values, utc=True, errors="coerce")
            beyond = int(parsed.isna().sum())
            values = parsed.dropna()
            if not len(values):
                return f"{beyond:,} times out of range in {rows}; {beyond:,} outside"
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        as_bound = (lambda b: pd.Timestamp(_utc_text(b))) if timed else float
        outside = pd.Series(False, index=values.index)
        if low is not None:
            outside |= values < as_bound(low)
        if high is not None:
            outside |= values > as_bound(high)
        shown = _utc_text if timed else (lambda v: _number(float(v)) + _UNITS.get(column, ""))
        span = (
            shown(values.min()) if values.min() == values.max() else f"{shown(values.min())} to {shown(values.max())}"
        )
        return f"{span} in {rows}; {int(outside.sum()) + beyond:,} outside"
    return None


def _run_share(row) -> str:
    quarantined, judged = int(row["quarantined"]), int(row["waveforms_judged"])
    share = row["quarantined_share"]
    said = (
        f"{_percent(float(share))}: {quarantined:,} of {judged:,} waveforms quarantined"
        if share is not None and share == share
        else f"not judged ({judged:,} waveforms, fewer than needed): {quarantined:,} quarantined"
    )
    reasons = row.get(REASONS_COLUMN)
    return f"{said} ({reasons})" if isinstance(reasons, str) and reasons else said


def suite_base(suite: str) -> str:
    """``wavepipe_waveforms`` of ``wavepipe_waveforms.v3``."""
    return suite.rsplit(".v", 1)[0]


def show_observed(result, frame) -> None:
    """Put into a suite's validation ``result`` (GX's ``ExpectationSuiteValidationResult``, as a
    checkpoint returned it, before it is stored again and its Data Docs built) what each
    expectation observed in ``frame`` (``observed_value``, which GX shows as the "Observed Value"
    whatever result format the run used) and what the suite ran on (``ASSETS``, GX's "Data asset")."""
    for evr in result.results:
        config = evr.expectation_config
        try:
            seen = observed_value(config.type, dict(config.kwargs), frame)
        except Exception as exc:  # it only describes the validation: never fails it
            logging.getLogger(__name__).warning("no observed value for %s: %s", config.type, exc)
            seen = None
        if seen is not None:
            evr.result = {**(evr.result or {}), "observed_value": seen}
    asset = ASSETS.get(suite_base(result.suite_name or ""))
    if asset:
        spec = result.meta.get("batch_spec")
        if spec is None:
            result.meta["batch_spec"] = spec = {}
        spec["data_asset_name"] = asset


def quarantine_reason(expectation_type: str, column: str | None) -> str:
    """The quarantine reason of a waveform that failed a per-waveform expectation: its name and
    column, e.g. ``expect_column_values_to_be_between(sample_rate)``."""
    return f"{expectation_type}({column})" if column else expectation_type


def suite_name(base: str) -> str:
    return f"{base}.v{SUITE_VERSION}"


def suites(settings: Settings, now: datetime) -> dict[str, list]:
    """Suite name -> its expectations, with the thresholds of ``settings``; the per-waveform
    suite first (the run-level one judges what it quarantined)."""
    return {
        suite_name(WAVEFORM_SUITE): waveform_expectations(settings, now),
        suite_name(RUN_SUITE): run_expectations(settings),
    }


def gates_the_run(suite: str) -> bool:
    """Whether a failure of ``suite`` fails the run (else it quarantines waveforms)."""
    return not suite.startswith(WAVEFORM_SUITE + ".")
