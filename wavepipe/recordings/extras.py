"""The optional packages the recordings need (obspy, soundfile, wfdb, xarray), imported only when
a function needs one; a missing one raises ``MissingExtraError`` naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from wavepipe.contracts.errors import UsageError

#: The extra that installs each optional package.
EXTRAS = {"obspy": "seismic", "soundfile": "audio", "wfdb": "ecg", "xarray": "xarray"}


class MissingExtraError(UsageError, ImportError):
    """An optional package a recordings function needs is not installed; the message names the extra."""


def require(module: str) -> ModuleType:
    """The optional package ``module`` (a key of ``EXTRAS``), imported; ``MissingExtraError`` if absent."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS[module]
        raise MissingExtraError(f"{module} is not installed: pip install 'wavepipe[{extra}]'") from exc
