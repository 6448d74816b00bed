"""``retrying``: Kafka's quick transient errors are retried, anything else is raised at once."""

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from wavepipe.consumers.kafka_admin import retrying


def _failing(times: int, code: int):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise KafkaException(KafkaError(code))
        return len(calls)

    return call, calls


def test_a_transient_error_is_retried_until_the_call_succeeds(caplog):
    caplog.set_level(logging.INFO, logger="wavepipe")
    call, _ = _failing(2, KafkaError.LEADER_NOT_AVAILABLE)
    assert retrying(call, "offsets of t", pause_s=0.001) == 3
    assert "offsets of t: Broker: Leader not available (attempt 2/20), retrying" in caplog.text


def test_the_last_attempts_error_is_raised():
    call, calls = _failing(10, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    with pytest.raises(KafkaException):
        retrying(call, "x", attempts=4, pause_s=0.001)
    assert len(calls) == 4


def test_any_other_error_is_raised_at_once():
    call, calls = _failing(1, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        retrying(call, "x", pause_s=0.001)
    assert len(calls) == 1
