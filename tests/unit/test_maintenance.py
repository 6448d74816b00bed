"""Table maintenance's pure parts: what a user types is refused before Spark starts, and a
table's status is read from its log and folder."""

from __future__ import annotations

import json
from datetime import date

import pytest

from wavepipe import maintenance
from wavepipe.cli import main
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.errors import EXIT_USAGE, UsageError


def test_tables_days_and_retention_are_checked():
    assert maintenance.pick_tables(None) == ["waveforms", "quarantine", "dead_letter"]
    assert maintenance.pick_tables(["dead_letter", "waveforms"]) == ["waveforms", "dead_letter"]
    with pytest.raises(UsageError, match="no table 'waveform'; did you mean 'waveforms'"):
        maintenance.pick_tables(["waveform"])
    assert maintenance.table_list(" waveforms, ,quarantine ") == ["waveforms", "quarantine"]
    assert maintenance.table_list("") is None and maintenance.table_list(" , ") is None
    with pytest.raises(UsageError):
        maintenance.table_list(3)
    today = date(2026, 11, 25)
    assert maintenance.since_date(days=2, today=today) == date(2026, 11, 23)
    assert maintenance.since_date(days=0, today=today) == today
    assert maintenance.since_date("2026-11-01") == date(2026, 11, 1)
    assert maintenance.since_date() is None
    for since, days, message in (
        ("2026-13-01", None, "must be a date"),
        ("yesterday", None, "must be a date"),
        (None, -1, "0 \\(today\\) or more"),
        (None, True, "0 \\(today\\) or more"),
        ("2026-11-01", 2, "not both"),
    ):
        with pytest.raises(UsageError, match=message):
            maintenance.since_date(since, days)
    assert maintenance.check_retention(0) == 0.0 and maintenance.check_retention(24) == 24.0
    for bad in (-1, float("nan"), float("inf"), True, "24"):
        with pytest.raises(UsageError, match="0 or more hours"):
            maintenance.check_retention(bad)


def test_a_setting_out_of_range_is_refused():
    with pytest.raises(ValueError, match="table_retention_hours"):
        load_settings(table_retention_hours=-1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["table", "vacuum", "--zorder"], "--zorder: not an option of `table vacuum`"),
        (["table", "optimize", "--dry-run", "--retention-hours", "2"], "--retention-hours, --dry-run: not an option"),
        (["table", "optimize", "--table", "waveform"], "did you mean 'waveforms'"),
        (["table", "optimize", "--since", "2026-02-30"], "must be a date"),
        (["table", "optimize", "--since", "2026-02-01", "--days", "1"], "not both"),
        (["table", "vacuum", "--retention-hours", "-3"], "0 or more hours"),
        (["table", "vacuum", "--retention-hours", "nan"], "0 or more hours"),
    ],
)
def test_the_cli_refuses_before_anything_runs(tmp_path, capsys, args, message):
    assert main(["--home", str(tmp_path), *args]) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tables").exists()  # nothing was started or written


def _commit(table, version, *actions):
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _add(path, rows, size):
    return {"add": {"path": path, "size": size, "stats": json.dumps({"numRecords": rows})}}


def _file(table, path, size):
    full = table / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(b"x" * size)


def test_status_reads_the_log_and_the_folder(tmp_path, capsys):
    settings = load_settings(home=tmp_path)
    table = settings.output_table
    small = [f"source=a/date=2026-11-20/part-{i}.parquet" for i in range(3)]
    for i, path in enumerate(small):
        _commit(table, i, _add(path, 2, 100), {"commitInfo": {"operation": "WRITE", "timestamp": 1_000 + i}})
        _file(table, path, 100)
    # a space in a source is URL-encoded in the log, not on disk
    _commit(table, 3, _add("source=b%20c/date=2026-11-20/part-9.parquet", 5, 300))
    _file(table, "source=b c/date=2026-11-20/part-9.parquet", 300)
    before = maintenance.table_status("waveforms", table)
    assert (before.version, before.rows, before.files, before.bytes) == (3, 11, 4, 600)
    assert (before.partitions, before.files_per_partition_max, before.unreferenced_files) == (2, 3, 0)
    assert before.last_optimize is None
    # a compaction: three files become one; the old ones stay on disk until a vacuum
    merged = "source=a/date=2026-11-20/part-m.parquet"
    _commit(
        table,
        4,
        *({"remove": {"path": p, "dataChange": False}} for p in small),
        _add(merged, 6, 250),
        {"commitInfo": {"operation": "OPTIMIZE", "timestamp": 1_795_000_000_000}},
    )
    _file(table, merged, 250)
    _file(table, "_delta_log/00000000000000000004.checkpoint.parquet", 10)  # not a data file
    after = maintenance.table_status("waveforms", table)
    assert (after.version, after.rows, after.files, after.bytes) == (4, 11, 2, 550)
    assert (after.files_per_partition_max, after.unreferenced_files, after.unreferenced_bytes) == (1, 3, 300)
    assert after.last_optimize == "2026-11-18T11:06:40+00:00"

    assert main(["--home", str(tmp_path), "table", "status"]) == 0
    out = capsys.readouterr().out
    assert "waveforms" in out and "2026-11-18T11:06:40+00:00 / never" in out
    assert "quarantine   no table yet" in out
