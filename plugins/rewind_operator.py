"""The rewind as an Airflow task: plan it (the table goes to the task log), apply it on request.

Thin over ``wavepipe.consumers.rewind``: the same refusals, check against the plan and audit record as
``wavepipe rewind``, with ``who`` taken from the DAG run (the user who triggered it). A refusal
ends the task at once, skipped with the reason (``WavepipeOperator.refuse``: retrying cannot help
until someone acts), and a refused ``execute`` is audited.
"""

from __future__ import annotations

from typing import Any

from wavepipe.consumers import rewind
from wavepipe.plugins.operators import WavepipeOperator
from wavepipe.plugins.operators import flag as _flag


class RewindOperator(WavepipeOperator):
    """Move a group's committed offsets to ``mode``/``value`` (see ``RewindTarget.parse``).

    A dry run unless ``apply`` (the DAG's ``execute`` param); ``reason`` is required to apply.
    Each argument not given is the run's param of that name (``apply``: ``execute``).
    Returns the plan, and the audit record when applied, as the task's XCom.
    """

    template_fields = ("topic", "group", "partitions", "mode", "value", "apply", "force", "reason")

    def __init__(
        self,
        *,
        mode: str | None = None,
        value: Any = None,
        topic: str | None = None,
        group: str | None = None,
        partitions: Any = None,
        apply: Any = None,
        force: Any = None,
        reason: str | None = None,
        **kwargs,
    ):
        kwargs.setdefault("retries", 0)
        super().__init__(**kwargs)
        self.topic, self.group, self.partitions = topic, group, partitions
        self.mode, self.value, self.apply, self.force, self.reason = mode, value, apply, force, reason

    @staticmethod
    def who(context) -> str:
        """The user who triggered the DAG run (Airflow 3), else "airflow"."""
        dag_run = context.get("dag_run")
        return getattr(dag_run, "triggering_user_name", None) or "airflow"

    def execute(self, context) -> dict:
        settings = self.settings()
        topic, group = self.arg(context, "topic") or settings.topic, self.arg(context, "group") or settings.group
        apply, reason = _flag(self.arg(context, "apply", "execute")), str(self.arg(context, "reason") or "").strip()
        mode, value, partitions = (
            self.arg(context, "mode"),
            self.arg(context, "value"),
            self.arg(context, "partitions"),
        )
        if apply and not reason:
            self.refuse(
                ValueError(
                    "execute is on but reason is empty: say why the group is rewound "
                    "(it is kept in the audit record), then trigger again"
                )
            )
        try:
            target = rewind.RewindTarget.parse(mode, value)
            partitions = rewind.parse_partitions(partitions if partitions not in (None, "None") else None)
        except ValueError as exc:
            self.refuse(ValueError(f"bad rewind parameters: {exc}"))
        who = self.who(context)
        origin = f"airflow:{context['dag'].dag_id}/{context['run_id']}"
        try:
            plan = rewind.plan_rewind(
                settings,
                topic=topic,
                group=group,
                target=target,
                partitions=partitions,
                force=_flag(self.arg(context, "force")),
            )
        except rewind.RewindRefused as exc:
            if exc.plan is not None:
                self.log.info("rewind plan:\n%s", rewind.format_plan(exc.plan))
            if apply:
                rewind.audit_refused(settings, exc, who=who, reason=reason, origin=origin)
            self.refuse(exc if apply else ValueError(f"the dry run would be refused: {exc}"))
        except ValueError as exc:
            self.refuse(exc)
        self.log.info("rewind plan:\n%s", rewind.format_plan(plan))
        result = {"plan": rewind.plan_as_dict(plan)}
        if not apply:
            self.log.info("dry run: nothing changed; trigger again with execute=true (and a reason) to apply")
            return result
        try:
            done = rewind.execute_rewind(settings, plan, who=who, reason=reason, origin=origin)
        except rewind.RewindRefused as exc:
            self.refuse(exc)
        self.log.info("applied rewind %s by %s; audit record in %s", done["id"], who, done["audit_path"])
        return {**result, "audit": done}
