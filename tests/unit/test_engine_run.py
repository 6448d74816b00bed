"""What a run's engine steps do beside publishing (read the plot's waveforms): ``engine_run.beside``."""

from __future__ import annotations

import threading
import time

import pytest

from wavepipe.spark_apps.engine_run import beside


def test_work_beside_runs_in_its_own_thread_and_gives_its_result_and_time():
    started, release = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        release.wait(5)
        time.sleep(0.05)
        return threading.current_thread().name

    wait = beside(work, "wavepipe-test-docs")
    assert started.wait(5)  # running before anyone waits: publishing goes on meanwhile
    release.set()
    name, seconds = wait()
    assert name == "wavepipe-test-docs" and seconds >= 0.05


def test_a_defect_in_work_beside_is_raised_to_the_waiting_step_not_lost_in_its_thread():
    def work() -> str:
        return 1 / 0

    wait = beside(work, "wavepipe-test-broken")
    with pytest.raises(ZeroDivisionError):
        wait()
