"""Kafka client callbacks named by dotted path (``{"oauth_cb": "team.tokens.mint"}``).

A run hands its librdkafka configuration to other processes (readers, Airflow tasks) as data,
so a callback travels as the dotted path of a module-level function, as the apache-kafka
provider's Connections name them, and each process imports it itself right before it makes a
client (``resolved``). A path that does not import to a callable is refused before a run starts
(``refused_callbacks``), naming the key and the path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from wavepipe.contracts.errors import UsageError

#: librdkafka (confluent-kafka) properties whose values are callables: the apache-kafka
#: provider's ``CALLBACK_CONFIG_KEYS`` (a unit test keeps the two equal; this module does not
#: import Airflow, as reader processes do not).
CALLBACK_KEYS = ("error_cb", "throttle_cb", "stats_cb", "log_cb", "oauth_cb", "on_commit")


class CallbackError(UsageError):
    """A callback property whose value is not the dotted path of an importable callable."""


def import_callback(key: str, value: Any) -> Callable[..., Any]:
    """The callable ``value`` names (``package.module.function``), imported as Airflow's
    ``import_string`` does; a callable is returned as it is. A ``CallbackError`` (one line,
    naming the key and the path) if it does not import to a callable."""
    if callable(value):
        return value
    if not isinstance(value, str) or "." not in value.strip(".") or " " in value:
        raise CallbackError(
            f"{key}={value!r} is not a dotted path: give the module and function, e.g. "
            f'"{key}": "mypkg.kafka_auth.{key}"'
        )
    module_name, _, attribute = value.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CallbackError(
            f"{key}={value!r}: module {module_name!r} cannot be imported ({exc}); install it where "
            "wavepipe runs or fix the path"
        ) from None
    found = getattr(module, attribute, None)
    if found is None:
        raise CallbackError(f"{key}={value!r}: module {module_name!r} has no {attribute!r}; fix the path")
    if not callable(found):
        raise CallbackError(f"{key}={value!r} names a {type(found).__name__}, not a function; fix the path")
    return found


def refused_callbacks(config: Mapping[str, Any]) -> str | None:
    """Why the callback properties of ``config`` cannot be used by every process of a run (one
    line naming the key and the value), or None: each must be a dotted path that imports to a
    callable here (a callable object itself cannot be handed to another process)."""
    for key in CALLBACK_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if callable(value):
            return (
                f"{key} is a Python object, which wavepipe cannot hand to its reader processes: "
                f'name it by dotted path instead, e.g. "{key}": "mypkg.kafka_auth.{key}"'
            )
        try:
            import_callback(key, value)
        except CallbackError as exc:
            return str(exc)
    return None


def both(first: Callable[..., Any], second: Callable[..., Any]) -> Callable[..., Any]:
    """A callback that calls ``first`` then ``second`` with the same arguments (returning what
    ``second`` returns): a user's ``error_cb`` and wavepipe's own are both heard."""

    def call(*args: Any) -> Any:
        first(*args)
        return second(*args)

    return call


def resolved(config: Mapping[str, Any], own: Mapping[str, Callable[..., Any]] | None = None) -> dict[str, Any]:
    """``config`` with its dotted-path callbacks imported (``import_callback``) and wavepipe's
    ``own`` callbacks added; where ``config`` names the same key, both are called, wavepipe's
    first (a user's callback that raises cannot keep wavepipe from hearing an error)."""
    out = dict(config)
    for key in CALLBACK_KEYS:
        if out.get(key) is not None:
            out[key] = import_callback(key, out[key])
    for key, callback in (own or {}).items():
        out[key] = both(callback, out[key]) if out.get(key) is not None else callback
    return out
