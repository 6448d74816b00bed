"""What every wavepipe Spark app does before its work: logging, the settings, the run's plan."""

from __future__ import annotations

import logging

from wavepipe.contracts.config import Settings, load_settings
from wavepipe.contracts.plan import RunPlan
from wavepipe.contracts.runfiles import RunStore


def load_run(run_id: str, log: logging.Logger) -> tuple[Settings, RunStore, RunPlan | None]:
    """Log as the CLI does; the settings (from the environment spark-submit passed on), the run
    store and the run's plan (None, logged as an error, when the run has none)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("py4j", "great_expectations"):
        logging.getLogger(name).setLevel(logging.WARNING)
    settings = load_settings()
    store = RunStore(settings)
    plan = store.load_plan(run_id)
    if plan is None:
        log.error("run %s has no plan under %s", run_id, store.runs_location)
    return settings, store, plan


#: How long a Spark app waits for another one writing the same tables before it gives up.
OUTPUT_LOCK_WAIT_S = 1800.0


def output_lock(settings: Settings, store: RunStore):
    """Held for a Spark app's life, per output table folder: an app whose launching step died
    keeps running (it has its own session); a retry, a new run after `wavepipe abandon`, or a
    backfill beside the incremental runs waits here (up to ``OUTPUT_LOCK_WAIT_S``) instead of
    writing beside it."""
    return store.lock(
        "tables/.reassemble.lock", f"a Spark app writing {settings.tables_location}", wait_s=OUTPUT_LOCK_WAIT_S
    )
