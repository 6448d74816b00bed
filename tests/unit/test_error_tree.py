"""One error tree (``wavepipe.contracts.errors``), checked on the real code: every exception class
wavepipe defines is a ``WavepipeError`` of one kind; an error's text is read only where another
library's untyped error is translated (one module per library); and a handler that catches
everything lets wavepipe's own defects (``BUGS``) through, unless it only describes or reports."""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

from tests.unit.test_layers import _modules
from wavepipe.contracts.errors import (
    BUGS,
    ConflictError,
    StepFailedError,
    UnavailableError,
    UsageError,
    ValidationFailedError,
    WavepipeError,
)

pytestmark = pytest.mark.repository  # the repository's own files, not the installed package

#: Where another library's untyped errors become wavepipe's: object stores and delta-rs, Spark
#: Connect, Kafka. Only these read an error's message.
TRANSLATORS = {"wavepipe.storage", "wavepipe.engine_client", "wavepipe.consumers.kafka_admin"}

#: Handlers that catch everything and do not let a defect through, each for its reason: what
#: they catch only ever becomes a log line, a check's or file's reported failure, or a stop.
REPORTS_ONLY = {
    ("wavepipe.recordings.files", "recordings"): "a file's failure (the format library's too) is reported per file",
    ("wavepipe.consumers.planner", "groups_on_topic"): "a hint in a message: groups with offsets on the topic",
    ("wavepipe.engine_client", "_listed_jobs"): "the run's report lists no jobs; logged with its traceback",
    ("wavepipe.pipeline", "start"): "the engine's start, in a thread: the run's thread raises what it caught",
    ("wavepipe.spark_apps.engine_run", "run"): "a step in a thread: the waiting thread raises what it caught",
    ("wavepipe.engine_client", "stage_progress"): "no progress lines for the step",
    ("wavepipe.state", "_renew"): "the lease's renewal stops, logged with its traceback",
    ("wavepipe.state", "release"): "the lease runs out within its term instead; logged",
    ("wavepipe.plugins.triggers", "run"): "the watcher stops, logged with its traceback",
    ("wavepipe.plugins.triggers", "_idle"): "the watcher stops, logged with its traceback",
    ("wavepipe.plugins.connections", "test_connection"): "the UI's Test button: shown as the test's failure",
    ("wavepipe.plugins.schedules", "windows_of"): "a schedule Airflow cannot read: refused with a ValueError below",
}

#: Folders of drivers whose broad handlers only describe (the benchmark's records, the local servers'
#: clean-up, which re-raises) and are not checked here.
UNCHECKED = ("wavepipe.bench", "wavepipe.local")


@functools.cache
def _trees() -> dict[str, ast.AST]:
    return {module: ast.parse(path.read_text()) for module, path in _modules().items()}


def _functions(tree: ast.AST):
    """(function name, node) for every node, by the innermost function holding it."""

    def walk(node, name):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else name
            yield inner, child
            yield from walk(child, inner)

    yield from walk(tree, "<module>")


def _exception_classes() -> list[tuple[str, str]]:
    found = []
    for module, tree in _trees().items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).split(".")[-1].endswith(("Error", "Exception", "Refused", "Fault")) for b in node.bases
            ):
                found.append((module, node.name))
    return found


def test_every_exception_class_is_a_kind_of_wavepipe_error():
    kinds = (UsageError, UnavailableError, ConflictError, StepFailedError, ValidationFailedError)
    classes = _exception_classes()
    assert len(classes) > 30, classes  # the scan finds them
    loose = []
    for module, name in classes:
        if module.startswith("wavepipe.contracts.errors"):
            continue
        cls = getattr(importlib.import_module(module), name)
        if not issubclass(cls, WavepipeError) or (
            issubclass(cls, Exception) and not issubclass(cls, kinds + (WavepipeError,))
        ):
            loose.append(f"{module}.{name}")
    assert not loose, f"not under WavepipeError (give each a kind from wavepipe.contracts.errors): {loose}"


def _reads_message(node: ast.AST) -> bool:
    """``... in str(exc)`` (or ``repr``, an f-string of it, ``exc.args[0]`` as text)."""
    if not (isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)):
        return False
    text = ast.unparse(node.comparators[-1])
    return any(f"{call}({name}" in text for call in ("str", "repr") for name in ("exc", "err", "error", "e)", "seen"))


def test_only_the_translators_read_an_errors_text():
    found = [
        f"{module}:{node.lineno} {ast.unparse(node)}"
        for module, tree in _trees().items()
        if module not in TRANSLATORS
        for _, node in _functions(tree)
        if _reads_message(node)
    ]
    assert not found, (
        f"an error's text read outside {sorted(TRANSLATORS)} (translate it there, then test its kind): {found}"
    )


def _lets_bugs_through(handlers: list[ast.ExceptHandler], index: int) -> bool:
    handler = handlers[index]
    if any("BUGS" in ast.unparse(h.type) for h in handlers[:index] if h.type is not None):
        return True
    return any(isinstance(n, ast.Raise) and n.exc is None for n in ast.walk(handler))


def _broad(handler: ast.ExceptHandler) -> bool:
    return handler.type is None or ast.unparse(handler.type) in ("Exception", "BaseException")


def test_a_broad_handler_lets_a_defect_through():
    swallowing, seen = [], set()
    for module, tree in _trees().items():
        if module.startswith(UNCHECKED):
            continue
        for function, node in _functions(tree):
            if not isinstance(node, ast.Try):
                continue
            for i, handler in enumerate(node.handlers):
                if not _broad(handler) or _lets_bugs_through(node.handlers, i):
                    continue
                comment = Path(_modules()[module]).read_text().splitlines()[handler.lineno - 1]
                if (module, function) in REPORTS_ONLY:
                    seen.add((module, function))
                    continue
                if "describ" in comment:
                    continue
                swallowing.append(f"{module}:{handler.lineno} ({function})")
    stale = set(REPORTS_ONLY) - seen
    assert not stale, f"REPORTS_ONLY names handlers that are not there any more: {stale}"
    assert not swallowing, (
        "these turn any error, a defect of wavepipe's included, into a result: add `except BUGS: raise` before "
        f"them, or say on the except line that it only describes: {swallowing}"
    )


def test_the_checks_see_what_they_refuse():
    snippet = ast.parse("try:\n    f()\nexcept Exception as exc:\n    if 'gone' in str(exc):\n        pass\n")
    (node,) = [n for n in ast.walk(snippet) if isinstance(n, ast.Try)]
    assert _broad(node.handlers[0]) and not _lets_bugs_through(node.handlers, 0)
    assert any(_reads_message(n) for n in ast.walk(snippet))
    guarded = ast.parse("try:\n    f()\nexcept BUGS:\n    raise\nexcept Exception:\n    pass\n")
    (node,) = [n for n in ast.walk(guarded) if isinstance(n, ast.Try)]
    assert _lets_bugs_through(node.handlers, 1)


def test_kinds_decide_the_exit_code_and_a_defect_is_not_one():
    assert (UsageError("x").exit_code, ValidationFailedError("x").exit_code, UnavailableError("x").exit_code) == (
        2,
        3,
        1,
    )
    assert not any(issubclass(bug, WavepipeError) for bug in BUGS)


def test_failed_partitions_are_one_line_of_the_kind_they_share(tmp_path):
    from wavepipe import pipeline, storage
    from wavepipe.consumers.kafka_admin import KafkaUnreachableError
    from wavepipe.contracts.config import load_settings
    from wavepipe.follow import GroupBusyError

    settings = load_settings(home=tmp_path)
    store_down = OSError("Generic S3 error: Error performing POST http://127.0.0.1:1/b/x?uploads=\nDebug source: ...")
    failed = pipeline.consume_failure(settings, "r1", [(0, store_down), (1, store_down)])
    assert isinstance(failed, storage.StorageUnavailableError) and "\n" not in str(failed)
    assert str(failed).startswith("run r1: consuming failed: partitions 0, 1: Generic S3 error: Error performing POST")

    broker = KafkaUnreachableError("no broker of b:9 answered")
    unreachable = pipeline.consume_failure(settings, "r1", [(0, broker)])
    assert type(unreachable) is UnavailableError and "partition 0: no broker of b:9 answered." in str(unreachable)

    busy = pipeline.consume_failure(settings, "r1", [(0, GroupBusyError("held")), (2, GroupBusyError("held"))])
    assert type(busy) is ConflictError and "partitions 0, 2: held." in str(busy)

    mixed = pipeline.consume_failure(settings, "r1", [(0, GroupBusyError("held")), (3, KeyError("x"))])
    assert type(mixed) is StepFailedError
    assert str(mixed).startswith("run r1: consuming failed for partition 0: held; partition 3: 'x'. The plan")


@pytest.mark.parametrize(
    ("error", "code", "said"),
    [
        (UsageError("--topic: no such topic"), 2, "wavepipe status: --topic: no such topic"),
        (UnavailableError("the broker at b:9 did not answer"), 1, "wavepipe status failed: the broker at b:9"),
        (ValidationFailedError("2 expectations failed"), 3, "wavepipe status: 2 expectations failed"),
        (TypeError("'NoneType' object is not subscriptable"), 1, "a defect of wavepipe (TypeError, traceback above)"),
    ],
)
def test_the_cli_exits_by_the_errors_kind(monkeypatch, capsys, error, code, said):
    from wavepipe import cli

    def fails(_args):
        raise error

    monkeypatch.setattr(cli, "cmd_status", fails)
    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), fails))
    assert cli.main(["status"]) == code
    err = capsys.readouterr().err
    assert said in err
    assert ("Traceback (most recent call last)" in err) == isinstance(error, BUGS)


def _with_func(parser, func):
    parser.set_defaults(func=func)
    for action in parser._subparsers._group_actions:
        for sub in action.choices.values():
            sub.set_defaults(func=func)
    return parser


def test_an_airflow_task_fails_a_defect_at_once_and_leaves_the_rest_to_its_retries():
    from airflow.sdk.exceptions import AirflowFailException

    from wavepipe.plugins.operators import defects_fail_at_once

    @defects_fail_at_once
    def execute(_self, context):
        raise context

    with pytest.raises(AirflowFailException, match=r"a defect of wavepipe \(TypeError: boom\); not retried") as failed:
        execute(None, TypeError("boom"))
    assert isinstance(failed.value.__cause__, TypeError)
    down = UnavailableError("the broker did not answer")
    with pytest.raises(UnavailableError) as raised:
        execute(None, down)
    assert raised.value is down


def test_a_step_that_fails_on_a_run_committed_meanwhile_says_so_and_its_task_is_skipped(tmp_path):
    """A step fails on what another worker's commit removed: it is not a failure of the run (none
    is noted) but ``CommittedElsewhereError``, which skips an Airflow task; a step of a run that
    did not commit fails as it did, noted in the group's history."""
    from airflow.sdk.exceptions import AirflowSkipException

    from wavepipe import pipeline
    from wavepipe.contracts.config import load_settings
    from wavepipe.contracts.errors import CommittedElsewhereError
    from wavepipe.contracts.runfiles import Step
    from wavepipe.plugins.operators import defects_fail_at_once
    from wavepipe.run_store import RunStore

    settings = load_settings(home=tmp_path)
    store = RunStore(settings)

    @pipeline._noted_on_failure("reassemble")
    def reassemble(_settings, _run_id):
        raise FileNotFoundError("staging/run_a/chunks/p0.parquet")

    with pytest.raises(FileNotFoundError):
        reassemble(settings, "run_a")
    assert not pipeline.is_committed(settings, "run_a") and [f["step"] for f in store.failures(settings.group)]
    store.save_step("run_a", Step.REPORT, {"run_id": "run_a", "commit": {"0": {"after": 3}}})
    assert pipeline.is_committed(settings, "run_a")
    with pytest.raises(CommittedElsewhereError, match=r"run run_a was committed by another worker .*p0\.parquet"):
        reassemble(settings, "run_a")
    assert len(store.failures(settings.group)) == 1  # not noted again

    @defects_fail_at_once
    def execute(_self, _context):
        reassemble(settings, "run_a")

    with pytest.raises(AirflowSkipException, match="this attempt changed nothing"):
        execute(None, None)
