"""Table maintenance as Airflow tasks: compaction (OPTIMIZE, optionally clustered by source and start time), then
VACUUM. Thin over ``wavepipe.maintenance``: the same lock, retention rule and results as
``wavepipe table optimize|vacuum``. A wrong param refuses the task at once (skipped with the reason: a retry cannot help)."""

from __future__ import annotations

from typing import Any

from wavepipe import maintenance
from wavepipe.contracts.errors import UsageError
from wavepipe.plugins.operators import WavepipeOperator, check_conf, flag, int_or_none


class _TablesOperator(WavepipeOperator):
    """Each argument not given is the run's param of that name; ``tables``: a comma-separated
    list of output tables (empty: all of them)."""

    def __init__(self, *, tables: Any = None, **kwargs):
        super().__init__(**kwargs)
        self.tables = tables

    def picked(self, context) -> list[str]:
        return maintenance.pick_tables(maintenance.table_list(self.arg(context, "tables")))


class OptimizeTablesOperator(_TablesOperator):
    """Compact the output tables (``days``: only the waveforms' date partitions of the last N days,
    none: all; ``zorder``: also sort them by start time). Returns what each compaction did."""

    template_fields = ("tables", "zorder", "days")

    def __init__(self, *, zorder: Any = None, days: Any = None, **kwargs):
        super().__init__(**kwargs)
        self.zorder, self.days = zorder, days

    def execute(self, context) -> list[dict]:
        try:
            if self.has_dag():
                check_conf(getattr(context.get("dag_run"), "conf", None), self.dag.params.keys())
            settings, tables = self.settings(), self.picked(context)
            since = maintenance.since_date(days=int_or_none(self.arg(context, "days"), "days"))
        except UsageError as exc:
            self.refuse(exc)
        return maintenance.optimize(settings, tables=tables, zorder=flag(self.arg(context, "zorder")), since=since)


class VacuumTablesOperator(_TablesOperator):
    """Delete the files the output tables have not used for ``retention_hours`` (none: the setting
    ``table_retention_hours``); ``dry_run``: count them only. Returns what each table's VACUUM did."""

    template_fields = ("tables", "retention_hours", "dry_run")

    def __init__(self, *, retention_hours: Any = None, dry_run: Any = None, **kwargs):
        super().__init__(**kwargs)
        self.retention_hours, self.dry_run = retention_hours, dry_run

    def execute(self, context) -> list[dict]:
        hours = self.arg(context, "retention_hours")
        try:
            settings, tables = self.settings(), self.picked(context)
            hours = None if hours in (None, "None") else maintenance.check_retention(_number(hours))
        except UsageError as exc:
            self.refuse(exc)
        return maintenance.vacuum(
            settings, tables=tables, retention_hours=hours, dry_run=flag(self.arg(context, "dry_run"))
        )


def _number(value: Any) -> Any:
    """A param rendered by a template ("24.0") as a number; anything else as it is (refused next)."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value
