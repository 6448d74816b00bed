"""Failpoint specs: typos are errors (a fault test must not pass without its fault)."""

import pytest

from wavepipe import faults


def test_parse_names_hits_and_chained_actions():
    assert faults.parse("consume.record@3=kill, commit.before_offsets=sleep:1.5+raise, plan.after_claim=stop") == {
        "consume.record": (3, "kill"),
        "commit.before_offsets": (1, "sleep:1.5+raise"),
        "plan.after_claim": (1, "stop"),
    }


@pytest.mark.parametrize(
    "spec", ["consume.recrd=kill", "consume.record=explode", "consume.record", "consume.record=sleep:soon"]
)
def test_bad_specs_are_errors(spec):
    with pytest.raises(ValueError, match="failpoint"):
        faults.parse(spec)


def test_acts_on_the_armed_hit_only(monkeypatch):
    monkeypatch.setattr(faults, "_hits", {})
    monkeypatch.setenv(faults.ENV, "commit.after_offsets@2=raise")
    faults.failpoint("commit.after_offsets")  # hit 1: nothing
    faults.failpoint("commit.before_offsets")  # not armed
    with pytest.raises(faults.InjectedFault, match="hit 2"):
        faults.failpoint("commit.after_offsets")
    faults.failpoint("commit.after_offsets")  # hit 3: nothing


def test_kill_app_refuses_outside_a_spark_app():
    with pytest.raises(faults.InjectedFault, match="not inside an app"):
        faults.kill_spark_app()
