"""Benchmark figures quoted in the docs, and whether they agree with the results files.

A figure taken from a results file (``docs/benchmarks/<stem>.json``) is followed by a comment
naming it: ``14.9 s<!-- results: wavepipe large x1 wall_s -->``. For ``results`` the key is one
of :func:`wavepipe.bench.results.figures` (for another bench run's file, such as ``quality-cost``,
one of those or a path); for the other files it is a path of dict keys (or a
key's unique beginning) and list items (an index, or ``field=value,...`` picking the one item
that matches); ``A / B`` is the ratio of two keys. ``%`` quotes a share (x100), ``KB`` a value
in bytes, ``ms`` one in seconds if its key ends in ``_s``. Figures from other runs or commits
(the text says which) sit between ``<!-- history: ... -->`` and ``<!-- /history -->``; a goal
(``goal 1.5 s``) is a target, not a result. In a paragraph about the benchmarks every other
figure must be tagged."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path

NUMBER = r"[+-]?\d[\d,]*(?:\.\d+)?"
TAGGED = re.compile(rf"(?P<number>{NUMBER}) ?(?P<unit>ms|s|x|%|MB/s|KB)?\**<!-- (?P<stem>[\w-]+): (?P<key>[^>]*?) -->")
#: A timing, ratio, share or rate, as the benchmark pages quote them.
FIGURE = re.compile(rf"(?<![\w.]){NUMBER}(?: ?(?:ms|s|min)\b| ?MB/s|x\b|%)")
HISTORY = re.compile(r"<!-- history\b.*?-->.*?<!-- /history -->", re.S)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
#: Where a paragraph or list item starts: it is the unit a link to docs/benchmarks/ makes strict.
BLOCK = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )")
UNIT_SCALE = {"%": 100, "KB": 1e-3}


def without_history(text: str) -> str:
    """``text`` with its history spans cut out; an unclosed one is an error, not the rest of the page."""
    text = HISTORY.sub(" ", text)
    if "<!-- history" in text or "<!-- /history" in text:
        raise ValueError("a <!-- history --> span is not closed (or a close has no opening)")
    return text


def pick(node, key: str) -> float:
    """The number at ``key`` in a loaded results file (see the module's docstring)."""
    if " / " in key:
        a, b = key.split(" / ", 1)
        return pick(node, a) / pick(node, b)
    if isinstance(node, dict) and " " in key:  # a flat dict's key of several words
        whole = [v for k, v in node.items() if k == key] or [v for k, v in node.items() if k.startswith(key)]
        if whole:
            return float(_one(whole, key))
    for word in key.split():
        if isinstance(node, list):
            if "=" in word:
                want = dict(pair.split("=", 1) for pair in word.split(","))
                node = _one([x for x in node if all(str(x.get(k)) == v for k, v in want.items())], word)
            else:
                node = node[int(word)]
        else:
            node = node[word] if word in node else _one([v for k, v in node.items() if k.startswith(word)], word)
    return float(node)


def _one(found: list, word: str):
    if len(found) != 1:
        raise KeyError(f"{word!r} matches {len(found)} entries, not one")
    return found[0]


def quoted(text: str) -> list[re.Match]:
    """The tagged figures of a page (history spans excluded)."""
    return list(TAGGED.finditer(without_history(text)))


def disagreements(text: str, load: Callable[[str], object]) -> list[str]:
    """Each tagged figure that is not its key's value as shown (rounded to the digits it shows);
    ``load(stem)`` gives a results file, loaded."""
    out = []
    for m in quoted(text):
        shown, unit, key = m["number"].replace(",", ""), m["unit"] or "", m["key"]
        try:
            in_seconds = unit == "ms" and key.split()[-1].endswith("_s")
            value = pick(load(m["stem"]), key) * (1000 if in_seconds else UNIT_SCALE.get(unit, 1))
        except (KeyError, IndexError, TypeError, ValueError, OSError) as exc:
            out.append(f"{m[0]!r}: no such figure ({exc})")
            continue
        digits = len(shown.partition(".")[2])
        if abs(float(shown) - value) > 0.5 * 10**-digits + 1e-9:
            out.append(f"{m[0]!r}: the results say {value:.{digits}f}")
    return out


def untagged(text: str, whole: bool = False) -> list[str]:
    """Figures in paragraphs about the benchmarks (those linking to ``benchmarks/``; every one
    with ``whole``) that name no results key, are no goal and are outside history spans."""
    out = []
    for block in BLOCK.split(CODE.sub(" ", without_history(text))):
        if not (whole or "benchmarks/" in block):
            continue
        bare = TAGGED.sub(" ", block)
        out += [
            f"{m[0]!r} in: {block.strip()[:80]}..."
            for m in FIGURE.finditer(bare)
            if not re.search(r"\bgoals? (?:of |is |at most |within )?$", bare[: m.start()])
        ]
    return out


def refreshed(text: str, load: Callable[[str], object]) -> str:
    """``text`` with each tagged figure outside history spans rewritten to its key's value, at the
    digits it shows (a figure with no such key is left for ``disagreements`` to name)."""
    history = [m.span() for m in HISTORY.finditer(text)]

    def value_of(m: re.Match) -> str:
        if any(start <= m.start() < end for start, end in history):
            return m[0]
        shown, unit, key = m["number"].replace(",", ""), m["unit"] or "", m["key"]
        try:
            in_seconds = unit == "ms" and key.split()[-1].endswith("_s")
            value = pick(load(m["stem"]), key) * (1000 if in_seconds else UNIT_SCALE.get(unit, 1))
        except (KeyError, IndexError, TypeError, ValueError, OSError):
            return m[0]
        digits = len(shown.partition(".")[2])
        number = f"{value:{'+' if shown.startswith('+') else ''}{',' if ',' in m['number'] else ''}.{digits}f}"
        return m[0].replace(m["number"], number, 1)

    return TAGGED.sub(value_of, text)


def pages(root: Path) -> list[Path]:
    """The pages that quote benchmark figures: the README, docs/ and docs/benchmarks/README.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "docs" / "benchmarks" / "README.md"]


def loader(bench: Path) -> Callable[[str], object]:
    """``load(stem)`` for ``disagreements`` and ``refreshed``: the results file ``bench/<stem>.json``."""
    from wavepipe.bench.results import figures

    @functools.cache
    def load(stem: str):
        data = json.loads((bench / f"{stem}.json").read_text())
        if stem == "results":
            return figures(data)
        return {**data, **figures(data)} if "wavepipe_bench" in data else data  # a bench run: both ways

    return load


def refresh_pages(root: Path) -> list[Path]:
    """Rewrite the tagged figures of ``pages(root)`` from ``root/docs/benchmarks``; the pages changed.
    The words around a figure are the writer's: read the diff."""
    load, changed = loader(root / "docs" / "benchmarks"), []
    for page in pages(root):
        text = page.read_text()
        new = refreshed(text, load)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed
