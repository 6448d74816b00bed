"""The validation gate's expectation suites, kept as code and versioned (``SUITE_VERSION``).

Two suites, both run by Great Expectations on the run's Spark DataFrames (``spark_apps/validate.py``
builds the checked columns named here):

* ``wavepipe_output``: the run's new output waveforms, one row each, before they are published;
* ``wavepipe_staged_chunks``: every record the run staged (chunks and dead letters), by offset.

Thresholds come from the settings (``validate_*``); a run is published and committed only when every
expectation of both suites holds. Change an expectation's meaning, add or remove one: bump
``SUITE_VERSION`` (it is recorded in every run's report and in the validation history).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from wavepipe.contracts.config import Settings

SUITE_VERSION = 1
OUTPUT_SUITE = "wavepipe_output"
CHUNKS_SUITE = "wavepipe_staged_chunks"

#: Output columns every waveform must have (the metadata a reader relies on).
METADATA_COLUMNS = (
    "waveform_id",
    "source",
    "start_time",
    "date",
    "dtype",
    "channels",
    "sample_rate",
    "n_samples",
    "duration_s",
    "size_bytes",
    "n_chunks",
    "checksum",
    "topic",
    "partition",
    "first_offset",
    "last_offset",
    "run_id",
)


def parse_utc(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def start_time_bounds(settings: Settings, now: datetime) -> tuple[datetime, datetime]:
    """UTC bounds, timezone-aware: PySpark turns a naive datetime into a timestamp in the local
    time zone of the process, an aware one exactly."""
    low = parse_utc(settings.validate_start_time_min).astimezone(UTC)
    high = now.astimezone(UTC) + timedelta(seconds=settings.validate_start_time_max_ahead_s)
    return low, high


def output_expectations(settings: Settings, now: datetime) -> list:
    import great_expectations as gx

    E = gx.expectations
    mostly = settings.validate_mostly
    if not 0 < mostly <= 1:
        raise ValueError(f"validate_mostly must be in (0, 1], got {mostly}")
    if settings.validate_sample_rate_min > settings.validate_sample_rate_max:
        raise ValueError("validate_sample_rate_min is above validate_sample_rate_max")
    low, high = start_time_bounds(settings, now)
    return [
        E.ExpectColumnValuesToBeUnique(column="waveform_id", description="one row per waveform id in the run"),
        E.ExpectColumnValuesToBeInSet(
            column="published_by_other_run",
            value_set=[False],
            description="one row per waveform id in the output table: no id of this run is there from another run",
        ),
        *[E.ExpectColumnValuesToNotBeNull(column=c, description=f"{c} is set") for c in METADATA_COLUMNS],
        E.ExpectColumnPairValuesToBeEqual(
            column_A="size_bytes",
            column_B="expected_size_bytes",
            mostly=mostly,
            description="sample count consistent with size, dtype and channels",
        ),
        E.ExpectColumnValuesToBeBetween(
            column="duration_error_s",
            min_value=0,
            max_value=settings.validate_duration_tolerance_s,
            mostly=mostly,
            description="duration consistent with the sample rate (validate_duration_tolerance_s)",
        ),
        E.ExpectColumnValuesToBeBetween(
            column="sample_rate",
            min_value=settings.validate_sample_rate_min,
            max_value=settings.validate_sample_rate_max,
            mostly=mostly,
            description="sample rate within validate_sample_rate_min..max",
        ),
        E.ExpectColumnValuesToBeBetween(
            column="start_time",
            min_value=low,
            max_value=high,
            mostly=mostly,
            description="start time within validate_start_time_min .. now + validate_start_time_max_ahead_s",
        ),
        E.ExpectColumnPairValuesToBeEqual(
            column_A="checksum",
            column_B="payload_sha256",
            description="checksum verified: the stored payload hashes to wp-checksum",
        ),
    ]


def chunk_expectations() -> list:
    import great_expectations as gx

    E = gx.expectations
    return [
        E.ExpectCompoundColumnsToBeUnique(
            column_list=["topic", "partition", "offset"], description="no (topic, partition, offset) staged twice"
        ),
        E.ExpectColumnValuesToBeInSet(
            column="in_planned_range",
            value_set=[True],
            description="every staged offset inside the run's planned range",
        ),
        *[
            E.ExpectColumnValuesToNotBeNull(column=c, description=f"{c} is set")
            for c in ("topic", "partition", "offset")
        ],
    ]


def suite_name(base: str) -> str:
    return f"{base}.v{SUITE_VERSION}"


def suites(settings: Settings, now: datetime) -> dict[str, list]:
    """Suite name -> its expectations, with the thresholds of ``settings``."""
    return {
        suite_name(OUTPUT_SUITE): output_expectations(settings, now),
        suite_name(CHUNKS_SUITE): chunk_expectations(),
    }
