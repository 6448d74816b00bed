"""How a step says that its engine went away, and that Spark may retry a lost task (pure logic;
the real kills are in tests/integration/test_engine.py)."""

import logging

import pytest

from wavepipe import engine_client, spark_launch
from wavepipe.spark_launch import with_task_retries


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("local", "local[1,4]"),
        ("local[2]", "local[2,4]"),
        ("local[*]", "local[*,4]"),
        ("local[2,1]", "local[2,1]"),  # a count the user chose stays
        ("spark://h:7077", "spark://h:7077"),  # a cluster retries tasks by its own default
    ],
)
def test_local_mode_retries_a_lost_task(master, expected):
    assert with_task_retries(master) == expected


class _Unavailable(Exception):
    def __str__(self):
        return "<_InactiveRpcError of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = ..."


@pytest.mark.parametrize(
    ("exc", "died", "says"),
    [
        (RuntimeError("boom"), {"pid": 4242}, "the Spark engine's JVM (pid 4242) exited during Spark step validate"),
        (
            RuntimeError("Job 116 cancelled because SparkContext was shut down"),
            {},
            "the Spark engine was stopped during Spark step validate (`wavepipe spark restart --force`",
        ),
        (_Unavailable(), {}, "the Spark engine at sc://127.0.0.1:15002 stopped answering during Spark step validate"),
    ],
)
def test_an_engine_that_went_away_is_one_line_with_what_to_run_next(exc, died, says):
    with pytest.raises(RuntimeError), spark_launch.phase("reassemble"), spark_launch.phase("validate"):
        raise RuntimeError("the step's own failure")
    reason = engine_client._lost_reason(exc, died, "sc://127.0.0.1:15002")
    assert reason.startswith(says), reason
    message = engine_client._lost_message(reason, None)
    assert "\n" not in message and "`wavepipe run` resumes the run" in message


def test_another_failure_is_not_taken_for_a_lost_engine():
    assert engine_client._lost_reason(ValueError("a column is missing"), {}, "sc://h:1") is None


def test_the_progress_line_names_the_part_of_the_step_that_failed(caplog):
    caplog.set_level(logging.INFO, logger="wavepipe.spark")
    with (
        pytest.raises(KeyError),
        spark_launch.progress("Spark step reassemble"),
        spark_launch.phase("validate"),
        spark_launch.phase("publish"),
    ):
        raise KeyError("x")
    assert "Spark step reassemble: failed in publish after" in caplog.text
    with spark_launch.progress("Spark step reassemble"), spark_launch.phase("validate"):
        pass
    assert "Spark step reassemble: done after" in caplog.text
