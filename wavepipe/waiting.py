"""Waiting for something to be ready, retrying only what means "not yet".

A polling loop that catches every exception turns a bug in its own check (a ``TypeError``) into a
wait that times out with a misleading message. The loops of wavepipe and its benchmark use this
module instead:

``wait_until(check, timeout_s, what, retry_on=..., poll_s=..., hint=..., error=...)``
    Calls ``check()`` every ``poll_s`` seconds until it returns a truthy value, and returns that
    value. An exception ``retry_on`` matches is "not ready yet": logged at DEBUG and asked again.
    Any other exception ends the wait at once: logged once with its traceback, then raised as
    ``error(message)`` from it, the message naming ``what`` was awaited, the error, and ``hint``
    (what to do next). After ``timeout_s`` seconds without success: ``error(message)`` naming
    ``what``, the timeout and the last expected error. An ``error`` the check raises itself (its
    own verdict, e.g. "the process exited") passes through unchanged::

        wait_until(lambda: admin.list_topics(timeout=2), 90, "Kafka at 127.0.0.1:9092 to answer",
                   retry_on=(KafkaException,), hint="see its log: ...", error=SetupError)

``retry_on`` is a tuple of exception types, or a predicate ``exc -> bool`` for errors only their
content tells apart (``wavepipe.storage.is_storage_error``).

Loops of another shape (a watcher that never times out, a background renewer, a retry that must
never fail its caller) classify the exception themselves with the same two pieces::

    except Exception as exc:
        if not expected(exc, retry_on):
            raise stopped(exc, what, hint) from exc  # logged once, with its traceback
        ...  # not ready yet: say so, wait, try again

``stopped`` logs and returns the error; a loop that must not fail its caller just returns after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from wavepipe.contracts.errors import BUGS, UnavailableError, first_line

log = logging.getLogger(__name__)

T = TypeVar("T")
#: What a wait retries: exception types, or a predicate on the exception.
RetryOn = tuple[type[BaseException], ...] | Callable[[BaseException], bool]


class WaitError(UnavailableError):
    """A wait ended without what it waited for: it timed out, or its check failed with an error
    that waiting longer cannot fix. The message is one line: what was awaited, why it stopped,
    what to do next."""


def expected(exc: BaseException, retry_on: RetryOn) -> bool:
    """Whether ``exc`` is one that ``retry_on`` (types, or a predicate) names as "not ready yet"."""
    if isinstance(retry_on, tuple):
        return isinstance(exc, retry_on)
    return bool(retry_on(exc))


def _line(exc: BaseException) -> str:
    """``exc``'s type and the first line of its message, shortened."""
    return f"{type(exc).__name__}: {first_line(exc)}"


def stopped(exc: BaseException, what: str, hint: str = "", error: type[Exception] = WaitError) -> Exception:
    """Log ``exc`` once with its traceback, as the reason the wait for ``what`` stopped, and
    return ``error`` with that reason in one line (for ``raise stopped(...) from exc``)."""
    message = (
        f"stopped waiting for {what}: {_line(exc)}, an error waiting longer cannot fix (its traceback "
        f"is logged){'; ' + hint if hint else ''}"
    )
    log.error("%s", message, exc_info=exc)
    return error(message)


def wait_until(
    check: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    retry_on: RetryOn = (),
    poll_s: float = 0.5,
    hint: str = "",
    error: type[Exception] = WaitError,
) -> T:
    """``check()``'s first truthy result, asked every ``poll_s`` for up to ``timeout_s`` seconds
    (at least once). Guarantees: only exceptions ``retry_on`` matches are retried; ``error``
    raised by ``check`` and a defect of wavepipe (``BUGS``) pass through as themselves; any other
    exception ends the wait at once, logged once with its traceback and raised as ``error`` from
    it; a timeout raises ``error`` naming ``what`` and the last expected error. Never catches ``BaseException`` (Ctrl-C ends the wait)."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except (error, *BUGS):  # a defect of the check is raised as itself, never as a wait that ended
            raise
        except Exception as exc:
            if not expected(exc, retry_on):
                raise stopped(exc, what, hint, error) from exc
            last = exc
            log.debug("waiting for %s: %s", what, _line(exc))
        left = deadline - time.monotonic()
        if left <= 0:
            because = f" (last error: {_line(last)})" if last is not None else ""
            raise error(f"gave up waiting for {what} after {timeout_s:g}s{because}{'; ' + hint if hint else ''}")
        time.sleep(min(poll_s, left))
