"""``wavepipe.processes.supervise``: a local Airflow service that crashes after running a
while is started again; one that fails at its start, stops cleanly or is killed is not."""

from __future__ import annotations

import sys

from wavepipe.processes import supervise


def _service(tmp_path, body: str) -> list[str]:
    """A service that counts its starts in ``starts`` and then runs ``body`` (``n``: its start)."""
    code = (
        f"import os, sys, time; p = {str(tmp_path / 'starts')!r}; "
        "n = (int(open(p).read()) if os.path.exists(p) else 0) + 1; open(p, 'w').write(str(n)); " + body
    )
    return [sys.executable, "-c", code]


def test_a_service_that_crashes_after_running_a_while_is_started_again(tmp_path):
    said = []
    argv = _service(tmp_path, "time.sleep(0.3); sys.exit(1 if n < 3 else 0)")
    assert supervise(argv, min_uptime_s=0.2, pause_s=0, say=lambda *a, **k: said.append(a[0])) == 0
    assert (tmp_path / "starts").read_text() == "3"
    assert len(said) == 2 and "exited with 1" in said[0] and "starting it again" in said[0]


def test_a_crash_at_start_or_a_kill_ends_the_supervision_with_its_code(tmp_path):
    assert supervise(_service(tmp_path, "sys.exit(3)"), min_uptime_s=5, say=lambda *a, **k: None) == 3
    assert (tmp_path / "starts").read_text() == "1", "a start that fails is the caller's to report"
    killed = _service(tmp_path, "time.sleep(0.3); os.kill(os.getpid(), 9)")
    assert supervise(killed, min_uptime_s=0.1, say=lambda *a, **k: None) == -9
    assert (tmp_path / "starts").read_text() == "2", "a killed service was stopped by someone: not restarted"


def test_every_local_airflow_service_runs_under_a_supervisor_that_loads_nothing_heavy(tmp_path):
    import subprocess

    from wavepipe.contracts.config import Settings
    from wavepipe.local import airflow as local
    from wavepipe.local.airflow_service import killed_line

    commands = local._commands(Settings(home=tmp_path))
    assert set(commands) == set(local.PROCESSES)
    assert all("run_service()" in argv[2] and argv[3] == name for name, argv in commands.items()), commands
    probe = (
        "import sys, wavepipe.local.airflow_service; print(sorted({'airflow', 'pyarrow', 'numpy'} & set(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded  # four supervisors: about 17 MiB each, not 76
    assert killed_line("api-server", -9) == (
        "wavepipe: airflow api-server was ended by SIGKILL; `wavepipe airflow up` starts it again"
    )
