"""The README's layout table matches the tree: every top-level folder has its row, every row names
a folder that exists, and each "imported as" name resolves to that very folder."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.repository  # the repository's own files, not the installed package

ROOT = Path(__file__).resolve().parents[2]


def _table() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`([\w/]+)/`", cells[0]) if cells else None
        if found:
            rows[found.group(1)] = cells[-1].strip("`") if len(cells) >= 3 else ""
    return rows


def test_every_top_level_folder_has_a_row_and_every_row_a_folder():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {path.split("/", 1)[0] for path in tracked.splitlines() if "/" in path and not path.startswith(".")}
    rows = _table()
    assert folders - set(rows) == set(), "top-level folders missing from the README's layout table"
    assert [row for row in rows if not (ROOT / row).is_dir()] == []


def test_each_import_name_is_the_folder_it_names():
    for folder, module in _table().items():
        if not module:
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.submodule_search_locations, f"{module} does not import"
        where = {Path(p).resolve() for p in spec.submodule_search_locations}
        assert (ROOT / folder).resolve() in where, f"{module} lives in {where}, not {folder}/"
