"""The committed benchmark figures were measured at the code they describe: each results file of
``wavepipe bench`` and ``wavepipe bench --trickle`` names the commit it ran at, and no file of the
data path has changed since. A change to the data path re-runs both before it lands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from wavepipe.bench.measured_at import DATA_PATH, UNCOMMITTED, checkout_commit, stale_since

pytestmark = pytest.mark.repository  # the repository's own files and history, not the installed package

ROOT = Path(__file__).resolve().parents[2]
RERUN = {"results": "wavepipe bench", "trickle": "wavepipe bench --trickle --seconds 90"}


@pytest.mark.parametrize("stem", sorted(RERUN))
def test_results_measured_at_the_data_path_of_head(stem: str):
    commit = json.loads((ROOT / "docs" / "benchmarks" / f"{stem}.json").read_text())["machine"]["wavepipe_commit"]
    try:
        changed = stale_since(ROOT, commit)
    except ValueError as exc:
        pytest.fail(f"docs/benchmarks/{stem}.json: {exc}; re-run `{RERUN[stem]}` at a commit")
    assert not changed, (
        f"docs/benchmarks/{stem}.json was measured at {commit}; the data path changed since: "
        f"{', '.join(changed)}. Re-run `{RERUN[stem]}`, then `wavepipe bench --refresh-docs`"
    )


def test_every_data_path_entry_exists():
    missing = [p for p in DATA_PATH if not (ROOT / p).exists()]
    assert not missing, f"DATA_PATH names files that are not there (moved or renamed?): {missing}"


def _repo(tmp_path: Path) -> Path:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    (tmp_path / "consumers").mkdir()
    (tmp_path / "consumers" / "reader.py").write_text("a = 1\n")
    (tmp_path / "README.md").write_text("x\n")
    git("add", ".")
    git("commit", "-qm", "one")
    return tmp_path


def test_a_data_path_change_after_the_measured_commit_is_named(tmp_path: Path):
    repo = _repo(tmp_path)
    measured = checkout_commit(repo)
    assert measured and not measured.endswith(UNCOMMITTED)
    (repo / "README.md").write_text("y\n")  # outside the data path: still fresh
    assert checkout_commit(repo) == measured
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "docs"], check=True)
    assert stale_since(repo, measured) == []
    (repo / "consumers" / "reader.py").write_text("a = 2\n")
    assert checkout_commit(repo).endswith(UNCOMMITTED)  # measured with uncommitted data-path changes
    with pytest.raises(ValueError, match="uncommitted"):
        stale_since(repo, checkout_commit(repo))
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "reader"], check=True)
    assert stale_since(repo, measured) == ["consumers/reader.py"]
    with pytest.raises(ValueError, match="not in this checkout"):
        stale_since(repo, "0123456789ab")
