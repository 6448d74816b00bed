"""What every wavepipe Spark app does before its work: logging, the settings, the run's plan."""

from __future__ import annotations

import logging

from wavepipe.contracts.config import Settings, load_settings
from wavepipe.run_store import Run, RunStore


def load_run(run_id: str, log: logging.Logger) -> Run | None:
    """Log as the CLI does; the run, with the settings spark-submit passed on in the environment
    (None, logged as an error, when the run has no plan)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("py4j", "great_expectations"):
        logging.getLogger(name).setLevel(logging.WARNING)
    settings = load_settings()
    run = Run.load(settings, run_id)
    if run is None:
        log.error("run %s has no plan under %s", run_id, RunStore(settings).runs_location)
    return run


#: How long a Spark app waits for another one writing the same tables before it gives up.
OUTPUT_LOCK_WAIT_S = 1800.0


def output_lock(settings: Settings, store: RunStore, wait_s: float = OUTPUT_LOCK_WAIT_S, what: str = "a Spark app"):
    """Held for a Spark app's life, per output table folder: an app whose launching step died
    keeps running (it has its own session); a retry, a new run after `wavepipe abandon`, or a
    backfill beside the incremental runs waits here (up to ``wait_s``) instead of writing beside
    it. ``what``: who holds it, as a waiting step names it."""
    return store.lock("tables/.reassemble.lock", f"{what} writing {settings.tables_location}", wait_s=wait_s)
