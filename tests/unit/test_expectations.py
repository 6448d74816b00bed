"""The suites are built from the settings' thresholds, and bad thresholds are refused."""

from datetime import UTC, datetime

import pytest

from wavepipe import expectations
from wavepipe.contracts.config import load_settings

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _by_column(expectation_list):
    return {(type(e).__name__, getattr(e, "column", None) or getattr(e, "column_A", None)): e for e in expectation_list}


def test_thresholds_come_from_the_settings():
    settings = load_settings(
        validate_sample_rate_min=10,
        validate_sample_rate_max=1000,
        validate_mostly=0.9,
        validate_start_time_min="2020-01-01T00:00:00Z",
        validate_start_time_max_ahead_s=3600,
        validate_duration_tolerance_s=0.5,
    )
    suites = expectations.suites(settings, NOW)
    assert set(suites) == {"wavepipe_output.v1", "wavepipe_staged_chunks.v1"}
    output = _by_column(suites["wavepipe_output.v1"])
    rate = output[("ExpectColumnValuesToBeBetween", "sample_rate")]
    assert (rate.min_value, rate.max_value, rate.mostly) == (10, 1000, 0.9)
    start = output[("ExpectColumnValuesToBeBetween", "start_time")]
    assert start.min_value == datetime(2020, 1, 1, tzinfo=UTC)
    assert start.max_value == datetime(2026, 11, 22, 13, 0, tzinfo=UTC)
    assert output[("ExpectColumnValuesToBeBetween", "duration_error_s")].max_value == 0.5
    # always every row, whatever validate_mostly says
    assert output[("ExpectColumnPairValuesToBeEqual", "checksum")].mostly == 1
    assert output[("ExpectColumnValuesToBeUnique", "waveform_id")].mostly == 1
    for column in expectations.METADATA_COLUMNS:
        assert ("ExpectColumnValuesToNotBeNull", column) in output
    chunks = _by_column(suites["wavepipe_staged_chunks.v1"])
    assert ("ExpectColumnValuesToBeInSet", "in_planned_range") in chunks
    assert ("ExpectCompoundColumnsToBeUnique", None) in chunks


@pytest.mark.parametrize(
    "bad",
    [{"validate_mostly": 0}, {"validate_mostly": 1.5}, {"validate_sample_rate_min": 10, "validate_sample_rate_max": 1}],
)
def test_bad_thresholds_are_refused(bad):
    with pytest.raises(ValueError, match="validate_"):
        expectations.suites(load_settings(**bad), NOW)


def test_every_expectation_says_what_it_checks():
    for expectation_list in expectations.suites(load_settings(), NOW).values():
        assert all(e.description for e in expectation_list)
