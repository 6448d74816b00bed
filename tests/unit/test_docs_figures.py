"""The benchmark figures in README.md and docs/ are those of the results files they name
(docs/benchmarks/*.json), and a paragraph about the benchmarks quotes none without its key
(``wavepipe.bench.figures`` says how a figure names its key, or is marked as history)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import pytest

from wavepipe.bench import figures
from wavepipe.bench.results import figures as results_figures

pytestmark = pytest.mark.repository  # the repository's own files, not the installed package

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "docs" / "benchmarks"
PAGES = figures.pages(ROOT)
#: At least this many checked figures per page: fewer means the check stopped finding them.
AT_LEAST = {"README.md": 5, "docs/benchmarks/README.md": 70, "docs/deployment.md": 8, "docs/operations.md": 6}


@cache
def _json(stem: str) -> dict:
    return json.loads((BENCH / f"{stem}.json").read_text())


load = figures.loader(BENCH)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _benchmark_section(readme: str) -> str:
    start = readme.index("\n## Benchmark\n")
    return readme[start : readme.index("\n## ", start + 1)]


def test_every_quoted_figure_is_the_one_in_its_results_file():
    wrong = {_name(p): figures.disagreements(p.read_text(), load) for p in PAGES}
    assert not {k: v for k, v in wrong.items() if v}, "figures that disagree with docs/benchmarks/*.json"


def test_a_paragraph_about_the_benchmarks_quotes_no_figure_without_its_key():
    found = {}
    for page in PAGES:
        text = page.read_text()
        found[_name(page)] = figures.untagged(text, whole=page.parent == BENCH)
        if page == ROOT / "README.md":
            found[_name(page)] += figures.untagged(_benchmark_section(text), whole=True)
    assert not {k: v for k, v in found.items() if v}, "tag each with its results key, or mark it as history"


def test_the_check_finds_its_figures_in_every_page_and_every_results_file():
    quoted = {_name(p): figures.quoted(p.read_text()) for p in PAGES}
    counts = {name: len(quoted[name]) for name in AT_LEAST}
    assert all(counts[name] >= n for name, n in AT_LEAST.items()), counts
    assert len(figures.quoted(_benchmark_section((ROOT / "README.md").read_text()))) >= 4
    cited = {m["stem"] for found in quoted.values() for m in found}
    assert cited == {p.stem for p in BENCH.glob("*.json")}, "every results file has a figure checked"


def test_a_figure_that_differs_from_its_results_is_rejected_either_way():
    text = (ROOT / "README.md").read_text()
    first = figures.quoted(_benchmark_section(text))[0]
    shown = first["number"]
    digits = len(shown.partition(".")[2])
    wrong = first[0].replace(shown, f"{float(shown) + 1:.{digits}f}", 1)
    problems = figures.disagreements(text.replace(first[0], wrong), load)
    assert problems and len(problems) == text.count(first[0]) and all(wrong in p for p in problems)
    # the results change and the docs do not
    changed = copy.deepcopy(_json("results"))
    for m in changed["measurements"]:
        m["wall_s"] *= 1.1
        m["stages"] = {k: v * 1.1 for k, v in m["stages"].items()}
    stale = figures.disagreements(text, lambda stem: results_figures(changed) if stem == "results" else _json(stem))
    assert any("wall_s" in p for p in stale)
    # a key that names nothing
    assert "no such figure" in figures.disagreements("took 1.0 s<!-- results: wavepipe large x9 wall_s -->", load)[0]


def test_a_refresh_rewrites_every_tagged_figure_from_new_results_and_leaves_history_alone():
    text = (ROOT / "README.md").read_text()
    changed = copy.deepcopy(_json("results"))
    for m in changed["measurements"]:
        m["wall_s"] *= 1.37
    new_load = lambda stem: results_figures(changed) if stem == "results" else _json(stem)  # noqa: E731
    assert figures.disagreements(text, new_load)
    history = "<!-- history: at 4b6e325 -->14.9 s<!-- results: wavepipe large x1 wall_s --><!-- /history -->"
    refreshed = figures.refreshed(text + history, new_load)
    assert figures.disagreements(refreshed, new_load) == [] and refreshed.endswith(history)
    assert figures.refreshed(text, load) == text  # the committed pages agree with the committed results


def test_an_untagged_figure_is_found_unless_it_is_history_or_a_goal():
    readme = (ROOT / "README.md").read_text()
    section = _benchmark_section(readme)
    assert figures.untagged(section + "\nThe large run took 12.3 s and 1.5x the ceiling.\n", whole=True) == [
        "'12.3 s' in: The large run took 12.3 s and 1.5x the ceiling....",
        "'1.5x' in: The large run took 12.3 s and 1.5x the ceiling....",
    ]
    linked = "Measured ([benchmarks/results.md](benchmarks/results.md)): 3.2 s.\n\nElsewhere a 30 s timeout."
    assert figures.untagged(linked) == [
        "'3.2 s' in: Measured ([benchmarks/results.md](benchmarks/results.md)): 3.2 s...."
    ]
    assert not figures.untagged(
        "See benchmarks/: <!-- history: at abc1234 -->12.3 s then<!-- /history -->, goal 1.5 s."
    )
    assert not figures.untagged("See benchmarks/: `--seconds 90 s` in code.")
    with pytest.raises(ValueError, match="not closed"):
        figures.untagged("See benchmarks/: <!-- history: at abc1234 -->12.3 s then, and the rest of the page.")


def test_keys_pick_one_value():
    doc = {"rows": [{"partitions": 2, "readers": 1, "mb_s": 218.2}, {"partitions": 2, "readers": 2, "mb_s": 313.0}]}
    assert figures.pick(doc, "rows partitions=2,readers=2 mb_s") == 313.0
    assert figures.pick(doc, "rows -1 mb_s / rows 0 mb_s") == pytest.approx(313.0 / 218.2)
    with pytest.raises(KeyError, match="matches 2 entries"):
        figures.pick(doc, "rows partitions=2 mb_s")
    flat = {"wavepipe large x4 stage publish: write": 28.6, "wavepipe large x4 stage plan": 0.1}
    assert figures.pick(flat, "wavepipe large x4 stage publish") == 28.6
