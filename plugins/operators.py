"""Thin operators over wavepipe.pipeline: each is one step of a run, keyed by the DAG run id, or
(``RunOperator``) the whole run in one task.

Retries are safe: the plan step reuses the run's frozen plan, consume overwrites the range's
staged files, reassemble replaces the run's private candidate tables (nothing published), validate
publishes only after every run-level expectation holds, appending keys not in the tables yet in
one Delta commit per table under the group's transaction (a retried publish commits nothing
twice), and commit checks the group's offsets against the plan just before committing them.
"""

from __future__ import annotations

import functools
import os
import textwrap
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from airflow.sdk import Asset, AssetAlias, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException, AirflowSkipException

from wavepipe import pipeline
from wavepipe.contracts.config import SettingsError, check_settings
from wavepipe.contracts.errors import BUGS, CommittedElsewhereError, UsageError, ValidationFailedError, did_you_mean
from wavepipe.contracts.plan import ActiveRunError, as_utc, parse_datetime
from wavepipe.contracts.runfiles import Step
from wavepipe.contracts.steps import Validated, to_record
from wavepipe.follow import FollowOptions, follow
from wavepipe.plugins import lineage, metrics
from wavepipe.plugins.assets import published_extra, quality_asset, quality_extra, table_assets
from wavepipe.plugins.hooks import SPARK_CONN_ID, WavepipeHook
from wavepipe.plugins.links import DataDocsLink, RunPageLink, results_page
from wavepipe.run_store import RunStore

#: A refusal's reason is logged in lines of at most this many characters: the UI's log panel
#: (the right half of a 1280-pixel window, beside the grid) shows about 85 without cutting them.
REFUSAL_LINE_CHARS = 72
#: Seconds between a waiting window run's attempts to take its group's backfill lane.
WINDOW_LANE_RETRY_S = 30


def int_or_none(value: Any, name: str) -> int | None:
    if value in (None, "", "None"):
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise UsageError(f"param {name}={value!r} is not a whole number") from None
    if number < 0:
        raise UsageError(f"param {name}={number} is negative: give a positive number, or nothing for none")
    return number


def check_conf(conf: dict | None, known) -> None:
    """Refuse a trigger's conf with keys that are not params of the DAG (a typo would otherwise
    run on the defaults), naming them and the closest params."""
    unknown = sorted(set(conf or {}) - set(known))
    if unknown:
        raise UsageError(
            "unknown keys in the run's conf: "
            + ", ".join(f"{k!r}{did_you_mean(k, known)}" for k in unknown)
            + f". The params of this DAG are: {', '.join(sorted(known))}. Nothing was read; trigger it again "
            "with the right names."
        )


def run_window(context, start: Any = None, end: Any = None) -> tuple[datetime, datetime] | None:
    """The time window a DAG run reprocesses, or None for an incremental run.

    A backfill run (``airflow backfill create``, or the UI's backfill dialog) reprocesses its data
    interval; any run may name a window with the ``window_start``/``window_end`` params instead.
    Scheduled and plain manual runs are incremental: they continue from the group's offsets."""
    start, end = (None if v in (None, "", "None") else v for v in (start, end))
    parsed = {}
    for name, value in (("window_start", start), ("window_end", end)):
        if value is not None:
            try:
                parsed[name] = as_utc(value) if isinstance(value, datetime) else parse_datetime(str(value))
            except ValueError as exc:
                raise UsageError(f"param {name}: {exc}") from None
    if (start is None) != (end is None):
        raise UsageError("give both window_start and window_end, or neither")
    run_type = getattr(context["dag_run"], "run_type", None)
    backfill = getattr(run_type, "value", run_type) == "backfill"
    if start is not None and backfill:
        raise UsageError(
            "a backfill run takes its window from its dates: leave window_start and window_end empty (to "
            "reprocess another window, backfill its dates, or trigger a single run with these params)"
        )
    if start is not None:
        return parsed["window_start"], parsed["window_end"]
    if backfill:
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        if start is None or end is None or start >= end:
            raise UsageError(
                f"this backfill run has no data interval ({start} to {end}), so it names no window: give the "
                "DAG a timetable with data intervals (e.g. DeltaDataIntervalTimetable), or trigger it with "
                "window_start/window_end"
            )
        return start, end
    return None


def flag(value: Any) -> bool:
    """A boolean param as rendered by a template ("True", "false", "1", ...)."""
    return str(value).strip().lower() in ("true", "1", "yes")


def plain_settings(values: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """Settings for a DAG's tasks, checked (an error names ``where`` and the setting) and kept as
    plain values (paths as strings): a mapped task's arguments are serialized. A path must be
    absolute: the file is parsed in one working folder and its tasks run in others."""
    plain = {
        k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in dict(values or {}).items() if v is not None
    }
    for name, value in check_settings(plain, where).items():
        if isinstance(value, Path) and not os.path.isabs(os.path.expanduser(str(plain[name]))):
            raise SettingsError(
                f"{where}[{name!r}]: {name} must be an absolute path in a DAG's settings (its tasks "
                f"run in other working folders than the DAG file is parsed in), got {plain[name]!r}"
            )
    return plain


def defects_fail_at_once(execute):
    """An operator's ``execute`` whose defects of wavepipe (``BUGS``: a ``TypeError``, ...) fail
    the task at once: Airflow's retries are for a world that may change, and a defect would only
    fail the same way again. The defect's traceback stays in the task log (the exception's cause).
    A step whose run another worker committed meanwhile skips the task, saying so: nothing is left to do."""

    @functools.wraps(execute)
    def execute_once(self, context):
        try:
            return execute(self, context)
        except CommittedElsewhereError as exc:
            raise AirflowSkipException(str(exc)) from None
        except BUGS as exc:
            raise AirflowFailException(
                f"a defect of wavepipe ({type(exc).__name__}: {exc}); not retried: its traceback is above"
            ) from exc

    return execute_once


class WavepipeOperator(BaseOperator):
    """Base of wavepipe's operators: the settings, with Kafka and Spark from the Airflow
    Connections ``wavepipe_conn_id`` and ``spark_conn_id``; ``settings_overrides``: wavepipe
    settings of this task's pipeline (a DAG factory's ``settings``), checked here, at parse time."""

    def __init__(
        self,
        *,
        wavepipe_conn_id: str = WavepipeHook.default_conn_name,
        spark_conn_id: str = SPARK_CONN_ID,
        settings_overrides: Mapping[str, Any] | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.wavepipe_conn_id, self.spark_conn_id = wavepipe_conn_id, spark_conn_id
        self.settings_overrides = plain_settings(settings_overrides, f"{self.task_id}: settings_overrides")

    def settings(self):
        return WavepipeHook(self.wavepipe_conn_id, self.spark_conn_id).get_settings(**self.settings_overrides)

    # OpenLineage (``wavepipe.plugins.lineage``), asked by Airflow's OpenLineage provider after
    # execute, in the task's process: what the task committed, or the validation that failed it.
    # It only describes the run: whatever goes wrong here is logged, never raised.
    _committed: tuple | None = None  # (settings, the reports of the runs it committed)
    _failed_validation: tuple | None = None  # (settings, the run id)
    _data_docs: tuple | None = None  # (settings, the Data Docs page of its validation)

    def get_openlineage_facets_on_complete(self, task_instance):

        return self._lineage(lineage.run_lineage, self._committed)

    def get_openlineage_facets_on_failure(self, task_instance):

        def failed(settings, run_id):

            store = RunStore(settings)
            validated = store.load_result(run_id, Step.VALIDATE, Validated)
            return lineage.failed_validation_lineage(settings, store.load_plan(run_id), validated.suites)

        return self._lineage(failed, self._failed_validation)

    def _validation_failed(self, settings, run_id: str) -> None:
        """A failed validation: the lineage's assertions to send, the ``validation_failed`` count,
        the link to its Data Docs."""
        self._failed_validation = (settings, run_id)
        self._validation_seen(settings, run_id)
        try:
            plan = RunStore(settings).load_plan(run_id)
        except Exception:  # only describes (the metric's tags): the failure itself is what the task reports
            plan = None
        topic, group = (plan.topic, plan.group) if plan else (settings.topic, settings.group)
        metrics.send({"validation_failed": ("count", 1)}, dag_id=self.dag_id, topic=topic, group=group, log=self.log)

    def _validation_seen(self, settings, run_id: str) -> None:
        """The Data Docs link of the run's recorded validation (never fails the task)."""
        try:
            validated = RunStore(settings).load_result(run_id, Step.VALIDATE, Validated)
        except Exception as exc:  # only describes: the link
            self.log.warning("no Data Docs link: %s", exc)
            return
        self._shows_validation(settings, to_record(validated) if validated else None)

    def _shows_validation(self, settings, validation: dict | None) -> None:
        """The Data Docs link of ``validation`` (a ``Validated`` record): the run's own results
        (``links.results_page``: its first failed suite's, else its first suite's), else the index."""
        if not validation:
            return
        page = results_page({"validation": validation}) or validation.get("data_docs_index")
        if page:
            self._data_docs = (settings, page)

    def _lineage(self, build, what):
        from airflow.providers.openlineage.extractors import OperatorLineage

        if not what:
            return OperatorLineage()
        try:
            return build(*what)
        except Exception as exc:  # describing the run never fails it
            self.log.warning("no OpenLineage facets for this task: %s", exc)
            return OperatorLineage()

    def refuse(self, exc: Exception) -> NoReturn:
        """End the task as skipped with the reason, in lines short enough for the log panel: a
        refusal is not a failure (nothing was read or moved, nothing a retry could change), so the
        DAG run is not counted as failed; its downstream tasks are skipped, and a refused ingest run
        is listed by ``wavepipe status`` (``pipeline.note_refusal``)."""
        # at spaces only: a run id, topic or group (``run-in-flight``) stays whole, to be searched for
        lines = textwrap.wrap(str(exc), REFUSAL_LINE_CHARS, break_on_hyphens=False, break_long_words=False)
        lines = lines or [type(exc).__name__]
        self.log.warning("refused, nothing was read or committed:")
        for line in lines:
            self.log.warning("  %s", line)
        raise AirflowSkipException(f"refused: {' '.join(lines)}") from None

    @staticmethod
    def run_id(settings, context) -> str:
        """The wavepipe run this DAG run's steps work on (the plan step chose it:
        ``pipeline.window_run_id``)."""
        return pipeline.current_run_id(settings, context["run_id"])

    def uncommitted_run_id(self, settings, context) -> str:
        """``run_id``, unless that run is committed already (another worker committed it while
        this task waited or was retried): the task is then skipped, saying so, with nothing read
        or written again."""
        run_id = self.run_id(settings, context)
        if pipeline.is_committed(settings, run_id):
            raise AirflowSkipException(f"run {run_id} is committed already: its {self.task_id} has nothing left to do")
        return run_id

    def arg(self, context, name: str, param: str | None = None) -> Any:
        """The task's argument ``name`` when it was given, else the run's param ``param`` (default:
        the same name) as Airflow checked it against the DAG's Param schema: typed (an integer, a
        boolean, a string or None), never a rendered template read back. Empty means not given."""
        value = getattr(self, name)
        if value is None or value == "":
            value = (context.get("params") or {}).get(param or name)
        return None if value == "" else value


class PlanOperator(WavepipeOperator):
    """Freeze the run's offset ranges; returns the partition groups to read, one per mapped consume
    task (``consume_tasks`` groups at most; 0: one partition each).

    Each argument not given is taken from the run's param of the same name (``arg``), as the DAG
    factories' DAGs do; a DAG of your own may give them instead (templates are rendered)."""

    template_fields = (
        "topic",
        "group",
        "max_records",
        "max_bytes",
        "skip_lost_offsets",
        "window_start",
        "window_end",
        "new_group_start",
    )

    def __init__(
        self,
        *,
        topic: str | None = None,
        group: str | None = None,
        max_records: Any = None,
        max_bytes: Any = None,
        skip_lost_offsets: Any = None,
        window_start: Any = None,
        window_end: Any = None,
        new_group_start: Any = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.window_start, self.window_end = window_start, window_end
        self.topic, self.group, self.max_records, self.max_bytes = topic, group, max_records, max_bytes
        self.skip_lost_offsets, self.new_group_start = skip_lost_offsets, new_group_start

    @defects_fail_at_once
    def execute(self, context) -> list[list[int]]:
        settings, plan = self.plan(context)
        groups = pipeline.partition_groups(plan, settings.consume_tasks)
        if settings.consume_tasks and groups:
            self.log.info(
                "%d consume tasks (consume_tasks=%d): partitions %s", len(groups), settings.consume_tasks, groups
            )
        return groups

    def request(self, context) -> dict[str, Any]:
        """What the run is asked to read (``RunRequest``), from the arguments and the run's params,
        checked: a conf key that is no param, a bad window or number refuses the run at once."""
        dag_run = context.get("dag_run")
        new_group_start = self.arg(context, "new_group_start")
        asked = {"topic": self.arg(context, "topic"), "group": self.arg(context, "group")}
        try:
            if self.has_dag():
                check_conf(getattr(dag_run, "conf", None), self.dag.params.keys())
            return {
                **asked,
                "max_records": int_or_none(self.arg(context, "max_records"), "max_records"),
                "max_bytes": int_or_none(self.arg(context, "max_bytes"), "max_bytes"),
                "skip_lost_offsets": flag(self.arg(context, "skip_lost_offsets")),
                "window": run_window(context, self.arg(context, "window_start"), self.arg(context, "window_end")),
                "new_group_start": None if new_group_start in (None, "None") else str(new_group_start),
            }
        except UsageError as exc:
            try:
                pipeline.note_refusal(self.settings(), context["run_id"], asked, exc)
            except Exception as noted:  # only describes (the Connection may be broken too): the refusal stands
                self.log.warning("the refusal could not be noted for `wavepipe status`: %s", noted)
            self.refuse(exc)

    def plan(self, context):
        """(settings, the run's frozen plan), planned now or reused; what a user typed is refused at
        once (``refuse``: a retry would be refused the same way); a window run waits for its lane."""
        request = self.request(context)
        try:
            settings = self.settings()
            plan = pipeline.plan_step(settings, context["run_id"], **request)
        except UsageError as exc:  # noted as a refusal by plan_step
            self.refuse(exc)
        except ActiveRunError as exc:
            if not request["window"]:
                raise
            # window runs go one at a time (a backfill may start several): wait for the lane
            # without holding a worker slot, however long the window before takes
            self.log.info("%s; trying again in %ds", exc, WINDOW_LANE_RETRY_S)
            raise AirflowRescheduleException(datetime.now(UTC) + timedelta(seconds=WINDOW_LANE_RETRY_S)) from exc
        self._describe(plan)
        return settings, plan

    def _describe(self, plan) -> None:
        """The plan in the task log: what the run reads, and why nothing when so."""
        if plan.window:
            self.log.info(
                "run %s: a window run: [%s, %s) is reprocessed and replaces that window's output; no offsets are "
                "committed",
                plan.run_id,
                plan.window["start"],
                plan.window["end"],
            )
        for p, (lost_from, lost_to) in plan.lost.items():
            self.log.warning(
                "%s[%d]: offsets [%d, %d) were no longer retained and are skipped", plan.topic, p, lost_from, lost_to
            )
        for r in plan.ranges:
            self.log.info("%s[%d]: [%d, %d) = %d offsets", r.topic, r.partition, r.start, r.end, r.size)
        if not pipeline.partitions_to_read(plan):
            self.log.info("run %s: %s", plan.run_id, pipeline.nothing_to_read(plan))


class ConsumeOperator(WavepipeOperator):
    """Read and stage the planned ranges of a group of partitions (mapped over the plan's groups;
    ``consume_parallelism`` processes at a time inside the task)."""

    template_fields = ("partitions",)

    def __init__(self, *, partitions: list[int], **kwargs):
        super().__init__(**kwargs)
        self.partitions = partitions

    @property
    def partitions_label(self) -> str:
        """The mapped task's name in the UI: compact ranges (``0-63,70``), within Airflow's 250
        characters for a map index label."""
        return "partitions " + pipeline.partition_ranges(self._partition_list(), limit=200)

    def _partition_list(self) -> list[int]:
        # a run planned before partition groups has one partition per mapped task
        parts = self.partitions
        return [int(parts)] if isinstance(parts, (int, str)) else [int(p) for p in parts]

    @defects_fail_at_once
    def execute(self, context) -> list[dict]:
        partitions = self._partition_list()
        self.log.info("reading partitions %s", partitions)
        settings = self.settings()
        return pipeline.consume_all(settings, self.uncommitted_run_id(settings, context), partitions)


class ReassembleOperator(WavepipeOperator):
    """Run the Spark reassembly app on the run's staged chunks. ``validate``: then validate and
    publish in the same Spark session (the validate task after it has nothing left to do), as an
    event-driven DAG does to save its run a second session's start; a failed validation fails
    this task then, without retries."""

    operator_extra_links = (DataDocsLink(),)

    def __init__(self, *, validate: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.validate = validate

    @defects_fail_at_once
    def execute(self, context) -> dict | None:
        settings = self.settings()
        run_id = self.uncommitted_run_id(settings, context)
        try:
            result = pipeline.reassemble_step(settings, run_id, validate=self.validate)
        except ValidationFailedError as exc:
            self._validation_failed(settings, run_id)
            raise AirflowFailException(str(exc)) from exc
        if result and self.validate:
            self._validation_seen(settings, run_id)
        if result:
            self.log.info("waveforms: %s", result.waveforms)
        return None if result is None else result.waveforms


class ValidateOperator(WavepipeOperator):
    """Run the expectation suites on the run's output; publish it only if every one holds.

    A failed validation fails the task at once (no automatic retry: the data or the thresholds
    must change first); the log names the failed expectations and links the run's report page.
    Clear the task to retry after a fix."""

    operator_extra_links = (DataDocsLink(),)

    @defects_fail_at_once
    def execute(self, context) -> dict | None:
        settings = self.settings()
        run_id = self.uncommitted_run_id(settings, context)
        try:
            result = pipeline.validate_step(settings, run_id)
        except ValidationFailedError as exc:
            self._validation_failed(settings, run_id)
            raise AirflowFailException(str(exc)) from exc
        if result:
            self._shows_validation(settings, to_record(result))
            self.log.info(
                "validation passed (%d expectations) and the output is published; Data Docs: %s",
                sum(s["evaluated"] for s in result.suites),
                result.data_docs_index,
            )
        return None if result is None else {"success": result.success, "rows": to_record(result.rows)}


class CommitOperator(WavepipeOperator):
    """Commit the safe offsets once the output is validated and published, and write the run report.

    ``published``: an ``AssetAlias`` through which, once the offsets are committed, an event goes
    to each output table the run put rows in (``wavepipe.plugins.assets``: the table's asset, with
    the run id, rows and table version as its extra), so a DAG scheduled on the waveforms table
    runs once per run that published waveforms, never for an idle run.

    ``follow_up``: the asset an event-driven DAG runs on (its outlets then hold an ``AssetAlias``
    for it): when a cap left records the run's plan saw (on the watched topic and group), an event
    for it queues one follow-up run, while this run still holds the DAG's one active slot. Records
    newer than the plan are the watcher's to judge against its thresholds."""

    operator_extra_links = (RunPageLink(), DataDocsLink())

    def __init__(self, *, follow_up: Asset | None = None, published: AssetAlias | None = None, **kwargs):
        super().__init__(**kwargs)
        self.follow_up, self.published = follow_up, published
        if published is not None and published not in self.outlets:
            self.outlets = [*self.outlets, published]
        aliases = [o for o in self.outlets if isinstance(o, AssetAlias) and o != published]
        if follow_up is not None and len(aliases) != 1:
            raise ValueError(
                f"{self.task_id}: follow_up needs exactly one AssetAlias among the outlets to emit its event "
                f"through, got {len(aliases)}"
            )

    @defects_fail_at_once
    def execute(self, context) -> str:
        settings = self.settings()
        return self.committed(context, pipeline.commit_step(settings, self.run_id(settings, context)), settings)

    def committed(self, context, report: dict, settings) -> str | None:
        """After the run's commit: its tables' asset events, a follow-up queued when a cap left
        records, the report in the log. Returns the report page's path."""
        self._committed = (settings, [*(self._committed or (None, []))[1], report])
        self._shows_validation(settings, report.get("validation"))
        self._announce(context, report, settings)
        topic, group = report.get("topic"), report.get("group")
        metrics.send(metrics.run_metrics(report), dag_id=self.dag_id, topic=topic, group=group, log=self.log)
        left = 0 if report.get("window") else pipeline.left_by_cap(report)
        watched = self.follow_up is not None and (report.get("topic"), report.get("group")) == (
            self.follow_up.extra.get("topic"),
            self.follow_up.extra.get("group"),
        )
        if watched and left:
            # newer records are the watcher's to judge against its thresholds
            (alias,) = [o for o in self.outlets if isinstance(o, AssetAlias) and o != self.published]
            context["outlet_events"][alias].add(self.follow_up, extra={"left_by_cap": left})
            self.log.info("a cap left %d records this run's plan saw: a follow-up run is queued", left)
        if report.get("report_html"):
            self.log.info("run report: file://%s (JSON twin: %s)", report["report_html"], report["report_path"])
        else:
            self.log.info(
                "run %s: %s; an idle run leaves no report, only a count in `wavepipe status`",
                report["run_id"],
                report.get("skipped") or "nothing read",
            )
        self.log.info("totals: %s", report["totals"])
        return report.get("report_html")

    def _announce(self, context, report: dict, settings) -> None:
        """An asset event for each table the committed run put rows in."""
        if self.published is None:
            return
        tables = table_assets(settings)
        for table, extra in published_extra(report).items():
            context["outlet_events"][self.published].add(tables[table], extra=extra)
            self.log.info(
                "asset event: %s got %d rows (version %s)", tables[table].uri, extra["rows"], extra["table_version"]
            )
        breaches = quality_extra(report)
        if breaches is not None:
            asset = quality_asset(settings)
            context["outlet_events"][self.published].add(asset, extra=breaches)
            self.log.warning(
                "asset event: %s: %d waveforms flagged %s", asset.uri, breaches["flagged"], breaches["by_rule"]
            )


class RunOperator(PlanOperator, CommitOperator):
    """A whole run in one task: plan, consume (``consume_parallelism`` readers at a time), then
    reassemble, validate and publish in one Spark session, then commit. A micro-batch pays one
    task's start instead of five (an event-driven DAG's default: ``wavepipe_ingest_dag(...,
    single_task=True)``). Arguments and params as ``PlanOperator``'s, ``follow_up`` as
    ``CommitOperator``'s. A retry resumes the run at its first unfinished step (its plan is
    frozen, partitions staged by the failed try are not read again)."""

    @defects_fail_at_once
    def execute(self, context) -> str | None:
        settings, plan = self.plan(context)
        try:
            report = pipeline.run_steps(settings, plan)
        except ValidationFailedError as exc:
            self._validation_failed(settings, plan.run_id)
            raise AirflowFailException(str(exc)) from exc
        return self.committed(context, report, settings)


class FollowOperator(RunOperator):
    """Micro-batches back to back in one long-running task (``wavepipe.follow``): for up to
    ``follow_s`` seconds, a run (its own run id, frozen plan, validation, publish, commit and
    report) each time the group lags, a lag poll every ``poll_s`` between. Each micro-batch logs
    its line and its report; ``follow_up`` gets an event for each one a cap cut short, as
    ``CommitOperator``'s. Cleared or killed inside a micro-batch, the next start resumes it (it
    loses and doubles nothing). A backfill's or a window's DAG run is one window run, as
    ``RunOperator``'s. Arguments and params as ``PlanOperator``'s."""

    def __init__(self, *, follow_s: float, poll_s: float, **kwargs):
        super().__init__(**kwargs)
        self.follow_s, self.poll_s = follow_s, poll_s
        self._stop = None

    @defects_fail_at_once
    def execute(self, context) -> Any:
        import threading

        request = self.request(context)
        if request["window"]:
            return super().execute(context)
        settings = self.settings().replace(topic=request.pop("topic"), group=request.pop("group"))
        self._stop = threading.Event()
        options = FollowOptions(poll_s=self.poll_s, max_seconds=self.follow_s)
        try:
            done = follow(
                settings, options, self._stop, request, on_batch=lambda rep: self.committed(context, rep, settings)
            )
        except UsageError as exc:
            self.refuse(exc)
        except ValidationFailedError as exc:
            raise AirflowFailException(str(exc)) from exc
        self.log.info("%d micro-batch(es); ended: %s", len(done.batches), done.ended)
        return {"micro_batches": done.batches, "ended": done.ended}

    def on_kill(self) -> None:
        if self._stop is not None:
            self._stop.set()
