"""Table maintenance's pure parts: what a user types is refused before Spark starts, and a
table's status is read from its log and folder."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from wavepipe import maintenance
from wavepipe.cli import main
from wavepipe.contracts.config import load_settings
from wavepipe.contracts.errors import EXIT_USAGE, UsageError


def test_tables_days_and_retention_are_checked():
    assert maintenance.pick_tables(None) == ["waveforms", "quarantine", "dead_letter", "qc"]
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
        (["table", "optimize", "--dry-run", "--retention-hours", "2"], "--dry-run --retention-hours 2: not an option"),
        (["table", "optimize", "--table", "waveform"], "did you mean 'waveforms'"),
        (["table", "optimize", "--since", "2026-02-30"], "must be a date"),
        (["table", "optimize", "--since", "2026-02-01", "--days", "1"], "not both"),
        (["table", "vacuum", "--retention-hours", "-3"], "0 or more hours"),
        (["table", "vacuum", "--retention-hours", "nan"], "0 or more hours"),
        (["table", "repair", "--zorder"], "--zorder: not an option of `table repair`"),
        (["table", "repair", "--table", "dead_leter"], "did you mean 'dead_letter'"),
        (["table", "optimize", "--dry-run"], "--dry-run: not an option of `table optimize`"),
    ],
)
def test_the_cli_refuses_before_anything_runs(tmp_path, capsys, args, message):
    assert main(["--home", str(tmp_path), *args]) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tables").exists()  # nothing was started or written


def _append(table, rows: dict, partition_by=("date",)) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(table), pa.table(rows), mode="append", partition_by=list(partition_by))


def legacy_log(table) -> None:
    """Rewrite the table's first commit as the Spark Connect engine logged string columns up to 77ad3ff."""
    first = Path(table) / "_delta_log" / f"{0:020d}.json"
    first.write_text(
        first.read_text().replace('\\"type\\":\\"string\\"', '\\"type\\":\\"string collate UTF8_BINARY\\"')
    )


def test_status_reads_the_log_and_the_folder(tmp_path, capsys):
    from deltalake import DeltaTable

    settings = load_settings(home=tmp_path)
    table = settings.output_table
    for i in range(3):
        _append(table, {"waveform_id": [f"w{i}", f"v{i}"], "source": ["a", "b"], "date": ["2026-11-20"] * 2})
    _append(table, {"waveform_id": ["x b"], "source": ["b c"], "date": ["2026-11-21"]})
    before = maintenance.table_status("waveforms", table)
    assert (before.version, before.rows, before.files, before.partition_columns) == (3, 7, 4, ["date"])
    assert (before.partitions, before.files_per_partition_max, before.unreferenced_files) == (2, 3, 0)
    assert before.partitions_to_compact == 1
    assert before.bytes == sum(f.stat().st_size for f in Path(table).rglob("*.parquet"))
    assert before.last_optimize is None and before.note is None
    # a compaction: three files become one; the old ones stay on disk until a vacuum
    DeltaTable(str(table)).optimize.compact()
    after = maintenance.table_status("waveforms", table)
    assert (after.version, after.rows, after.files) == (4, 7, 2)
    assert (after.files_per_partition_max, after.unreferenced_files) == (1, 3)
    assert after.last_optimize is not None and after.last_vacuum is None

    assert main(["--home", str(tmp_path), "table", "status"]) == 0
    out = capsys.readouterr().out
    assert "waveforms" in out and f"{after.last_optimize} / never" in out
    assert "quarantine   no table yet" in out


def test_an_operation_older_than_the_history_read_is_not_called_never(tmp_path, monkeypatch):
    from wavepipe.spark_apps import tables

    settings = load_settings(home=tmp_path)
    for i in range(3):
        _append(settings.output_table, {"waveform_id": [f"w{i}"], "source": ["a"], "date": ["2026-11-20"]})
    monkeypatch.setattr(tables, "HISTORY_COMMITS", 2)
    status = maintenance.table_status("waveforms", settings.output_table)
    assert status.last_optimize == status.last_vacuum == "not in the last 2 commits"


def test_status_says_what_needs_a_repair(tmp_path, capsys):
    settings = load_settings(home=tmp_path)
    _append(settings.output_table, {"waveform_id": ["w"], "source": ["a"], "date": ["2026-11-20"]}, ("source", "date"))
    old = maintenance.table_status("waveforms", settings.output_table)
    assert old.partition_columns == ["source", "date"] and "`wavepipe table repair` lays it out by date" in old.note
    _append(settings.quarantine_table, {"waveform_id": ["w"], "reason": ["incomplete"]}, ())
    legacy_log(settings.quarantine_table)
    broken = maintenance.table_status("quarantine", settings.quarantine_table)
    assert broken.version is None and "2 column type(s) the Delta protocol does not define" in broken.note
    assert main(["--home", str(tmp_path), "table", "status"]) == 0
    out = capsys.readouterr().out
    assert "quarantine   delta-rs, Polars and Trino cannot open it" in out and "run `wavepipe table repair`" in out


def test_optimize_rewrites_only_partitions_of_several_files_and_says_why_not(tmp_path, monkeypatch):
    """What needs compaction is read from the log: partitions holding more than one file, any day
    (``days`` limits them and names the older ones left); with none, no Spark session starts."""
    from wavepipe.spark_apps.tables import delta_log

    settings = load_settings(home=tmp_path)
    table = settings.output_table
    for day in ("2026-11-01", "2026-11-01", "2026-11-20", "2026-11-24", "2026-11-24"):
        _append(table, {"waveform_id": [day], "source": ["a'b"], "date": [day]})
    state = delta_log(table)
    assert maintenance.compaction_plan(state) == (["date=2026-11-01", "date=2026-11-24"], [])
    assert maintenance.compaction_plan(state, date(2026, 11, 23)) == (["date=2026-11-24"], ["date=2026-11-01"])
    assert maintenance.partition_predicate(["date=2026-11-01", "source=a'b/date=2026-11-24"]) == (
        "(`date` = '2026-11-01') OR (`source` = 'a''b' AND `date` = '2026-11-24')"
    )
    assert maintenance.partition_predicate([""]) == ""  # an unpartitioned table: the whole of it

    def no_spark(*args, **kwargs):
        raise AssertionError("a table with nothing to compact started Spark")

    monkeypatch.setattr(maintenance, "_compact", no_spark)
    (result,) = maintenance.optimize(settings, tables=["waveforms"], since=date(2026, 11, 25))
    assert result["skipped"].startswith("3 partition(s), 5 file(s): the 2 partition(s) with several files")
    assert "date=2026-11-01" in result["skipped"] and "no day limit" in result["skipped"]
    _append(settings.quarantine_table, {"waveform_id": ["q"], "reason": ["r"]}, partition_by=())
    (result,) = maintenance.optimize(settings, tables=["quarantine"])
    assert result["skipped"] == "1 partition(s), 1 file(s): each holds one file, nothing to compact"


def test_a_run_compacts_only_partitions_crowded_with_small_files(tmp_path):
    """After a commit, a partition holding ``compact_after_files`` small files is rewritten into
    one (delta-rs, rows unchanged), one with fewer is left, and busy tables are not waited for."""
    import fcntl

    from deltalake import DeltaTable

    from wavepipe.run_store import RunStore
    from wavepipe.spark_apps.tables import delta_log
    from wavepipe.state import StepBusyError

    settings = load_settings(home=tmp_path).replace(compact_after_files=3)
    table = settings.output_table
    for i in range(4):
        _append(table, {"waveform_id": [f"w{i}"], "source": ["a"], "date": ["2026-11-29"]})
    _append(table, {"waveform_id": ["old"], "source": ["a"], "date": ["2026-11-28"]})
    _append(table, {"waveform_id": ["old2"], "source": ["a"], "date": ["2026-11-28"]})
    state = delta_log(table)
    assert maintenance.small_files_per_partition(state) == {"date=2026-11-29": 4, "date=2026-11-28": 2}
    assert maintenance.small_files_per_partition(state, small_bytes=1) == {}
    assert maintenance.crowded_partitions(state, 3) == ["date=2026-11-29"]
    assert maintenance.crowded_partitions(state, 0) == []  # off
    rows = sorted(DeltaTable(str(table)).to_pyarrow_table()["waveform_id"].to_pylist())

    lock = RunStore(settings).state.root / "tables/.reassemble.lock"  # as another process holds it
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held, pytest.raises(StepBusyError, match="a run's compaction"):
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        maintenance.compact_small(settings, ["waveforms"])
    assert delta_log(table).version == state.version  # nothing waited for, nothing written

    (done,) = maintenance.compact_small(settings, ["waveforms", "qc"])  # no qc table yet: nothing
    assert done["table"] == "waveforms" and done["partition"] == "date=2026-11-29"
    assert (done["files_removed"], done["files_added"], done["version"]) == (4, 1, state.version + 1)
    after = DeltaTable(str(table))
    assert sorted(after.to_pyarrow_table()["waveform_id"].to_pylist()) == rows
    assert after.history(1)[0]["operation"] == "OPTIMIZE"
    assert maintenance.files_per_partition(delta_log(table)) == {"date=2026-11-29": 1, "date=2026-11-28": 2}
    assert maintenance.compact_small(settings, ["waveforms"]) == []  # nothing crowded any more
    assert maintenance.compact_small(settings.replace(compact_after_files=0), ["waveforms"]) == []


def test_the_tables_a_run_wrote_to_are_named_from_its_outcome():
    outcome = {"new": 0, "rewritten": 0, "quarantined": 0, "dead_letter_records": 0}
    assert maintenance.tables_written(outcome) == []
    assert maintenance.tables_written({**outcome, "new": 2}) == ["waveforms", "qc"]
    assert maintenance.tables_written({**outcome, "rewritten": 1, "dead_letter_records": 3}) == [
        "waveforms",
        "dead_letter",
        "qc",
    ]
    assert maintenance.tables_written({**outcome, "quarantined": 1, "replaced": None}) == ["quarantine"]
