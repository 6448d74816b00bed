"""`wavepipe airflow up`'s readiness: what it waits for before it says Airflow is ready."""

from __future__ import annotations


def test_up_waits_for_each_dag_file_until_the_dag_processor_has_parsed_it(tmp_path):
    """``up`` is ready only once the metadata DB holds a DAG of each file it serves (before, the
    API answered 404 to an unpause right after it); a stale DAG does not count, and a DB that
    cannot say is not waited for."""
    import sqlite3

    from wavepipe.contracts.config import load_settings
    from wavepipe.local import airflow as local

    settings = load_settings(home=tmp_path)
    assert local.unparsed_dag_files(settings) == []  # no DB: nothing to wait for
    settings.airflow_home.mkdir(parents=True)
    files = local.dag_files()
    assert "wavepipe_ingest.py" in files and "__init__.py" not in files
    with sqlite3.connect(settings.airflow_home / "airflow.db") as db:
        db.execute("CREATE TABLE dag (dag_id TEXT, relative_fileloc TEXT, is_stale BOOLEAN)")
        db.executemany("INSERT INTO dag VALUES (?, ?, ?)", [(f[:-3], f, False) for f in files[1:]])
        db.execute("INSERT INTO dag VALUES ('gone', ?, ?)", (files[0], True))
    assert local.unparsed_dag_files(settings) == [files[0]]
    with sqlite3.connect(settings.airflow_home / "airflow.db") as db:
        db.execute("INSERT INTO dag VALUES (?, ?, ?)", (files[0][:-3], files[0], False))
    assert local.unparsed_dag_files(settings) == []
