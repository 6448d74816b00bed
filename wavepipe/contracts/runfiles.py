"""Where a run's files live and how its step records are named: the one place that knows.

In the run state (``<home>``, or ``state_uri``: a shared folder or an object store, see
``wavepipe.state``):

* ``runs/<run_id>/plan.json``: the frozen plan; ``runs/<run_id>/<step>.json``: each step's record
  (``Step``; the consume, reassemble and validate records are typed in ``wavepipe.contracts.steps``),
  written whole once the step is done; ``runs/<run_id>/.<name>.lock``: the locks (OS locks, or
  leases on an object store) that keep two processes out of one step.
* ``groups/<group>/``: the group's active run (``active.json``), its last ranges and idle runs.
* ``reports/<run_id>.json``: each run's report (also under ``<home>`` beside its page).
* ``reports/<run_id>.html`` and the Data Docs its validation built: the run's pages, which
  Airflow's API server serves from here (``wavepipe.pages``, which keeps the last runs').
* ``dead-letters/<topic>.json``: the dead letters of a topic published so far.

Under ``<home>``:

* ``staging/<run_id>/`` (or ``<staging_uri>/<run_id>/`` on an object store): what the readers
  staged (``chunks/``, ``dead_letter/``, ``digests/``, one Parquet file per offset range) and the
  candidate tables (``candidate/``); removed after commit.
* ``reports/<run_id>.json`` and ``.html``, ``reports/<run_id>/waveforms.png`` and
  ``reports/validation_history.jsonl``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from wavepipe.contracts.config import Settings
from wavepipe.contracts.plan import OffsetRange


class Step:
    """The names of a run's step records (``RunStore.save_step``/``load_step``) and step locks."""

    #: the whole run (``run_once``, the plan step and the report take it)
    RUN = "run"
    REASSEMBLE = "reassemble"
    VALIDATE = "validate"
    PUBLISH = "publish"
    REPORT = "report"
    #: seconds each step took, added to the report
    TIMINGS = "timings"
    #: the Spark jobs each engine step started, as the engine listed them
    SPARK_JOBS = "spark_jobs"

    @staticmethod
    def consume(rng: OffsetRange) -> str:
        """The record of reading one offset range."""
        return f"consume-{rng.topic}-{rng.partition}"

    @staticmethod
    def consume_lock(partition: int) -> str:
        """The lock one partition's reader holds."""
        return f"consume-{partition}"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` so that readers see the old file or the new one, never a part (fsync + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never a part (fsync + rename)."""
    write_bytes_atomic(path, json_bytes(data))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the new one, never a part (fsync + rename)."""
    write_bytes_atomic(path, text.encode())


def read_json(path: Path) -> Any:
    with path.open() as fh:
        return json.load(fh)


def read_json_or(path: Path, default: Any) -> Any:
    """``path``'s JSON, or ``default`` where there is none to read: no file, or one that is not
    JSON (state a killed process left behind is as good as none)."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return default


def json_path(settings: Settings, run_id: str) -> Path:
    return settings.reports_dir / f"{run_id}.json"


def html_path(settings: Settings, run_id: str) -> Path:
    """The run's page (its JSON twin is ``json_path``)."""
    return settings.reports_dir / f"{run_id}.html"


def plot_path(settings: Settings, run_id: str) -> Path:
    return settings.reports_dir / run_id / "waveforms.png"


def history_path(settings: Settings) -> Path:
    return settings.reports_dir / "validation_history.jsonl"
