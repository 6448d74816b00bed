"""Errors a user can act on, and the exit codes the CLI gives them.

Every command exits with one of:

* ``0``: done;
* ``1``: the run or operation failed (a service down, a step that failed, accounting that does not
  add up): what to do next is in the message, and retrying after the fix is safe;
* ``2``: what was typed or configured is wrong (a flag, a setting, an unknown topic or group, a
  new group without a start): nothing was read, written or committed;
* ``3``: the run's output broke an expectation: nothing was published and no offset moved.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_VALIDATION = 3


#: Errors of wavepipe's own code, not of a service, a setting or the data: never turned into a
#: record's verdict or a line of a partition's failure, never tried again as if the world changed.
BUGS = (TypeError, AttributeError, NameError, ImportError, AssertionError)


def first_line(reason: BaseException | str, limit: int | None = 300) -> str:
    """A reason in one line of at most ``limit`` characters (an exception without text: its type's name)."""
    text = str(reason).strip().splitlines()
    return text[0][:limit] if text else type(reason).__name__


class WavepipeError(Exception):
    """The root of every error wavepipe raises on purpose. Its kind (the subclasses below) is what
    a run, a task or the CLI acts on; ``exit_code`` is what the CLI exits with. Another library's
    error becomes one of these in one place per library (``storage`` for object stores and
    delta-rs, ``engine_client`` for Spark Connect, ``consumers.kafka_admin`` for Kafka); anything
    else that reaches a driver is a bug or an untranslated failure, said as such."""

    exit_code = EXIT_FAILED


class UsageError(WavepipeError, ValueError):
    """Refused: input from a user (flag, setting, DAG param, trigger conf) that is refused before
    anything runs; the message names where the value came from and the rule it breaks. Trying
    again without changing it fails the same way."""

    exit_code = EXIT_USAGE


class UnavailableError(WavepipeError, ConnectionError):
    """A service (broker, object store, engine, database) did not answer: nothing was committed,
    and trying again once it answers is safe; the message names the service, where it is and the
    command that checks or starts it."""


class EngineGoneError(UnavailableError):
    """The Spark engine (or this process's session on it) went away mid-step: the step's writes
    were not committed, and the step may be run again on a new session."""


class ConflictError(WavepipeError, RuntimeError):
    """Another run or worker holds, or has changed, what this one needs (a lease, the group's
    offsets, the staged chunks): the message says whether to wait or what was done instead."""


class CommittedElsewhereError(ConflictError):
    """A step found its run committed by another worker meanwhile (it failed on what that commit
    removed): nothing is left to do, and nothing was changed. ``wavepipe run`` exits 0 with the
    run's report; an Airflow task is skipped."""


class BadRecordError(WavepipeError, ValueError):
    """One input record (or file) is malformed: it becomes a dead letter (or a refused file) with
    this message as its reason, and the run goes on."""


class StepFailedError(WavepipeError, RuntimeError):
    """A step could not finish for a reason of its own (accounting that does not add up, a table
    that needs repair, a setup that could not be made); the message says what to do next."""


class ValidationFailedError(WavepipeError, RuntimeError):
    """The run's output broke an expectation: nothing was published and no offset moved."""

    exit_code = EXIT_VALIDATION


def closest(word: str, choices, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``choices`` that look like ``word``, the most alike first (for "did you
    mean" hints; ``cutoff=0``: the ``n`` most alike, however little)."""
    import difflib

    return difflib.get_close_matches(word, sorted(set(choices)), n=n, cutoff=cutoff)


def did_you_mean(word: str, choices) -> str:
    """``"; did you mean 'a' or 'b'?"`` or ``""`` when nothing is close."""
    close = closest(word, choices)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class CandidatesMismatchError(StepFailedError):
    """A run's candidate tables are not what its reassembly's result says it wrote: run the
    reassemble step again."""
