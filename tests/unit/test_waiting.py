"""Polling loops retry only what means "not ready yet" (``wavepipe.waiting``): anything else ends
the wait at once, logged once with its traceback, and the error names what was awaited; and the
loops that use it (the lag watcher, a lease's renewer, the step's job list)."""

from __future__ import annotations

import asyncio
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


def test_a_check_that_raises_a_bug_ends_the_wait_at_once_raised_as_itself():
    calls = []

    def check():
        calls.append(1)
        return "a" / "b"  # the probe's bug: TypeError

    with _Records("wavepipe.waiting") as logs, pytest.raises(TypeError, match="unsupported operand"):
        wait_until(check, 60, "the broker to answer", retry_on=(ConnectionError,), hint="see its log /x.log")
    assert len(calls) == 1, "a bug is not asked again"
    assert not logs.errors(), "a defect is not said as a wait that ended (a WaitError is a service's unavailability)"


def test_a_check_that_raises_an_unexpected_error_ends_the_wait_with_its_traceback_logged_once():
    calls = []

    def check():
        calls.append(1)
        raise KeyError("no such partition")  # not BUGS, not what the wait retries

    with _Records("wavepipe.waiting") as logs, pytest.raises(WaitError) as raised:
        wait_until(check, 60, "the broker to answer", retry_on=(ConnectionError,), hint="see its log /x.log")
    assert len(calls) == 1, "not asked again"
    message = str(raised.value)
    assert message.startswith("stopped waiting for the broker to answer: KeyError: 'no such partition'")
    assert message.endswith("; see its log /x.log") and "\n" not in message
    assert isinstance(raised.value.__cause__, KeyError)
    (logged,) = logs.errors()
    assert logged.getMessage() == message and logged.exc_info[0] is KeyError


def test_an_expected_error_is_retried_until_the_timeout_which_names_what_was_awaited():
    calls = []

    def check():
        calls.append(1)
        raise ConnectionRefusedError("connection refused")

    with _Records("wavepipe.waiting") as logs, pytest.raises(WaitError) as raised:
        # 1.5 s: asked at least three times also on a machine busy with the integration tier
        wait_until(check, 1.5, "the object store to answer", retry_on=(OSError,), poll_s=0.05)
    assert len(calls) >= 3
    assert str(raised.value) == (
        "gave up waiting for the object store to answer after 1.5s (last error: ConnectionRefusedError: "
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


def test_the_lag_watcher_retries_a_broker_that_is_down_and_stops_measuring_on_a_bug(monkeypatch):
    """A bug is logged once and ends the measurements, but not the trigger (the triggerer would
    start a failed one again within a second); a broker that is down is retried."""
    from confluent_kafka import KafkaError, KafkaException

    from wavepipe.plugins import triggers

    monkeypatch.setattr(triggers, "MAX_BACKOFF_S", 0.01)
    trigger = triggers.GroupLagTrigger(topic="t", group="g", records=1, poll_s=0.001)
    failures = [KafkaException(KafkaError(KafkaError._TRANSPORT)), ConnectionError("refused"), TypeError("a bug")]
    opened = []

    def broken_open():
        opened.append(1)
        raise failures[min(len(opened), len(failures)) - 1]

    monkeypatch.setattr(trigger, "_open", broken_open)

    async def first_event():
        return await trigger.run().__anext__()

    with _Records("wavepipe.plugins.triggers", "wavepipe.waiting") as logs, pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(first_event(), timeout=1.0))
    assert len(opened) == 3, "retried twice, then not again"
    assert logs.said("could not measure the lag") == 2
    (logged,) = logs.errors()
    assert logged.exc_info[0] is TypeError
    assert logged.getMessage().startswith("stopped waiting for the lag of group 'g' on 't': TypeError: a bug")


class _Store:
    """A store whose conditional puts raise what it is given, then stop the renewer."""

    def __init__(self, lease, failures):
        self.lease, self.failures, self.calls = lease, failures, 0

    def put_if(self, key, data, etag=None):
        self.calls += 1
        if self.calls > len(self.failures):
            self.lease._stop.set()
            return "etag"
        raise self.failures[self.calls - 1]


def test_a_lease_renewer_retries_a_store_that_fails_and_stops_on_anything_else():
    from wavepipe.state import Lease
    from wavepipe.storage import StorageUnavailableError

    lease = Lease(None, "runs/r/.lock", lease_s=0.003)
    lease.store = _Store(lease, [StorageUnavailableError("no answer"), OSError("reset")])
    with _Records("wavepipe.state", "wavepipe.waiting") as logs:
        lease._renew()
    assert lease.store.calls == 3 and lease.etag == "etag" and not logs.errors()
    assert logs.said("could not renew the lease runs/r/.lock") == 2

    lease = Lease(None, "runs/r/.lock", lease_s=0.003)
    lease.store = _Store(lease, [AttributeError("a bug"), StorageUnavailableError("no answer")])
    with _Records("wavepipe.state", "wavepipe.waiting") as logs:
        lease._renew()
    assert lease.store.calls == 1, "not tried again after a bug"
    (logged,) = logs.errors()
    assert logged.exc_info[0] is AttributeError and "the lease runs/r/.lock to be renewed" in logged.getMessage()


def test_the_job_list_is_not_asked_again_after_a_bug(monkeypatch):
    from wavepipe import engine_client

    calls = []

    def buggy(ui, tag):
        calls.append(tag)
        raise KeyError("jobTags")

    monkeypatch.setattr(engine_client, "spark_jobs", buggy)
    monkeypatch.setattr(engine_client.time, "sleep", lambda s: None)
    with _Records("wavepipe.engine", "wavepipe.waiting") as logs:
        assert engine_client._listed_jobs("http://ui", "t") is None
    assert len(calls) == 1
    (logged,) = logs.errors()
    assert logged.exc_info[0] is KeyError and "the step's Spark jobs from http://ui" in logged.getMessage()


def test_expected_takes_types_or_a_predicate():
    assert waiting.expected(ConnectionResetError(), (OSError,))
    assert not waiting.expected(TypeError(), (OSError,))
    assert waiting.expected(ValueError("x"), lambda exc: str(exc) == "x")
