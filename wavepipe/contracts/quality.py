"""Quality rules: which measured waveforms to flag, by source pattern (the setting ``quality_rules``).

A rule names a quality column of the row (``rows.QUALITY_NAMES``: a per channel ``qc_*`` list,
``gap_s`` or ``latency_s``) and a threshold: the row breaks it when any channel's value is
``above`` it or ``below`` it (a true/false column, ``qc_dead``: when any channel is true). A row
that breaks a rule carries the rule's name in its ``qc_flags``; it is published all the same, or,
for a rule whose ``action`` is ``quarantine``, put in the quarantine table instead. Neither ever
fails a run, nor holds back its commit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wavepipe.contracts.rows import QUALITY_FIELDS

#: The columns a rule may judge, and whether they are true/false.
_JUDGED = {f.name: f.type.value_type if hasattr(f.type, "value_type") else f.type for f in QUALITY_FIELDS}
_JUDGED.pop("qc_flags")
_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


@dataclass(frozen=True)
class QualityRule:
    """Flag a row of a source matching ``sources`` (``fnmatch``) whose ``metric`` is ``above`` or
    ``below`` a threshold on any channel (or true, for a true/false metric), with ``name``;
    ``quarantine``: and quarantine it instead of publishing it."""

    name: str
    metric: str
    above: float | None = None
    below: float | None = None
    sources: str = "*"
    quarantine: bool = False

    @property
    def boolean(self) -> bool:
        return str(_JUDGED[self.metric]) == "bool"

    def describe(self) -> str:
        if self.boolean:
            return f"{self.metric} on any channel"
        parts = [
            f"above {self.above:g}" if self.above is not None else "",
            f"below {self.below:g}" if self.below is not None else "",
        ]
        return f"{self.metric} {' or '.join(p for p in parts if p)}"

    def breaking(self, values: Sequence[Any]) -> list[int]:
        """The channels (their places) whose value in ``values`` (a row's per channel list of
        ``metric``) breaks the rule."""
        return [i for i, v in enumerate(values) if v is not None and self.broken_by(v)]

    def broken_by(self, value: Any) -> bool:
        """Whether one measured value breaks the rule (as ``spark_apps.quality.flags`` decides for
        a column: a boolean metric when true, else a value above ``above`` or below ``below``)."""
        if self.boolean:
            return bool(value)
        v = float(value)
        return (self.above is not None and v > self.above) or (self.below is not None and v < self.below)

    def explain(self, row: Mapping[str, Any]) -> str:
        """How ``row`` (a published row's columns: ``metric``, ``channel_names``) breaks the rule,
        naming its channels and values: a quarantine's detail."""
        value = row.get(self.metric)
        said = f"breaks quality rule {self.name} ({self.describe()})"
        if not isinstance(value, list):
            return f"{said}: {self.metric} {value:g}" if isinstance(value, int | float) else said
        names = row.get("channel_names") or []
        shown = [
            (names[i] if i < len(names) and names[i] else f"ch {i + 1}")
            + ("" if self.boolean else f" {float(value[i]):g}")
            for i in self.breaking(value)
        ]
        return f"{said}: {', '.join(shown[:12])}{' ...' if len(shown) > 12 else ''}"

    @property
    def reason(self) -> str:
        """The quarantine reason of a row this rule quarantines."""
        return f"qc_{self.name}"


#: What a rule does with a row that breaks it: flag it (published, the rule named in its
#: ``qc_flags``), or quarantine it (flagged, and in the quarantine table instead).
ACTIONS = ("flag", "quarantine")
#: What wavepipe flags unless ``quality_rules`` says otherwise (docs/quality.md).
DEFAULT_RULES: list[dict[str, Any]] = [
    {"name": "dead_channel", "metric": "qc_dead"},
    {"name": "clipped", "metric": "qc_clipped_share", "above": 0.01},
    {"name": "mostly_nan", "metric": "qc_nan_share", "above": 0.5},
    {"name": "gap", "metric": "gap_s", "above": 10.0},
    {"name": "overlap", "metric": "gap_s", "below": -1.0},
    {"name": "late", "metric": "latency_s", "above": 3600.0},
]


def parse_rules(entries: Sequence[Mapping[str, Any]]) -> tuple[QualityRule, ...]:
    """``entries`` (the setting's tables) as rules; a ``ValueError`` says which entry is wrong and why."""
    rules, names = [], set()
    for i, entry in enumerate(entries, 1):
        try:
            rule = _rule(entry)
        except ValueError as exc:
            raise ValueError(f"rule {i} ({dict(entry)!r}): {exc}") from None
        if rule.name in names:
            raise ValueError(f"rule {i}: the name {rule.name!r} is used twice")
        names.add(rule.name)
        rules.append(rule)
    return tuple(rules)


def _rule(entry: Mapping[str, Any]) -> QualityRule:
    if not isinstance(entry, Mapping):
        raise ValueError("must be a table with name, metric and above or below")
    unknown = set(entry) - {"name", "metric", "above", "below", "sources", "action"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}: a rule has name, metric, above, below, sources and action")
    name, metric = entry.get("name"), entry.get("metric")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("name must be 1 to 40 of a-z, 0-9 and _, starting with a letter")
    if metric not in _JUDGED:
        raise ValueError(f"metric must be one of {', '.join(sorted(_JUDGED))}")
    bounds = {k: entry.get(k) for k in ("above", "below")}
    for key, value in bounds.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
        ):
            raise ValueError(f"{key} must be a finite number")
    sources = entry.get("sources", "*")
    if not isinstance(sources, str) or not sources:
        raise ValueError("sources must be a pattern such as 'IU.*' or 'ward-?'")
    action = entry.get("action", "flag")
    if action not in ACTIONS:
        raise ValueError(f"action must be {' or '.join(ACTIONS)}, not {action!r}")
    rule = QualityRule(name, metric, bounds["above"], bounds["below"], sources, action == "quarantine")
    if rule.boolean and any(v is not None for v in bounds.values()):
        raise ValueError(f"{metric} is true or false: it takes no above or below")
    if not rule.boolean and all(v is None for v in bounds.values()):
        raise ValueError(f"{metric} needs a threshold: above, below or both")
    return rule
