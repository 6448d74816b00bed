"""The soak's pure parts: its send schedule, its windows, and the figures and goals it draws
from its samples (the soak itself runs the real services: `wavepipe bench --soak`)."""

from __future__ import annotations

import pytest

from wavepipe.bench.soak import SoakOptions, goals, save, summary


def test_the_schedule_sends_one_every_few_seconds_and_a_burst_at_each_multiple():
    options = SoakOptions(minutes=1, every_s=5, burst=3, burst_every_s=20)
    assert options.schedule() == [
        (0, 1),
        (5, 1),
        (10, 1),
        (15, 1),
        (20, 3),
        (25, 1),
        (30, 1),
        (35, 1),
        (40, 3),
        (45, 1),
        (50, 1),
        (55, 1),
    ]


def test_the_windows_shrink_for_a_short_soak():
    assert SoakOptions(minutes=30).windows() == (300, 300)
    assert SoakOptions(minutes=3).windows() == (60, 60)


def _samples(rss, state_files, end: int = 180) -> list[dict]:
    """A sample every 10 s: the follow task's RSS and the run state's files from the two functions of t."""
    folders = {name: {"files": 0, "bytes": 0} for name in ("groups", "reports", "dead-letters", "staging", "gx")}
    return [
        {
            "t": t,
            "rss_mb": {"follow_task": rss(t), "scheduler": 100.0},
            "state": {**folders, "runs": {"files": state_files(t), "bytes": 0}},
            "tables": {"waveforms": {"files": t, "bytes": 0}},
        }
        for t in range(0, end + 1, 10)
    ]


CHECKED = {
    "exactly_once": True,
    "waveforms": {"waveforms": 3},
    "hostile": {},
    "freshness": [[70, 1.0], [80, 2.0], [170, 2.0], [175, 3.0]],
}


def test_growth_after_the_warmup_compares_the_first_and_last_windows(tmp_path):
    options = SoakOptions(minutes=3)
    flat = summary(options, _samples(lambda t: 200.0 if t >= 60 else 100.0, lambda t: 50), CHECKED)
    assert flat["growth_after_warmup"] == {"follow_task": 0.0, "scheduler": 0.0}  # the warm-up's rise is not growth
    assert flat["state_bounded"] and flat["exactly_once"]
    assert flat["freshness_p95_s"] == {"first_window": 2.0, "last_window": 3.0} and flat["freshness_ratio"] == 1.5
    assert all(met for _, met, _ in goals(flat)[:3]) and goals(flat)[3][1] is False

    leaking = summary(options, _samples(lambda t: 100.0 + t, lambda t: 10 * t), CHECKED)
    assert leaking["growth_after_warmup"]["follow_task"] == round(
        250 / 190 - 1, 3
    )  # medians of the windows 60-120 s and 120-180 s
    assert not leaking["state_bounded"], leaking["state_files_grew"]
    assert [met for _, met, _ in goals(leaking)][1:3] == [False, False]


def test_the_last_freshness_window_ends_with_the_sending_not_with_the_drain_after_it():
    drained = summary(SoakOptions(minutes=3), _samples(lambda t: 100.0, lambda t: 50, end=300), CHECKED)
    assert drained["windows_s"]["end"] == 300  # memory and files: up to the last sample
    assert drained["freshness_p95_s"] == {"first_window": 2.0, "last_window": 3.0}, drained["freshness_p95_s"]


def test_the_state_pruned_at_a_cap_is_bounded():
    capped = summary(SoakOptions(minutes=3), _samples(lambda t: 100.0, lambda t: min(10 * t, 1000)), CHECKED)
    assert capped["state_files_grew"] == {"first_window": 400, "last_window": 0} and capped["state_bounded"]


def test_the_page_lists_every_role_and_a_chart_failure_loses_nothing(tmp_path, monkeypatch):
    from wavepipe.bench import soak

    result = {
        **summary(SoakOptions(minutes=3), _samples(lambda t: 100.0, lambda t: 5), CHECKED),
        "options": {"command": "wavepipe bench --soak --minutes 3"},
        "minutes": 3.0,
        "started": "x",
        "maintenance": {"dag_run_id": "manual__1", "triggered_at_s": 90.0, "state": "success", "seconds": 40.0},
    }
    monkeypatch.setattr(soak, "chart", lambda r, p: 1 / 0)
    paths = save(result, tmp_path)
    assert [p.name for p in paths] == ["soak.json", "soak.md"]
    page = paths[-1].read_text()
    assert "| follow_task | 100.0 | 100.0 | 0.0 |" in page and "| state `runs` | 5 -> 5 |" in page
    assert "| 1 | 2 | 1.5 | 2.0 |" in page  # minute 1: two waveforms
    assert "run manual__1, triggered 90 s into the soak: success in 40 s." in page


@pytest.mark.parametrize("minutes", ["0.5", "-3", "nan", "inf"])
def test_a_soak_shorter_than_a_minute_endless_or_not_a_number_is_refused_before_anything_starts(
    minutes, tmp_path, capsys
):
    from wavepipe.cli import main

    assert main(["--home", str(tmp_path), "bench", "--soak", "--minutes", minutes]) == 2
    assert f"--minutes must be at least 1 and finite, got {float(minutes)}" in capsys.readouterr().err
    assert not (tmp_path / "bench").exists()


def test_the_files_under_a_folder_are_counted_while_its_folders_are_removed_and_made(tmp_path):
    """The sampler walks the run state while runs prune their folders: a folder removed under the
    walk is left out, never an error that stops the soak (it stopped one, 20 minutes in)."""
    import shutil
    import threading

    from wavepipe.bench.soak import files_under

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "plan.json").write_bytes(b"12345")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for i in range(20):
                (tmp_path / f"run_{i}" / "steps").mkdir(parents=True, exist_ok=True)
                (tmp_path / f"run_{i}" / "steps" / "x.json").write_bytes(b"x")
            for i in range(20):
                shutil.rmtree(tmp_path / f"run_{i}", ignore_errors=True)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        counts = [files_under(tmp_path) for _ in range(300)]
    finally:
        stop.set()
        churner.join()
    assert all(1 <= c["files"] <= 21 and c["bytes"] >= 5 for c in counts), counts[:5]
    assert files_under(tmp_path) == {"files": 1, "bytes": 5}
    assert files_under(tmp_path / "missing") == {"files": 0, "bytes": 0}
