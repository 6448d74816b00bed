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

Thresholds come from the settings (``validate_*``). Change an expectation's meaning, add or remove
one: bump ``SUITE_VERSION`` (it is recorded in every run's report and in the validation history).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from wavepipe.contracts.config import Settings

SUITE_VERSION = 3
WAVEFORM_SUITE = "wavepipe_waveforms"
RUN_SUITE = "wavepipe_run"

#: The run-level frame's columns (``spark_apps.validate.run_frame``).
RUN_COLUMNS = ("waveforms_judged", "quarantined", "quarantined_share")


def parse_utc(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def start_time_bounds(settings: Settings, now: datetime) -> tuple[datetime, datetime]:
    """UTC bounds, timezone-aware: PySpark turns a naive datetime into a timestamp in the local
    time zone of the process, an aware one exactly."""
    low = parse_utc(settings.validate_start_time_min).astimezone(UTC)
    high = now.astimezone(UTC) + timedelta(seconds=settings.validate_start_time_max_ahead_s)
    return low, high


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
            description="sample rate within validate_sample_rate_min..max",
        ),
        E.ExpectColumnValuesToBeBetween(
            column="start_time",
            min_value=low,
            max_value=high,
            description="start time within validate_start_time_min .. now + validate_start_time_max_ahead_s",
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
            description="share of the run's waveforms quarantined (every reason) at most "
            "validate_max_quarantined_share, judged once the run has validate_quarantine_judged_from waveforms",
        ),
    ]


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
