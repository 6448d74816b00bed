"""``retrying``: Kafka's quick transient errors are retried, no broker answering is one line saying
where and what to do, anything else is raised at once."""

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from wavepipe.consumers.kafka_admin import KafkaUnreachableError, answering, retrying


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
    assert retrying(call, "offsets of t", "b:9", pause_s=0.001) == 3
    assert "offsets of t: Broker: Leader not available (attempt 2/20), retrying" in caplog.text


def test_the_last_attempts_error_is_raised():
    call, calls = _failing(10, KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    with pytest.raises(KafkaException):
        retrying(call, "x", "b:9", attempts=4, pause_s=0.001)
    assert len(calls) == 4


def test_any_other_error_is_raised_at_once():
    call, calls = _failing(1, KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        retrying(call, "x", "b:9", pause_s=0.001)
    assert len(calls) == 1


@pytest.mark.parametrize("code", [KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
def test_no_broker_answering_is_one_line_naming_the_servers_and_how_to_start_one(code):
    call, calls = _failing(1, code)
    with pytest.raises(KafkaUnreachableError) as said:
        retrying(call, "committed offsets of group 'g'", "b:9", pause_s=0.001)
    assert len(calls) == 1 and "\n" not in str(said.value)
    assert str(said.value).startswith("Kafka at b:9 did not answer in 0s (committed offsets of group 'g': ")
    assert "`wavepipe kafka up`" in str(said.value)


def test_answering_leaves_other_errors_as_they_are():
    with pytest.raises(KafkaException), answering("b:9", "commit"):
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
