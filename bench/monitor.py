"""Peak memory and CPU per role, sampled from /proc while a system runs.

Every ``interval`` seconds the monitor walks this process's descendants (and the broker, and the
Spark engine's processes) and files each process under a role by its command line. A process's
own peak comes from the kernel's high-water mark (``VmHWM``), so a spike between two samples is
not missed; a role's peak is the largest sum of its processes' RSS seen in one sample (several
Python workers at once, say). Processes that were running before the measurement (the long-lived
Spark engine, its warm Python workers) count from their samples and their CPU since it began:
their high-water mark may be an earlier run's.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import psutil

ROLES = {
    "consumer": "Kafka reader / consumer processes",
    "spark_jvm": "Spark JVM (driver and executors: local mode runs both in one JVM; the engine's when attached)",
    "spark_python_driver": "Spark app's Python driver",
    "spark_python_workers": "Spark's Python workers",
    "broker": "Kafka broker",
    "harness": "the benchmark process itself (wavepipe's plan and commit run here)",
}


def role_of(cmdline: list[str]) -> str | None:
    text = " ".join(cmdline)
    exe = os.path.basename(cmdline[0]) if cmdline else ""
    if "org.apache.spark.deploy.SparkSubmit" in text:
        return "spark_jvm"
    if "pyspark.daemon" in text or "pyspark.worker" in text or "pyspark/daemon" in text:
        return "spark_python_workers"
    if exe.startswith("python") and ("spark_apps" in text or "spark_kafka_app" in text):
        return "spark_python_driver"
    if "resource_tracker" in text:
        return None
    if exe == "kcat" or "multiprocessing.spawn" in text or "wavepipe.bench.clients" in text:
        return "consumer"
    return None  # shells and launchers: not counted


@dataclass
class _Proc:
    role: str
    hwm_kb: int = 0
    cpu_s: float = 0.0
    #: running before the measurement: peak from samples, CPU counted from ``cpu0``
    earlier: bool = False
    cpu0: float = 0.0


@dataclass
class RoleStats:
    peak_rss_mb: float = 0.0
    max_process_rss_mb: float = 0.0
    cpu_s: float = 0.0
    processes: int = 0


@dataclass
class Monitor:
    broker_pid: int | None = None
    #: the Spark engine's server (a Spark Connect server the runs attach to), if any
    engine_pid: int | None = None
    #: a server whose processes are not the measured system's (the engine, idle beside another
    #: system): left out, also where it is a child of this process
    ignore_pid: int | None = None
    interval: float = 0.2
    _procs: dict[int, _Proc] = field(default_factory=dict)
    _peaks: dict[str, float] = field(default_factory=dict)
    _broker_cpu0: float = 0.0
    _harness_cpu0: float = 0.0

    def __enter__(self) -> Monitor:
        self._stop = threading.Event()
        self._me = psutil.Process()
        self._harness_cpu0 = _cpu(self._me)
        self._broker = psutil.Process(self.broker_pid) if self.broker_pid else None
        self._broker_cpu0 = _cpu(self._broker) if self._broker else 0.0
        self._engine = None
        # processes already running (an engine a run started, its Python workers): only the CPU
        # they spend from now on is this measurement's
        for proc in self._me.children(recursive=True):
            try:
                role = role_of(proc.cmdline())
                if role is not None:
                    self._procs[proc.pid] = _Proc(role, earlier=True, cpu0=_cpu(proc))
            except psutil.Error:
                continue
        if self.engine_pid:
            try:
                self._engine = psutil.Process(self.engine_pid)
                for proc in [self._engine, *self._engine.children(recursive=True)]:
                    self._procs[proc.pid] = _Proc(role_of(proc.cmdline()) or "spark_jvm", earlier=True, cpu0=_cpu(proc))
            except psutil.Error:
                self._engine = None
        self._thread = threading.Thread(target=self._loop, name="bench-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        sums: dict[str, float] = {}
        try:
            children = self._me.children(recursive=True)
        except psutil.Error:
            children = []
        if self._engine is not None:
            try:
                children += [self._engine, *self._engine.children(recursive=True)]
            except psutil.Error:
                pass
        if self.ignore_pid:
            try:
                ignored = psutil.Process(self.ignore_pid)
                skip = {self.ignore_pid, *(c.pid for c in ignored.children(recursive=True))}
                children = [c for c in children if c.pid not in skip]
            except psutil.Error:
                pass
        for child in children:
            try:
                proc = self._procs.get(child.pid)
                if proc is None:
                    role = role_of(child.cmdline())
                    if role is None:
                        continue
                    proc = self._procs[child.pid] = _Proc(role)
                rss_kb, hwm_kb = _rss_hwm_kb(child.pid)
                proc.hwm_kb = max(proc.hwm_kb, rss_kb if proc.earlier else hwm_kb)
                proc.cpu_s = max(proc.cpu_s, _cpu(child) - proc.cpu0)
                sums[proc.role] = sums.get(proc.role, 0.0) + rss_kb / 1024
            except (psutil.Error, FileNotFoundError, ProcessLookupError):
                continue
        for role, rss_mb in [
            *sums.items(),
            ("harness", _rss_hwm_kb(os.getpid())[0] / 1024),
            ("broker", self._broker_rss_mb()),
        ]:
            self._peaks[role] = max(self._peaks.get(role, 0.0), rss_mb)

    def _broker_rss_mb(self) -> float:
        if self._broker is None:
            return 0.0
        try:
            return self._broker.memory_info().rss / 1024 / 1024
        except psutil.Error:
            return 0.0

    def stats(self) -> dict[str, dict]:
        out: dict[str, RoleStats] = {}
        for proc in self._procs.values():
            s = out.setdefault(proc.role, RoleStats())
            s.max_process_rss_mb = max(s.max_process_rss_mb, proc.hwm_kb / 1024)
            s.cpu_s += proc.cpu_s
            s.processes += 1
        for role, peak in self._peaks.items():
            s = out.setdefault(role, RoleStats(processes=1))
            s.peak_rss_mb = max(peak, s.max_process_rss_mb if role not in ("broker", "harness") else 0.0)
            if role in ("broker", "harness"):
                s.max_process_rss_mb = peak
        if self._broker is not None and "broker" in out:
            try:
                out["broker"].cpu_s = _cpu(self._broker) - self._broker_cpu0
            except psutil.Error:
                pass
        out.setdefault("harness", RoleStats(processes=1)).cpu_s = _cpu(self._me) - self._harness_cpu0
        return {
            role: {k: round(v, 1) if isinstance(v, float) else v for k, v in vars(s).items()}
            for role, s in sorted(out.items())
            if s.peak_rss_mb or s.cpu_s
        }


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` and its descendants have used so far."""
    root = psutil.Process(pid)
    return sum(_cpu(p) for p in [root, *root.children(recursive=True)])


def _rss_hwm_kb(pid: int) -> tuple[int, int]:
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm
