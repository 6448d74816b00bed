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


class UsageError(ValueError):
    """Input from a user (flag, setting, DAG param, trigger conf) that is refused before anything
    runs; the message names where the value came from and the rule it breaks."""


def closest(word: str, choices, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``choices`` that look like ``word``, the most alike first (for "did you
    mean" hints; ``cutoff=0``: the ``n`` most alike, however little)."""
    import difflib

    return difflib.get_close_matches(word, sorted(set(choices)), n=n, cutoff=cutoff)


def did_you_mean(word: str, choices) -> str:
    """``"; did you mean 'a' or 'b'?"`` or ``""`` when nothing is close."""
    close = closest(word, choices)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class CandidatesMismatchError(RuntimeError):
    """A run's candidate tables are not what its reassembly's result says it wrote: run the
    reassemble step again."""
