"""The suites are built from the settings' thresholds, bad thresholds are refused, and the
failures of the per-waveform suite become quarantine reasons, not a failed run."""

from datetime import UTC, datetime

import pandas as pd
import pytest

from wavepipe import expectations
from wavepipe.contracts.config import load_settings

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
WAVEFORMS = "wavepipe_waveforms.v3"
RUN = "wavepipe_run.v3"


def _by_column(expectation_list):
    return {(type(e).__name__, getattr(e, "column", None) or getattr(e, "column_A", None)): e for e in expectation_list}


def test_thresholds_come_from_the_settings():
    settings = load_settings(
        validate_sample_rate_min=10,
        validate_sample_rate_max=1000,
        validate_start_time_min="2020-01-01T00:00:00Z",
        validate_start_time_max_ahead_s=3600,
        validate_max_quarantined_share=0.25,
    )
    suites = expectations.suites(settings, NOW)
    assert list(suites) == [WAVEFORMS, RUN], "the per-waveform suite first: the run-level one judges its outcome"
    per_waveform = _by_column(suites[WAVEFORMS])
    rate = per_waveform[("ExpectColumnValuesToBeBetween", "sample_rate")]
    assert (rate.min_value, rate.max_value, rate.mostly) == (10, 1000, 1.0)
    start = per_waveform[("ExpectColumnValuesToBeBetween", "start_time")]
    assert start.min_value == datetime(2020, 1, 1, tzinfo=UTC)
    assert start.max_value == datetime(2026, 11, 22, 13, 0, tzinfo=UTC)
    assert ("ExpectColumnValuesToBeInSet", "numbers_finite") in per_waveform
    share = _by_column(suites[RUN])[("ExpectColumnValuesToBeBetween", "quarantined_share")]
    assert (share.min_value, share.max_value) == (None, 0.25)  # a share below 0 cannot happen: no bound to check
    assert not expectations.gates_the_run(WAVEFORMS) and expectations.gates_the_run(RUN)


def test_no_expectation_checks_what_the_data_path_guarantees_by_construction():
    columns = {c for suite in expectations.suites(load_settings(), NOW).values() for _, c in _by_column(suite)}
    # the checksum is verified before a row exists, the duration is n_samples / sample_rate, the
    # readers stage only their planned offsets: none of these can fail here
    # nor can a size that is not whole samples (the parser dead-letters it) or a negative share
    assert not columns & {"payload_sha256", "duration_error_s", "in_planned_range", "checksum", "size_bytes"}


@pytest.mark.parametrize(
    "bad",
    [
        {"validate_max_quarantined_share": 1.5},
        {"validate_quarantine_judged_from": 0},
        {"validate_sample_rate_min": 10, "validate_sample_rate_max": 1},
    ],
)
def test_bad_thresholds_are_refused(bad):
    with pytest.raises(ValueError, match="validate_"):
        expectations.suites(load_settings(**bad), NOW)


def test_every_expectation_says_what_it_checks():
    for expectation_list in expectations.suites(load_settings(), NOW).values():
        assert all(e.description for e in expectation_list)


def _validate(expectation_list, frame: pd.DataFrame, **result_format):
    import great_expectations as gx

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = {"globally": False}
    batch = context.data_sources.add_pandas("p").add_dataframe_asset("a").add_batch_definition_whole_dataframe("b")
    suite = context.suites.add(gx.ExpectationSuite(name="s", expectations=expectation_list))
    definition = context.validation_definitions.add(gx.ValidationDefinition(name="v", data=batch, suite=suite))
    return definition.run(batch_parameters={"dataframe": frame}, result_format=result_format or "SUMMARY")


def _waveform(waveform_id: str, **values) -> dict:
    row = {
        "waveform_id": waveform_id,
        "checksum": f"sha256:{waveform_id}",
        "partition": 0,
        "first_offset": 0,
        "sample_rate": 100.0,
        "start_time": datetime(2026, 1, 1, tzinfo=UTC),
        "size_bytes": 8,
        "numbers_finite": True,
        "published_by_other_run": False,
    }
    return {**row, **values}


def test_each_per_waveform_expectation_fails_its_waveform_and_names_it_as_the_reason():
    from wavepipe.spark_apps.rejections import INDEX_COLUMNS, rejected_waveforms

    rows = [
        _waveform("good"),
        _waveform("rate-1e-9", sample_rate=1e-9),
        _waveform("rate-5e-324", sample_rate=5e-324, numbers_finite=False),  # its duration is infinite
        _waveform("from-1677", start_time=datetime(1677, 9, 22, tzinfo=UTC)),
        _waveform("from-the-future", start_time=datetime(2026, 11, 24, tzinfo=UTC)),
        _waveform("taken", published_by_other_run=True),
    ]
    frame = pd.DataFrame(rows).astype({"start_time": object})
    result = _validate(
        expectations.waveform_expectations(load_settings(), NOW),
        frame,
        result_format="COMPLETE",
        unexpected_index_column_names=list(INDEX_COLUMNS),
    )
    rejected = rejected_waveforms(result)
    reasons = {wid: r["reason"] for wid, r in rejected.items()}
    assert reasons == {
        "rate-1e-9": "expect_column_values_to_be_between(sample_rate)",
        "rate-5e-324": "expect_column_values_to_be_in_set(numbers_finite)",  # the first it failed, in suite order
        "from-1677": "expect_column_values_to_be_between(start_time)",
        "from-the-future": "expect_column_values_to_be_between(start_time)",
        "taken": "expect_column_values_to_be_in_set(published_by_other_run)",
    }
    assert "sample_rate=1e-09" in rejected["rate-1e-9"]["detail"]
    both = rejected["rate-5e-324"]["detail"]
    assert "finite" in both and "sample_rate=4.94066e-324" in both, both  # every failure is in the detail
    assert rejected["taken"]["checksum"] == "sha256:taken" and rejected["taken"]["partition"] == 0


@pytest.mark.parametrize(
    ("waveforms", "share", "passes"),
    [
        ({"output_new": 5, "quarantined:incomplete": 95}, 0.95, False),  # a fleet gone wrong: the run stops
        ({"output_new": 10, "quarantined:too_large": 90}, 0.9, True),  # at the limit
        ({"quarantined:expect_column_values_to_be_between(sample_rate)": 99}, None, True),  # too few to judge
        ({"output_new": 0}, None, True),
    ],
)
def test_the_run_level_suite_fails_a_run_whose_quarantined_share_is_too_high(waveforms, share, passes):
    from wavepipe.spark_apps.validate import run_frame

    frame = run_frame(waveforms, judged_from=100)
    assert (None if pd.isna(frame["quarantined_share"][0]) else frame["quarantined_share"][0]) == share
    result = _validate(expectations.run_expectations(load_settings()), frame)
    assert result.success is passes


def test_a_window_run_replaces_the_quarantine_rows_of_rejected_waveforms_outside_its_offsets():
    from wavepipe.spark_apps.rejections import Rejection

    rejected = {
        "inside": {"partition": 0, "first_offset": 12},
        "before": {"partition": 0, "first_offset": 3},  # its first chunk is before the window's offsets
        "other-partition": {"partition": 1, "first_offset": 12},  # a partition the window has no offsets in
    }
    assert Rejection(rejected).outside({0: (10, 20)}) == ["before", "other-partition"]
    assert Rejection().ids == [] and Rejection(rejected).ids == sorted(rejected)
