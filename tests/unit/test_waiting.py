"""Polling loops retry only what means "not ready yet" (``wavepipe.waiting``): anything else ends
the wait at once, logged once with its traceback, and the error names what was awaited."""

from __future__ import annotations

import logging

import pytest

from wavepipe import waiting
from wavepipe.waiting import WaitError, wait_until


class _Records(logging.Handler):
    """What the named loggers log, whatever the logging setup (Airflow's import changes it)."""

    def __init__(self, *names: str):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.loggers = [logging.getLogger(name) for name in names]

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> _Records:
        self.levels = [logger.level for logger in self.loggers]
        for logger in self.loggers:
            logger.addHandler(self)
            logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc) -> None:
        for logger, level in zip(self.loggers, self.levels, strict=True):
            logger.removeHandler(self)
            logger.setLevel(level)

    def errors(self) -> list[logging.LogRecord]:
        return [r for r in self.records if r.levelno >= logging.ERROR]

    def said(self, text: str) -> int:
        return sum(text in r.getMessage() for r in self.records)


def test_a_check_that_raises_a_bug_ends_the_wait_at_once_with_its_traceback_logged_once():
    calls = []

    def check():
        calls.append(1)
        return "a" / "b"  # the probe's bug: TypeError

    with _Records("wavepipe.waiting") as logs, pytest.raises(WaitError) as raised:
        wait_until(check, 60, "the broker to answer", retry_on=(ConnectionError,), hint="see its log /x.log")
    assert len(calls) == 1, "a bug is not asked again"
    message = str(raised.value)
    assert message.startswith("stopped waiting for the broker to answer: TypeError: unsupported operand")
    assert message.endswith("; see its log /x.log") and "\n" not in message
    assert isinstance(raised.value.__cause__, TypeError)
    (logged,) = logs.errors()
    assert logged.getMessage() == message and logged.exc_info[0] is TypeError


def test_an_expected_error_is_retried_until_the_timeout_which_names_what_was_awaited():
    calls = []

    def check():
        calls.append(1)
        raise ConnectionRefusedError("connection refused")

    with _Records("wavepipe.waiting") as logs, pytest.raises(WaitError) as raised:
        wait_until(check, 0.3, "the object store to answer", retry_on=(OSError,), poll_s=0.05)
    assert len(calls) >= 3
    assert str(raised.value) == (
        "gave up waiting for the object store to answer after 0.3s (last error: ConnectionRefusedError: "
        "connection refused)"
    )
    assert not logs.errors() and logs.said("connection refused") == len(calls), "expected: DEBUG lines only"


def test_the_first_truthy_answer_is_returned_and_a_falsy_one_asked_again():
    answers = iter([None, 0, ConnectionError("not yet"), "ready"])

    def check():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_until(check, 5, "it", retry_on=(ConnectionError,), poll_s=0.001) == "ready"


def test_a_timeout_without_an_error_and_the_callers_own_error_class():
    class SetupError(Exception):
        pass

    with pytest.raises(SetupError, match=r"^gave up waiting for two brokers after 0.1s; see the log$"):
        wait_until(lambda: False, 0.1, "two brokers", poll_s=0.02, hint="see the log", error=SetupError)

    def exited():
        raise SetupError("the node exited with code 1")

    with pytest.raises(SetupError, match=r"^the node exited with code 1$"):  # the check's own verdict, as is
        wait_until(exited, 5, "the node", retry_on=(OSError,), error=SetupError)


def test_retry_on_may_be_a_predicate_on_the_error():
    answers = iter([RuntimeError("Generic S3 error: refused"), RuntimeError("a bug")])

    def check():
        raise next(answers)

    with pytest.raises(WaitError, match="RuntimeError: a bug"):
        wait_until(check, 5, "the store", retry_on=lambda exc: "S3" in str(exc), poll_s=0.001)


def test_ctrl_c_is_never_caught():
    def check():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_until(check, 5, "it", retry_on=(Exception,))


def test_expected_takes_types_or_a_predicate():
    assert waiting.expected(ConnectionResetError(), (OSError,))
    assert not waiting.expected(TypeError(), (OSError,))
    assert waiting.expected(ValueError("x"), lambda exc: str(exc) == "x")
