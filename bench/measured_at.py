"""Which code a results file measured: the commit it names, and whether the data path changed since.

A figure is only true at the code it measured. ``wavepipe bench`` and ``wavepipe bench --trickle``
record the checkout's commit in their results (``machine.wavepipe_commit``), marked ``+changes``
when a file of the data path had uncommitted changes then; ``stale_since`` lists the data path's
files changed after that commit, which the unit tier's check turns into a failure.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

#: The files whose changes can move a ``wavepipe bench`` or ``--trickle`` figure: everything a run
#: executes from its plan to its commit (folders end in ``/``). The producer, rewinds, the CLI and
#: the local servers are outside it: they make the workload or drive the run, they are not measured.
DATA_PATH = (
    "spark_apps/",
    "consumers/boundaries.py",
    "consumers/committer.py",
    "consumers/kafka_admin.py",
    "consumers/lag.py",
    "consumers/planner.py",
    "consumers/reader.py",
    "consumers/staging.py",
    "wavepipe/contracts/",
    "wavepipe/delta_files.py",
    "wavepipe/delta_protocol.py",
    "wavepipe/delta_txn.py",
    "wavepipe/engine_client.py",
    "wavepipe/expectations.py",
    "wavepipe/faults.py",
    "wavepipe/follow.py",
    "wavepipe/pages.py",
    "wavepipe/local/engine_server.py",  # each engine step makes sure the home's engine is up
    "wavepipe/maintenance.py",  # a run's commit compacts the small files of its tables
    "wavepipe/pipeline.py",
    "wavepipe/plots.py",
    "wavepipe/processes.py",
    "wavepipe/report_html.py",
    "wavepipe/run_store.py",
    "wavepipe/spark_launch.py",
    "wavepipe/state.py",
    "wavepipe/storage.py",
)

#: What a recorded commit carries when the data path had uncommitted changes as it was measured.
UNCOMMITTED = "+changes"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


def checkout_commit(root: Path | None) -> str:
    """The commit of checkout ``root`` (short), with ``UNCOMMITTED`` when the data path has
    changes not committed; "" without a checkout or git."""
    if root is None or not shutil.which("git"):
        return ""
    head = _git(root, "rev-parse", "--short=12", "HEAD").stdout.strip()
    if not head:
        return ""
    changed = _git(root, "status", "--porcelain", "--", *DATA_PATH).stdout.strip()
    return head + (UNCOMMITTED if changed else "")


def stale_since(root: Path, commit: str) -> list[str]:
    """The data path's files that changed between ``commit`` and the checkout's HEAD; raises
    ``ValueError`` (the reason in a line) when ``commit`` cannot be compared: uncommitted changes
    were measured, or the checkout does not hold it."""
    if not commit or commit.endswith(UNCOMMITTED):
        raise ValueError(f"measured at {commit or 'an unnamed commit'}: the data path had uncommitted changes")
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}").returncode:
        raise ValueError(f"commit {commit} is not in this checkout (a shallow clone?)")
    diff = _git(root, "diff", "--name-only", commit, "HEAD", "--", *DATA_PATH)
    if diff.returncode:
        raise ValueError(f"git diff from {commit} failed: {diff.stderr.strip()}")
    return diff.stdout.split()
