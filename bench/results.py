"""Benchmark results as a markdown page and a chart; the goals are evaluated from the numbers."""

from __future__ import annotations

import statistics
from pathlib import Path

from wavepipe.bench.monitor import ROLES
from wavepipe.bench.systems import DESCRIBE_STAGE, LABELS, ON_ENGINE
from wavepipe.contracts.config import source_checkout


def default_results_dir() -> Path:
    """Where a full bench saves its results: a checkout's docs/benchmarks (they are committed),
    else ``wavepipe-bench`` in the working folder (an installed wavepipe has no docs/)."""
    root = source_checkout()
    return root / "docs" / "benchmarks" if root else Path.cwd() / "wavepipe-bench"


def save_page(result: dict, out_dir: Path, name: str, to_markdown, chart) -> list[Path]:
    """``<name>.json``, ``<name>.png`` (``chart(result, path)``) and ``<name>.md``
    (``to_markdown(result)``) in ``out_dir``. The chart only describes: a failure to draw it is
    logged, never a lost result."""
    import json
    import logging

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.json"]
    paths[0].write_text(json.dumps(result, indent=1, default=str) + "\n")
    png = out_dir / f"{name}.png"
    try:
        chart(result, png)
        paths.append(png)
    except Exception as exc:
        logging.getLogger("wavepipe.bench").warning("could not draw %s: %s", png, exc)
    md = out_dir / f"{name}.md"
    md.write_text(to_markdown(result))
    return [*paths, md]


CEILINGS = ("ceiling_kcat", "ceiling_confluent")
MEMORY_GROWTH_LIMIT = 0.20
#: Roles whose peak memory should not grow with the backlog (beside the readers').
GROWTH_ROLES = ("spark_jvm", "spark_python_driver", "spark_python_workers")


def _by(results: dict, repeats: bool = False, **match) -> list[dict]:
    """The measurements that match; ``repeats``: also the quality pair's repeated ones."""
    return [
        m
        for m in results["measurements"]
        if all(m[k] == v for k, v in match.items()) and (repeats or not m.get("repeat"))
    ]


def _one(results: dict, **match) -> dict | None:
    found = [m for m in _by(results, **match) if not m["error"]]
    return found[0] if found else None


def _peak(m: dict | None, role: str) -> float | None:
    """A role's peak: its largest process's, or for Spark's Python workers (many small processes
    that grow in number) their largest sum at one sample."""
    if not m or role not in m["memory"]:
        return None
    return m["memory"][role]["peak_rss_mb" if role == "spark_python_workers" else "max_process_rss_mb"]


#: The small run with the engine warm (ten 1 MiB waveforms): its goal, plan to commit (issue 48).
WARM_RUN_GOAL_S = 1.0
#: wavepipe's speed-up goals over the alternatives, per workload (wall time of theirs over ours;
#: issue 48: at least the hand-written consumer's speed, at every scale).
SPEEDUP_GOALS = {
    "large": (("spark_kafka_source", 2.0), ("python_consumer", 1.0)),
    "small": (("spark_kafka_source", 2.0), ("python_consumer", 1.0)),
}
#: wavepipe's CPU seconds (every process of the run, its own included) over the hand-written
#: consumer's for the same bytes, at most (issue 48).
CPU_GOAL = 1.5
#: The run with its tables, staging and state on the local object store, over the local run, at
#: most (issue 48).
OBJECT_STORE_GOAL = 1.5
#: wavepipe measuring every waveform's quality over the same run without, at most, with as many
#: Spark jobs (issue 49).
QUALITY_GOAL = 1.10


def cpu_seconds(m: dict | None) -> float | None:
    """The CPU seconds of every process a measurement sampled (the broker's, the harness's, ...)."""
    if not m or not m.get("memory"):
        return None
    return sum(role["cpu_s"] for role in m["memory"].values())


def warm_runs(results: dict) -> list[dict]:
    """The warm small runs, in order (the first one in a new home creates its tables)."""
    return sorted(
        (m for m in _by(results, workload="warm_small") if not m["error"]), key=lambda m: m["info"].get("repeat", 0)
    )


def to_commit_s(m: dict) -> float:
    """A wavepipe run's seconds from its plan to its commit: its wall time but what describes it
    after the commit (``DESCRIBE_STAGE``)."""
    return m["wall_s"] - m["stages"].get(DESCRIBE_STAGE, 0.0)


def warm_run_seconds(results: dict) -> float | None:
    """The steady state of a small run with the engine warm: the median time from plan to commit
    of the runs after the first (the first alone if there is one)."""
    runs = warm_runs(results)
    walls = sorted(to_commit_s(m) for m in (runs[1:] or runs))
    if not walls:
        return None
    mid = len(walls) // 2
    return walls[mid] if len(walls) % 2 else (walls[mid - 1] + walls[mid]) / 2


def _speedup(results: dict, workload: str, scale: int, alt: str) -> float | None:
    wp = _one(results, system="wavepipe", workload=workload, scale=scale)
    other = _one(results, system=alt, workload=workload, scale=scale)
    return other["wall_s"] / wp["wall_s"] if wp and other else None


def goals(results: dict) -> list[tuple[str, bool | None, str]]:
    """(goal, met?, the numbers) for each goal of the benchmark; None where it was not measured."""
    out = []
    scale = results["options"]["scale"]
    for workload, needs in SPEEDUP_GOALS.items():
        for alt, need in needs:
            speedup = _speedup(results, workload, 1, alt)
            out.append(
                (
                    f"wavepipe >= {need}x {LABELS[alt]} ({workload})",
                    None if speedup is None else speedup >= need,
                    "not measured" if speedup is None else f"{speedup:.2f}x",
                )
            )
    for workload in SPEEDUP_GOALS:
        out.append(_cpu_goal(results, workload))
        if "wavepipe_s3" in results["options"].get("systems", ()):  # a mode of its own, left out of --quick
            out.append(_object_store_goal(results, workload))
        if "wavepipe_no_qc" in results["options"].get("systems", ()):
            out.append(_quality_goal(results, workload))
    out.append(_plan_reads_goal(results))
    if scale > 1:
        for workload, needs in SPEEDUP_GOALS.items():
            need = dict(needs)["python_consumer"]
            speedup = _speedup(results, workload, scale, "python_consumer")
            out.append(
                (
                    f"wavepipe >= {need}x {LABELS['python_consumer']} ({workload} x{scale})",
                    None if speedup is None else speedup >= need,
                    "not measured" if speedup is None else f"{speedup:.2f}x",
                )
            )
        many = _one(results, system="wavepipe", workload="large", scale=scale)
        share = many["of_ceiling"] if many else None
        out.append(
            (
                f"wavepipe end to end >= 15% of the ceiling (large x{scale})",
                None if share is None else share >= 0.15,
                "not measured" if share is None else f"{share:.0%} of the ceiling",
            )
        )
    warm = warm_run_seconds(results)
    runs = warm_runs(results)
    out.append(
        (
            f"a small run (ten 1 MiB waveforms) with the engine warm takes <= {WARM_RUN_GOAL_S:g} s "
            "from plan to commit",
            None if warm is None else warm <= WARM_RUN_GOAL_S,
            "not measured"
            if warm is None
            else f"{warm:.1f} s, one run, the first in its home"
            if len(runs) == 1
            else f"{warm:.1f} s, the median of {len(runs) - 1} run(s) after the first; the first took "
            f"{to_commit_s(runs[0]):.1f} s; with their description after the commit, "
            f"{statistics.median(m['wall_s'] for m in runs[1:]):.1f} s",
        )
    )
    for workload in ("large", "small"):
        wp = _one(results, system="wavepipe", workload=workload, scale=1)
        gate = sum(v for k, v in (wp or {}).get("stages", {}).items() if k.startswith("validate: "))
        name = f"the validation gate adds <= 1/3 to wavepipe's wall time ({workload})"
        if not wp or not gate:
            out.append((name, None, "not measured"))
        else:
            rest = wp["wall_s"] - gate
            out.append(
                (
                    name,
                    gate <= rest / 3,
                    f"+{gate:.1f} s on {rest:.1f} s ({gate / rest:.0%}; publishing, the run's one write of "
                    "the output, not included)",
                )
            )
    if scale > 1:
        for workload in ("large", "small"):
            one = _one(results, system="wavepipe", workload=workload, scale=1)
            many = _one(results, system="wavepipe", workload=workload, scale=scale)
            # the roles this mode has: readers and the engine (server JVM and its Python workers),
            # or with spark-submit the apps' JVM and Python driver
            present = {role for m in (one, many) if m for role in m["memory"]}
            for role in [r for r in ("consumer", *GROWTH_ROLES) if r == "consumer" or r in present]:
                a, b = _peak(one, role), _peak(many, role)
                name = f"wavepipe {ROLES[role].split(' (')[0]} peak RSS grows < 20% at {scale}x ({workload})"
                if a is None or b is None:
                    out.append((name, None, "not measured"))
                else:
                    growth = b / a - 1
                    out.append((name, growth < MEMORY_GROWTH_LIMIT, f"{a:.0f} -> {b:.0f} MB ({growth:+.0%})"))
    return out


def _cpu_goal(results: dict, workload: str) -> tuple[str, bool | None, str]:
    wp = _one(results, system="wavepipe", workload=workload, scale=1)
    hand = _one(results, system="python_consumer", workload=workload, scale=1)
    ours, theirs = cpu_seconds(wp), cpu_seconds(hand)
    name = f"wavepipe's CPU seconds <= {CPU_GOAL}x {LABELS['python_consumer']}'s ({workload})"
    if not ours or not theirs:
        return name, None, "not measured"
    return name, ours <= CPU_GOAL * theirs, f"{ours:.1f} s against {theirs:.1f} s ({ours / theirs:.2f}x)"


def quality_medians(results: dict, workload: str) -> tuple[float, float] | None:
    """The median wall time of wavepipe's runs of ``workload`` at 1x and of the runs without
    quality metrics (their first measurements and the repeats, alternated); None: not both."""
    walls = [_walls(results, system, workload) for system in ("wavepipe", "wavepipe_no_qc")]
    return (statistics.median(walls[0]), statistics.median(walls[1])) if all(walls) else None


def _walls(results: dict, system: str, workload: str) -> list[float]:
    return sorted(m["wall_s"] for m in _by(results, True, system=system, workload=workload, scale=1) if not m["error"])


def _quality_goal(results: dict, workload: str) -> tuple[str, bool | None, str]:
    name = (
        f"quality metrics add <= {QUALITY_GOAL - 1:.0%} to wavepipe's wall time, with as many Spark jobs ({workload})"
    )
    medians = quality_medians(results, workload)
    if medians is None:
        return name, None, "not measured"
    ratio = medians[0] / medians[1]
    systems = ("wavepipe", "wavepipe_no_qc")
    jobs = {
        m["info"].get("spark_jobs") for s in systems for m in _by(results, True, system=s, workload=workload, scale=1)
    }
    runs = " and ".join(", ".join(f"{w:.1f}" for w in _walls(results, s, workload)) for s in systems)
    return (
        name,
        ratio <= QUALITY_GOAL and len(jobs) == 1,
        f"median {medians[0]:.1f} s against {medians[1]:.1f} s ({ratio:.2f}x; runs {runs} s); "
        f"Spark jobs {', '.join(map(str, sorted(jobs, key=str)))}",
    )


def _plan_reads_goal(results: dict) -> tuple[str, bool | None, str]:
    """Each wavepipe run's process read its plan at most once (its report's ``state_io``)."""
    name = "a wavepipe run reads its plan at most once in its process"
    reads = [m["info"]["plan_reads"] for m in _by(results, True) if (m.get("info") or {}).get("plan_reads") is not None]
    if not reads:
        return name, None, "not measured"
    return name, max(reads) <= 1, f"at most {max(reads)} read(s) in each of {len(reads)} runs"


def _object_store_goal(results: dict, workload: str) -> tuple[str, bool | None, str]:
    local = _one(results, system="wavepipe", workload=workload, scale=1)
    remote = _one(results, system="wavepipe_s3", workload=workload, scale=1)
    name = f"wavepipe on the local object store <= {OBJECT_STORE_GOAL}x the local run ({workload})"
    if not local or not remote:
        return name, None, "not measured"
    ratio = remote["wall_s"] / local["wall_s"]
    return name, ratio <= OBJECT_STORE_GOAL, f"{remote['wall_s']:.1f} s against {local['wall_s']:.1f} s ({ratio:.2f}x)"


def figures(results: dict) -> dict[str, float]:
    """The figures the docs may quote from a bench run, by the key they name
    (``wavepipe.bench.figures``): ``<system> <workload> x<scale> wall_s|mb_s|of_ceiling``,
    ``... stage <stage>``, ``... wall/wavepipe`` (its wall time over wavepipe's on the same ranges),
    ``wavepipe ... x1 wall/wavepipe_no_qc`` (the median over the run without quality metrics'),
    ``wavepipe[_no_qc] ... x1 median wall_s`` (the median of the quality pair's runs),
    ``... spark_jobs``, ``... plan_reads`` (the run's reads of its plan in its process),
    ``... gate/rest`` (the validation gate's stages over the rest of the wall time, as the goal),
    ``... cpu_s`` (every sampled process's CPU seconds) and ``... cpu/python_consumer`` (over the
    hand-written consumer's on the same ranges),
    ``<system> <workload> growth <role>`` (peak RSS at the larger scale over 1x, minus 1),
    ``warm median`` (the goal's figure: plan to commit), ``warm median with description`` (and what
    describes the run after its commit), ``warm run <n>`` and ``scale``."""
    out = {"scale": results["options"]["scale"], "warm median": warm_run_seconds(results)}
    out |= {f"warm run {i}": to_commit_s(m) for i, m in enumerate(warm_runs(results), 1)}
    runs = warm_runs(results)
    out["warm median with description"] = statistics.median(m["wall_s"] for m in runs[1:] or runs) if runs else None
    for m in results["measurements"]:
        if m["error"] or m["workload"] == "warm_small" or m.get("repeat"):
            continue
        key = f"{m['system']} {m['workload']} x{m['scale']}"
        out |= {f"{key} {field}": m[field] for field in ("wall_s", "mb_s", "of_ceiling")}
        out |= {f"{key} stage {stage}": seconds for stage, seconds in m["stages"].items()}
        out[f"{key} cpu_s"] = cpu_seconds(m)
        wp = _one(results, system="wavepipe", workload=m["workload"], scale=m["scale"])
        if wp:
            out[f"{key} wall/wavepipe"] = m["wall_s"] / wp["wall_s"]
        medians = quality_medians(results, m["workload"]) if m["scale"] == 1 else None
        if medians and m["system"] in ("wavepipe", "wavepipe_no_qc"):
            out[f"{key} median wall_s"] = medians[m["system"] == "wavepipe_no_qc"]
        if medians and m["system"] == "wavepipe":
            out[f"{key} wall/wavepipe_no_qc"] = medians[0] / medians[1]
        if (m.get("info") or {}).get("spark_jobs") is not None:
            out[f"{key} spark_jobs"] = m["info"]["spark_jobs"]
        if (m.get("info") or {}).get("plan_reads") is not None:
            out[f"{key} plan_reads"] = m["info"]["plan_reads"]
        hand = _one(results, system="python_consumer", workload=m["workload"], scale=m["scale"])
        if hand and cpu_seconds(m) and cpu_seconds(hand):
            out[f"{key} cpu/python_consumer"] = cpu_seconds(m) / cpu_seconds(hand)
        gate = sum(s for stage, s in m["stages"].items() if stage.startswith("validate: "))
        if gate:
            out[f"{key} gate/rest"] = gate / (m["wall_s"] - gate)
        one = _one(results, system=m["system"], workload=m["workload"], scale=1)
        for role in m["memory"] if one and m["scale"] > 1 else ():
            if _peak(one, role) and _peak(m, role):
                out[f"{m['system']} {m['workload']} growth {role}"] = _peak(m, role) / _peak(one, role) - 1
    return {k: v for k, v in out.items() if v is not None}


def _fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def markdown(results: dict, chart_name: str) -> str:
    m = results["machine"]
    o = results["options"]
    lines = [
        "# wavepipe benchmark",
        "",
        f"`{results['command']}` at wavepipe commit {m.get('wavepipe_commit') or '?'}, started "
        f"{results['started_at']} UTC, {results['seconds']:.0f} s in all.",
        "",
        f"**Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}; Python {m['python']}; "
        f"Kafka {m['kafka']} (local KRaft broker); pyspark {m['pyspark']} (local[{o['parallelism']}]), "
        f"delta-spark {m['delta_spark']}; confluent-kafka {m['confluent_kafka']} (librdkafka {m['librdkafka']})"
        + (f"; {m['kcat']}" if m.get("kcat") else "; kcat not installed")
        + ".",
        "",
        f"All systems read the same offset ranges of one topic ({o['partitions']} partitions) right after it was "
        "produced, so the broker serves them from the page cache for everyone. Readers that run per partition "
        f"run {o['parallelism']} at a time. MB/s is payload megabytes (10^6) per second of wall time; "
        "\"of ceiling\" is the ceiling's wall time over the system's. Every output is checked: each produced "
        "waveform once, its sha256 as produced, a sample re-hashed.",
        "",
        f"![throughput]({chart_name})",
        "",
        "## Goals",
        "",
    ]
    for name, met, numbers in goals(results):
        mark = "not measured" if met is None else ("**met**" if met else "**missed**")
        lines.append(f"- {name}: {mark} ({numbers})")
    for workload in ("large", "small"):
        for scale in sorted({1, o["scale"]}):
            rows = _by(results, workload=workload, scale=scale)
            if not rows:
                continue
            first = rows[0]
            lines += [
                "",
                f"## {workload} x{scale}: {first['waveforms']} waveforms, {first['chunks']} chunks, "
                f"{first['payload_bytes'] / 2**20:.0f} MiB",
                "",
                "| system | wall s | MB/s | chunks/s | of ceiling | peak RSS MB: consumer | Spark JVM "
                "| Spark Python driver | Spark Python workers | broker | CPU s (all roles) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for r in rows:
                if r["error"]:
                    lines.append(f"| {LABELS[r['system']]} | failed: {r['error'][:120]} |||||||||||")
                    continue
                mem = r["memory"]
                cpu = sum(v["cpu_s"] for k, v in mem.items() if k not in ("broker", "harness"))
                cpu += mem.get("harness", {}).get("cpu_s", 0) if r["system"] in ON_ENGINE else 0
                lines.append(
                    f"| {LABELS[r['system']]} | {_fmt(r['wall_s'])} | {_fmt(r['mb_s'])} | {_fmt(r['chunks_s'], ',.0f')} "
                    f"| {_fmt(r['of_ceiling'], '.0%')} | {_fmt(_peak(r, 'consumer'), '.0f')} "
                    f"| {_fmt(_peak(r, 'spark_jvm'), '.0f')} | {_fmt(_peak(r, 'spark_python_driver'), '.0f')} "
                    f"| {_fmt(mem.get('spark_python_workers', {}).get('peak_rss_mb'), '.0f')} "
                    f"| {_fmt(_peak(r, 'broker'), '.0f')} | {cpu:.0f} |"
                )
    lines += _warm_section(results)
    lines += _object_store_section(results)
    lines += [
        "",
        "## Where wavepipe's time goes",
        "",
        "| workload | stage | seconds | share of wall |",
        "|---|---|---:|---:|",
    ]
    for r in _by(results, system="wavepipe"):
        if r["error"] or r["workload"] == "warm_small":  # in its own section
            continue
        for stage, seconds in r["stages"].items():
            lines.append(f"| {r['workload']} x{r['scale']} | {stage} | {seconds:.1f} | {seconds / r['wall_s']:.0%} |")
    lines += [
        "",
        "## Scaling: the same systems at {}x the backlog".format(o["scale"]),
        "",
        "| system | workload | wall 1x s | wall {0}x s | time ratio (ideal {0}) | peak RSS 1x -> {0}x MB "
        "(largest process) |".format(o["scale"]),
        "|---|---|---:|---:|---:|---|",
    ]
    for r in _by(results, scale=o["scale"]):
        base = _one(results, system=r["system"], workload=r["workload"], scale=1)
        if r["error"] or not base or o["scale"] == 1:
            continue
        biggest = max(
            (k for k in r["memory"] if k not in ("broker", "harness")),
            key=lambda k: r["memory"][k]["max_process_rss_mb"],
            default=None,
        )
        mem = "-" if biggest is None else (f"{biggest}: {_peak(base, biggest) or 0:.0f} -> {_peak(r, biggest):.0f}")
        lines.append(
            f"| {LABELS[r['system']]} | {r['workload']} | {base['wall_s']:.1f} | {r['wall_s']:.1f} "
            f"| {r['wall_s'] / base['wall_s']:.2f} | {mem} |"
        )
    lines += [
        "",
        "Roles: " + "; ".join(f"*{k}*: {v}" for k, v in ROLES.items()) + ". Peak RSS is each process's "
        "kernel high-water mark (VmHWM); for Spark's Python workers it is the largest sum of the workers "
        "alive at one sample.",
        "",
    ]
    if results.get("skipped"):
        lines += [f"Not run: {', '.join(results['skipped'])} (kcat is not installed).", ""]
    return "\n".join(lines)


def _object_store_section(results: dict) -> list[str]:
    """What putting the tables and the staging on S3 costs: the ``wavepipe_s3`` rows against
    wavepipe's on local disk, measured side by side in this invocation, in all and per stage."""
    pairs = [
        (local, s3)
        for s3 in _by(results, system="wavepipe_s3")
        if not s3["error"]
        for local in [_one(results, system="wavepipe", workload=s3["workload"], scale=s3["scale"])]
        if local and not local["error"]
    ]
    if not pairs:
        return []
    lines = [
        "",
        "## What object storage costs",
        "",
        "The same ranges run twice in this invocation, one after the other on the warm engine: on local disk, "
        "then with the staged chunks, the output tables and the run state in this machine's S3 store (SeaweedFS "
        "on loopback, the same disk: no network between them, so this is the cost of the S3 protocol, the "
        "uploads and S3A's commit, not of a remote store's latency).",
        "",
        "| workload | local s | S3 s | S3 / local | added s per run | added s per GiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for local, s3 in pairs:
        added, gib = s3["wall_s"] - local["wall_s"], s3["payload_bytes"] / 2**30
        lines.append(
            f"| {s3['workload']} x{s3['scale']} | {local['wall_s']:.1f} | {s3['wall_s']:.1f} "
            f"| {s3['wall_s'] / local['wall_s']:.2f}x | {added:+.1f} | {added / gib:+.1f} |"
        )
    lines += ["", "| workload | stage | local s | S3 s | difference s |", "|---|---|---:|---:|---:|"]
    for local, s3 in pairs:
        for stage in dict.fromkeys([*local["stages"], *s3["stages"]]):
            a, b = local["stages"].get(stage), s3["stages"].get(stage)
            diff = f"{b - a:+.1f}" if a is not None and b is not None else "-"
            lines.append(f"| {s3['workload']} x{s3['scale']} | {stage} | {_fmt(a)} | {_fmt(b)} | {diff} |")
    return lines


def _warm_section(results: dict) -> list[str]:
    lines = []
    start = results.get("engine_start")
    runs = warm_runs(results)
    if not start and not runs:
        return lines
    lines += ["", "## The Spark engine: cold start, and a small run with it warm", ""]
    if start:
        lines += [
            f"Cold start of the local Spark Connect server, on its own: {start['up_s']:.1f} s until it "
            f"accepts connections, then {start['attach_and_first_query_s']:.1f} s for a new session to "
            f"attach and run a first query; a query on the attached session then takes "
            f"{start['warm_query_s']:.2f} s. Every run below attaches to the warm server.",
            "",
        ]
    else:
        lines += [
            "The engine's cold start was not measured (runs used a remote engine, spark-submit, or the "
            "engine was busy).",
            "",
        ]
    warmup = results.get("engine_warmup") or []
    if warmup:
        walls = ", ".join("failed" if w["error"] else f"{w['wall_s']:.1f} s" for w in warmup)
        lines += [
            f"Then, before any measurement, {len(warmup)} throw-away small run(s) like those below warmed "
            f"the engine up (its JIT, its caches), as a long-lived engine is: {walls}.",
            "",
        ]
    if runs:
        stages = [k for k in runs[0]["stages"] if ":" not in k]
        lines += [
            "Ten 1 MiB waveforms (64 KiB chunks) produced, then one run timed from plan to commit, and with "
            "what describes it after the commit (its plots and Data Docs), repeated in one home and group (the "
            "first run creates the tables):",
            "",
            "| run | plan to commit s | with its description s | Spark jobs | "
            + " | ".join(f"{k} s" for k in stages)
            + " |",
            "|---:|---:|---:|---:|" + "---:|" * len(stages),
        ]
        for m in runs:
            jobs = m["info"].get("spark_jobs")
            lines.append(
                f"| {m['info'].get('repeat', '?')} | {to_commit_s(m):.1f} | {m['wall_s']:.1f} | "
                f"{'-' if jobs is None else jobs} | "
                + " | ".join(f"{m['stages'].get(k, 0):.1f}" for k in stages)
                + " |"
            )
    return lines


def chart(results: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o = results["options"]
    systems = [s for s in LABELS if _by(results, system=s)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        values = []
        for workload in ("large", "small"):
            m = _one(results, system=system, workload=workload, scale=1)
            values.append(m["mb_s"] if m else 0)
        bars = ax.bar([x + i * width for x in range(2)], values, width, label=LABELS[system])
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(
        [x + width * (len(systems) - 1) / 2 for x in range(2)], ["large (1 MiB / 64 KiB)", "small (16 KiB / 4 KiB)"]
    )
    ax.set_ylabel("MB/s (payload, wall time)")
    ax.set_title("Throughput on the same ranges (x1)")
    ax.legend(fontsize=7)
    ax = axes[1]
    if o["scale"] > 1:
        labels, before, after = [], [], []
        for workload in ("large", "small"):
            one = _one(results, system="wavepipe", workload=workload, scale=1)
            many = _one(results, system="wavepipe", workload=workload, scale=o["scale"])
            for role in ("consumer", "spark_jvm", "spark_python_driver", "spark_python_workers"):
                a, b = _peak(one, role), _peak(many, role)
                if a is not None and b is not None:
                    labels.append(f"{workload}\n{role.replace('spark_', '').replace('_', ' ')}")
                    before.append(a)
                    after.append(b)
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], before, 0.4, label="x1")
        ax.bar([x + 0.2 for x in xs], after, 0.4, label=f"x{o['scale']}")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_ylabel("peak RSS of the largest process, MB")
        ax.set_title(f"wavepipe memory at x1 and x{o['scale']} the backlog")
        ax.legend(fontsize=7)
    m = results["machine"]
    fig.suptitle(f"wavepipe bench, {results['started_at']} - {m['cpu']}, {m['cores']} cores", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
