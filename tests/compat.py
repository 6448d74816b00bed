"""The dependency sets the compatibility tier installs wavepipe's wheel with: the oldest its ranges
allow (every lower bound of its own requirements pinned, the rest resolved by pip) and the newest
(no constraint: pip's newest releases within the ranges, on the newest Python found)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

#: The sets, in the order the tier runs them.
SETS = ("oldest", "newest")
#: What Airflow's constraints file would hold back for the oldest Airflow (a team installs Airflow
#: with it): Airflow 3.2.0 asks for fastapi>=0.129.0 with no ceiling, and FastAPI 0.156.1 (October
#: 2026) breaks its task execution API at start ("Model 'TITerminalStatePayload' needs a
#: discriminator field"). Airflow 3.3 holds FastAPI back itself.
OLDEST_AIRFLOW_PINS = ["fastapi<0.156.1"]
#: Interpreters the newest set looks for, newest first (the package's Python classifiers).
PYTHONS = ("python3.13", "python3.12")


def lowest_pins(requires: list[str]) -> list[str]:
    """``name==lower`` for each requirement with a lower bound (``>=``); a requirement for an extra
    (``; extra == "test"``) is left out. Raises when a requirement of the package itself has no
    lower bound: every range must say where its tested floor is."""
    pins = []
    for requirement in map(Requirement, requires):
        if requirement.marker and "extra" in str(requirement.marker):
            continue
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        if not lower:
            raise ValueError(f"requirement without a lower bound: {str(requirement)!r}")
        pins.append(f"{requirement.name}=={lower[0]}")
    return pins


def newest_python() -> str:
    """The newest supported Python on PATH or installed by pyenv, else the one running the tests."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for name in PYTHONS:
        for found in (shutil.which(name), *sorted(pyenv.glob(f"*/bin/{name}"), reverse=True)):
            if found and _can_make_a_venv(str(found)):
                return str(found)
    return sys.executable


def _can_make_a_venv(python: str) -> bool:
    """``python`` runs (a pyenv shim of a version not selected does not) and has venv and pip."""
    return subprocess.run([python, "-c", "import venv, ensurepip"], capture_output=True, check=False).returncode == 0
