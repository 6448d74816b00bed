"""One local Airflow service's process (``wavepipe airflow up`` starts each as
``python -c "from wavepipe.local.airflow_service import run_service; run_service()" <command>``):
a supervisor that imports nothing heavy, and under it the service, whose log servers listen on
loopback only."""

from __future__ import annotations

import os
import sys

from wavepipe import processes

#: Every local service listens here only: the API server, and the log servers that the scheduler
#: ([logging] worker_log_server_port) and the triggerer (trigger_log_server_port) start.
LOOPBACK = "127.0.0.1"


def loopback_hostname() -> str:
    """The local services' ``[core] hostname_callable``: the address their log servers listen on."""
    return LOOPBACK


#: Set in a service ``run_service`` supervises (the service itself, not its supervisor).
SUPERVISED = "WAVEPIPE_AIRFLOW_SUPERVISED"


def run_service() -> None:
    """``airflow <sys.argv[1:]>`` whose log server (started by the scheduler and the triggerer)
    listens on ``LOOPBACK`` only; Airflow 3.3 binds it to every interface and has no setting.

    Supervised: a service whose loop dies on an error it does not handle (on SQLite, a backfill
    whose creation the API rolled back under the scheduler's update ends the scheduler with
    ``StaleDataError``) is started again, so queued runs do not wait for a scheduler that is gone
    and tasks do not fail on an API server that is gone. One ended by a signal from outside stays
    down until ``up``, which the last line of its log names."""
    if os.environ.get(SUPERVISED) != "1":
        os.environ[SUPERVISED] = "1"
        code = processes.supervise(
            [sys.executable, "-c", f"from {__name__} import run_service; run_service()", *sys.argv[1:]]
        )
        if code < 0:  # a signal from outside (the OOM killer, a user): `down` would have ended this process too
            print(killed_line(sys.argv[1], code), flush=True)
        sys.exit(code)
    import airflow.utils.serve_logs as serve_logs
    from airflow.__main__ import main

    serve_logs.serve_logs = serve_logs_on_loopback  # the commands import it from there when they start it
    if sys.argv[1:2] == ["scheduler"]:
        preload_task_modules()
    sys.exit(main())


def killed_line(service: str, code: int) -> str:
    """What a supervised service's log says last when a signal ended it (``code`` < 0)."""
    import signal

    return (
        f"wavepipe: airflow {service} was ended by {signal.Signals(-code).name}; `wavepipe airflow up` starts it again"
    )


#: What a wavepipe task imports to run (Great Expectations alone takes about 3 s).
TASK_MODULES = ("great_expectations", "wavepipe.spark_apps.engine_run", "wavepipe.pipeline", "matplotlib.figure")


def preload_task_modules() -> None:
    """Import ``TASK_MODULES`` in the scheduler before its LocalExecutor forks the workers that
    fork each task: a task, such as a run the lag watcher starts, begins with them imported
    instead of importing them first (the scheduler's memory grows by about 250 MB, shared with
    the processes it forks). Only imports: no thread, client or connection is made. GX's
    registry of its documented functions says a line for each it skips: not in these logs."""
    import importlib
    import logging

    logging.getLogger("great_expectations._docs_decorators").setLevel(logging.WARNING)
    for name in TASK_MODULES:
        importlib.import_module(name)


def serve_logs_on_loopback(port: int | None = None) -> None:
    """Airflow's log server (the app ``airflow.utils.serve_logs.core.serve_logs`` runs, with the
    same settings), bound to ``LOOPBACK``."""
    import logging

    import uvicorn
    from airflow.configuration import conf
    from setproctitle import setproctitle

    setproctitle("airflow serve-logs")
    port = port or conf.getint("logging", "worker_log_server_port")
    logging.getLogger(__name__).info("Starting log server on http://%s:%d", LOOPBACK, port)
    uvicorn.run(
        "airflow.utils.serve_logs.log_server:get_app",
        factory=True,
        host=LOOPBACK,
        port=port,
        log_level=conf.get("logging", "uvicorn_logging_level", fallback="info").lower(),
        log_config=None,
        access_log=False,
    )
