"""``wavepipe``: one CLI over the same code paths the DAGs use."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import signal
import sys
import threading
import time
import traceback
from datetime import UTC, datetime

from wavepipe import __version__, maintenance, storage
from wavepipe.bench import consume_scaling, soak, table_layout, trickle, txn_state
from wavepipe.bench.figures import refresh_pages
from wavepipe.bench.lifecycle import stopping_what_it_starts
from wavepipe.bench.results import default_results_dir, goals
from wavepipe.bench.runner import BenchOptions, run_bench, save
from wavepipe.bench.systems import SYSTEMS, resolve_spark_kafka_jars
from wavepipe.checks import check_all
from wavepipe.contracts.config import Settings, load_settings, redact_url, source_checkout
from wavepipe.contracts.errors import BUGS, EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, WavepipeError
from wavepipe.contracts.plan import RunRequest, parse_datetime
from wavepipe.contracts.protocol import epoch_ns
from wavepipe.demo import run_demo
from wavepipe.follow import FollowOptions, follow
from wavepipe.jars import gcs_jars, kafka_jars, logstore_jar, s3_jars, spark_jars
from wavepipe.local.airflow import dags_test, run_cli
from wavepipe.local.cloud_emulators import emulators, prepare
from wavepipe.local.engine_server import LocalEngine
from wavepipe.local.kafka import LocalKafka
from wavepipe.local.objectstore import LocalObjectStore, weed_binary
from wavepipe.local.spark_cluster import LocalSparkCluster
from wavepipe.status import describe_move, group_status, status_lines


def _settings(args) -> Settings:

    settings = load_settings(home=args.home, bootstrap_servers=args.bootstrap_servers)
    storage.configure(settings)
    return settings


def cmd_objectstore(args) -> int:

    store = LocalObjectStore.from_settings(_settings(args))
    print({"up": store.up, "down": store.down, "status": store.status}[args.action]())
    return 0 if args.action != "status" or store.pid() else 1


def cmd_emulator(args) -> int:

    chosen = emulators(_settings(args))
    kinds = [args.store] if args.store != "all" else list(chosen)
    for kind in kinds:
        emulator = chosen[kind]
        print({"up": emulator.up, "down": emulator.down, "status": emulator.status}[args.action]())
    return 0 if args.action != "status" or all(chosen[k].pid() for k in kinds) else 1


def cmd_kafka(args) -> int:

    kafka = LocalKafka.from_settings(_settings(args))
    print({"up": kafka.up, "down": kafka.down, "status": kafka.status}[args.action]())
    return 0 if args.action != "status" or kafka.pid() else 1


def cmd_spark(args) -> int:
    settings = _settings(args)
    if settings.spark_remote and args.action not in ("status", "serve"):  # serve: the remote server itself
        print(
            f"spark_remote is set ({redact_url(settings.spark_remote)}): runs attach to that server, not to "
            "this home's; `wavepipe spark` manages this home's own server",
            file=sys.stderr,
        )
    engine = LocalEngine(settings)
    if args.action == "serve":
        print(
            f"serving the Spark engine on sc://{args.host}:{args.port} (master {settings.spark_master}) "
            "in the foreground",
            flush=True,
        )
        engine.serve(args.host, args.port)
    actions = {
        "up": engine.up,
        "status": engine.status,
        "down": lambda: engine.down(force=args.force),
        "restart": lambda: engine.restart(force=args.force),
    }
    print(actions[args.action]())
    return 0 if args.action != "status" or engine.pid() else 1


def cmd_spark_cluster(args) -> int:

    settings = _settings(args)
    cluster = LocalSparkCluster(settings.home / "spark", port=args.port, workers=args.workers)
    print({"up": cluster.up, "down": cluster.down, "status": cluster.status}[args.action]())
    if args.action == "up":
        print(
            f"Send runs there with WAVEPIPE_SPARK_MASTER={cluster.master_url} (then `wavepipe spark restart`: "
            "the engine runs on that master); `wavepipe spark-cluster down` stops it."
        )
    return 0 if args.action != "status" or cluster.pids() else 1


def cmd_produce(args) -> int:
    from wavepipe.consumers.kafka_admin import ensure_topic

    settings = _settings(args)
    if args.demo == bool(args.files):
        print("say what to produce: --demo, or --files PATH... (files, folders or globs)", file=sys.stderr)
        return 2
    ensure_topic(settings, args.topic)
    if args.topic:
        settings = settings.replace(topic=args.topic)
    return _produce_files(settings, args) if args.files else _produce_demo(settings, args)


def _produce_demo(settings, args) -> int:
    from wavepipe.consumers.producer import produce_demo

    began = time.monotonic()
    sent = produce_demo(settings, count=args.count, target_bytes=args.waveform_bytes)
    _say_produced(settings, sent, sent[0].waveform_id.rsplit("-", 2)[0], time.monotonic() - began)
    return 0


def _produce_files(settings, args) -> int:
    from wavepipe.consumers.producer import produce_files

    def progress(done: int, files: int, path: str, waveforms: int) -> None:
        print(f"[{done}/{files}] {path}: {waveforms} waveforms", file=sys.stderr, flush=True)

    began = time.monotonic()
    try:
        produced = produce_files(
            settings, args.files, group_components=args.group_components, start_ns=args.start, progress=progress
        )
    except FileNotFoundError as exc:
        print(f"wavepipe produce: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for path, reason in produced.skipped:
        print(f"skipped (no waveform): {path}: {reason}", file=sys.stderr)
    for path, reason in produced.failed:
        print(f"not produced: {path}: {reason}", file=sys.stderr)
    if produced.sent:
        _say_produced(settings, produced.sent, f"files-{datetime.now(UTC):%Y%m%dT%H%M%S%f}", time.monotonic() - began)
    if produced.failed:
        print(
            f"{len(produced.failed)} of {produced.files} files could not be read (listed above); the others were sent",
            file=sys.stderr,
        )
        return 1
    return 0


def _say_produced(settings, sent, name: str, seconds: float) -> None:
    from wavepipe.consumers.producer import manifest_lines

    total = sum(s.size for s in sent)
    manifest = settings.home / "produced" / f"{name}.jsonl"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("".join(json.dumps(line) + "\n" for line in manifest_lines(sent)))
    print(
        f"produced {len(sent)} waveforms ({sum(s.chunks for s in sent)} chunks, {total / 1e6:.1f} MB) "
        f"to {settings.topic} in {seconds:.1f}s; manifest: {manifest}"
    )


def _print_report(report: dict) -> None:

    t, outcome = report["totals"], report.get("outcome") or {}
    window = report.get("window")
    if report.get("committed_by_other"):
        print(
            f"run {report['run_id']} was committed by another worker while this one ran; this attempt changed nothing:"
        )
    if report.get("skipped"):
        print(f"run {report['run_id']}: {report['skipped']}; nothing read, nothing written")
    else:
        written = (
            f"{outcome.get('rewritten', 0)} waveforms written into the window"
            if window
            else f"{outcome.get('new', 0)} new waveforms"
        )
        print(
            f"run {report['run_id']}: {written}, {outcome.get('pending', 0)} pending, "
            f"{outcome.get('quarantined', 0)} quarantined, {t['dead_letter']} records dead-lettered "
            f"({t['records_read']} records read, {t['output']} chunks written, {t['gap']} gap offsets)"
        )
    if window:
        replaced = outcome.get("replaced")
        print(
            f"  window [{window['start']}, {window['end']}): "
            + ("its earlier rows were replaced" if replaced is None else f"{replaced} earlier rows of it were replaced")
            + "; no offset was committed"
        )
    if t.get("lost"):
        print(f"  {t['lost']} offsets were no longer retained and were skipped (--skip-lost-offsets)")
    if report.get("new_group_start"):
        print(f"  group {report['group']!r} was new on {report['topic']} and started at {report['new_group_start']}")
    for p, move in sorted((report.get("moved") or {}).items(), key=lambda kv: int(kv[0])):
        print(f"  {report['topic']}[{p}] was moved by someone else: {describe_move(move)}")
    for p, part in sorted(report["partitions"].items(), key=lambda kv: int(kv[0])):
        commit = report.get("commit", {}).get(p, {})
        if report.get("window"):
            a, b = report["window"]["offsets"][p]
            print(
                f"  {part['topic']}[{p}] window [{a}, {b}), read [{part['start']}, {part['end']}); "
                f"{part.get('other_window', 0)} records of other windows set aside"
            )
            continue
        print(
            f"  {part['topic']}[{p}] [{part['start']}, {part['end']}) committed "
            f"{commit.get('before')} -> {commit.get('after')}"
        )
    for line in _set_aside_lines(report):
        print(line)
    if report.get("validation"):
        v = report["validation"]
        print(
            f"validation: {'passed' if v['success'] else 'FAILED'} ({sum(s['evaluated'] for s in v['suites'])} "
            f"expectations, suite v{v['suite_version']}); Data Docs: {v['data_docs_index']}"
        )
    for note in report.get("notes") or []:  # what could not be described; the run itself went through
        print(f"note: {note}")
    if report.get("report_path"):
        print(f"report: {report.get('report_path')}")
        print(f"page:   file://{report.get('report_html')}")
    else:
        print("no report for an idle run (`wavepipe status` counts them)")


#: Quarantined waveforms and dead letters a run's summary names (its page names more).
NAMED_IN_SUMMARY = 5


def _set_aside_lines(report: dict) -> list[str]:
    """The quarantined share in words and the first quarantined waveforms and dead letters by
    name, as the run's page gives them (the page and the tables have the rest)."""
    from wavepipe.report_html import named_entries, quarantine_share

    share = quarantine_share(report)
    lines = [f"  {share}"] if share else []
    for kind, entries, more in named_entries(report, NAMED_IN_SUMMARY):
        for e in entries:
            who = e.get("waveform_id") or f"{e.get('topic')}[{e.get('partition')}]@{e.get('first_offset')}"
            source = f" (source {e['source']})" if e.get("source") else ""
            lines.append(f"  {kind}: {who}{source}: {e.get('reason')}: {e.get('detail') or ''}".rstrip(": "))
        if more:
            lines.append(f"  {kind}: and {more} more (the run's page, the {kind.replace(' ', '_')} table)")
    return lines


def cmd_run(args) -> int:
    from wavepipe.pipeline import run_once

    settings = _settings(args)
    window = None
    if args.window:
        try:
            window = (parse_datetime(args.window[0]), parse_datetime(args.window[1]))
        except ValueError as exc:
            raise UsageError(f"--window: {exc}") from None
        if args.new_group_start:
            raise UsageError("--new-group-start applies to incremental runs, not to --window")
    # the run's options are the flags of the same names (``wavepipe run --help``)
    request = {name: getattr(args, name) for name in RunRequest.__annotations__ if name != "window"}
    report = run_once(settings, run_id=args.run_id, window=window, **request)
    if args.json:
        print(_as_json(report))
    else:
        _print_report(report)
    return EXIT_OK


def cmd_follow(args) -> int:
    """Micro-batches back to back while the group lags (``wavepipe.follow``). The first SIGTERM or
    Ctrl-C ends the loop after the micro-batch in flight; a second one stops it at once (the
    next start resumes that micro-batch)."""
    settings = _settings(args).replace(topic=args.topic, group=args.group)
    options = FollowOptions(
        poll_s=args.poll,
        max_batches=args.max_batches,
        max_seconds=args.max_seconds,
        max_failures=args.max_failures,
        max_idle_s=args.max_idle,
    )
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print(
            f"wavepipe follow: {signal.Signals(signum).name}: ending after the micro-batch in flight "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    print(f"wavepipe follow: group {settings.group!r} on {settings.topic}, polling its lag every {args.poll:g} s")
    done = follow(settings, options, stop)
    new = sum(b["new"] for b in done.batches)
    print(f"wavepipe follow: {len(done.batches)} micro-batch(es), {new} new waveforms; ended: {done.ended}")
    return EXIT_OK


def cmd_abandon(args) -> int:
    from wavepipe.pipeline import abandon_run

    settings = _settings(args)
    try:
        print(abandon_run(settings, args.group or settings.group))
    except UsageError as exc:
        print(f"wavepipe abandon: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_status(args) -> int:
    """Like ``kafka-consumer-groups --describe``: per partition the committed offset, the end, the
    lag, the chunks pending there and any move by someone else; then runs and validation
    (``wavepipe.status``; ``--json``: that document)."""
    settings = _settings(args)
    doc = group_status(settings, args.topic or settings.topic, args.group or settings.group)
    print(_as_json(doc) if args.json else "\n".join(status_lines(doc)))
    return EXIT_OK


def cmd_check(args) -> int:
    """Every configured service tried as a run uses it (``wavepipe.checks``), one line each."""
    settings = _settings(args)
    checks = check_all(settings)
    if args.json:
        print(_as_json([dataclasses.asdict(c) for c in checks]))
    else:
        print("\n".join(str(c) for c in checks))
    failed = [c.service for c in checks if c.ok is False]
    if failed and not args.json:
        print(f"wavepipe check: {len(failed)} of {len(checks)} failed ({', '.join(failed)})", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_table(args) -> int:
    """Maintenance of the output tables: status (from their logs), optimize, vacuum, repair."""
    settings = _settings(args)
    tables = maintenance.pick_tables(args.table)
    if args.action == "status" and args.json:
        print(_as_json([dataclasses.asdict(t) for t in maintenance.status(settings, tables)]))
        return 0
    if args.action == "status":
        print(
            f"{'table':<12} {'version':>7} {'rows':>8} {'files':>6} {'MB':>9} {'partitions':>10} "
            f"{'max files/part':>14} {'to compact':>10} {'unreferenced':>12} {'MB':>8}  last optimize / last vacuum"
        )
        for t in maintenance.status(settings, tables):
            if t.version is None:
                print(f"{t.table:<12} {t.note}")
                continue
            rows = "?" if t.rows is None else str(t.rows)
            print(
                f"{t.table:<12} {t.version:>7} {rows:>8} {t.files:>6} {t.bytes / 1e6:>9.1f} {t.partitions:>10} "
                f"{t.files_per_partition_max:>14} {t.partitions_to_compact:>10} {t.unreferenced_files:>12} "
                f"{t.unreferenced_bytes / 1e6:>8.1f}  "
                f"{t.last_optimize or 'never'} / {t.last_vacuum or 'never'}"
            )
            if t.note:
                print(f"{'':<12} note: {t.note}")
        return 0
    if args.action == "repair":
        for r in maintenance.repair(settings, tables=tables, dry_run=args.dry_run):
            print(f"{r['table']}: {r.get('skipped') or maintenance.repair_line(r)}")
        return 0
    if args.action == "optimize":
        since = maintenance.since_date(args.since, args.days)
        results = maintenance.optimize(settings, tables=tables, zorder=args.zorder, since=since)
        for r in results:
            print(
                f"{r['table']}: {r['skipped']}"
                if "skipped" in r
                else f"{r['table']}: {r['files_before']} files -> {r['files_after']} ({r['files_removed']} rewritten "
                f"into {r['files_added']}, {r['partitions_optimized']} partition(s)) in {r['seconds']:.1f}s"
                + (f"; {r['left_older']} older partition(s) left (--days)" if r.get("left_older") else "")
            )
        return 0
    hours = None if args.retention_hours is None else maintenance.check_retention(args.retention_hours)
    results = maintenance.vacuum(settings, tables=tables, retention_hours=hours, dry_run=args.dry_run)
    for r in results:
        print(
            f"{r['table']}: {r['skipped']}"
            if "skipped" in r
            else f"{r['table']}: {'would delete' if r['dry_run'] else 'deleted'} {r['files_deleted']} file(s), "
            f"{r['bytes_deleted'] / 1e6:.1f} MB, unused for over {r['retention_hours']:g} h "
            f"({r['unreferenced_left']} newer unreferenced file(s) kept)"
        )
    return 0


def cmd_rewind(args) -> int:
    from wavepipe.consumers.rewind import run_cli

    return run_cli(_settings(args), args)


def cmd_airflow(args) -> int:

    return run_cli(_settings(args), args)


def cmd_demo(args) -> int:

    return run_demo(_settings(args), count=args.count, waveform_bytes=args.waveform_bytes, dags_test=dags_test)


def cmd_setup(args) -> int:
    """Resolve everything that is not a Python package: the Kafka, Delta Lake, S3, GCS and
    benchmark jars, wavepipe's LogStore, with ``--object-store`` the local object store's server, and with
    ``--emulators`` the GCS and Azure emulators."""
    settings = _settings(args)
    print(f"Kafka jars: {kafka_jars(settings.jars_dir)}")
    print(f"Spark jars: {', '.join(p.name for p in spark_jars(settings.jars_dir))}")
    print(
        f"S3 jars (Hadoop's S3A, the AWS SDK): {len(s3_jars(settings.jars_dir))}; LogStore: {logstore_jar(settings.jars_dir)}"
    )
    print(f"GCS jar (Google's Hadoop connector, shaded): {', '.join(p.name for p in gcs_jars(settings.jars_dir))}")
    if args.object_store:
        print(f"object store (SeaweedFS): {weed_binary(settings.tools_dir)}")
    if args.emulators:
        made = prepare(settings)
        print(f"GCS emulator (fake-gcs-server): {made['gcs']}; Azure emulator (Azurite): {made['azure']}")

    print(f"Benchmark jars (Spark's Kafka source): {resolve_spark_kafka_jars(settings)}")
    print(f"tables: {_repair_tables(settings)}")
    return 0


def _repair_tables(settings) -> str:
    """``wavepipe table repair`` of the home's tables, as an upgrade does it (runs never mend
    what an earlier wavepipe wrote), in a line; a store that does not answer is named, not fatal."""
    try:
        done = maintenance.repair(settings)
    except storage.STORAGE_ERRORS as exc:
        return f"not checked ({str(exc).splitlines()[0]}); run `wavepipe table repair` once the store answers"
    lines = [f"{r['table']}: {maintenance.repair_line(r)}" for r in done if "skipped" not in r]
    return "; ".join(lines) or "none yet"


def cmd_bench(args) -> int:

    with stopping_what_it_starts():  # SIGTERM, Ctrl-C or a failure: what it started is stopped
        return _bench(args)


def _bench(args) -> int:
    from pathlib import Path

    if args.refresh_docs:
        return _bench_refresh_docs()
    settings = _settings(args)
    if args.consume_scaling:
        return _bench_consume_scaling(settings, args)
    if args.trickle:
        return _bench_trickle(settings, args)
    if args.soak:
        return _bench_soak(settings, args)
    if args.table_layout:
        return _bench_table_layout(settings, args)
    if args.txn_state:
        return _bench_txn_state(settings, args)
    changes = {
        "parallelism": args.parallelism,
        "partitions": args.partitions,
        "scale": args.scale,
        "keep": args.keep,
        "command": _bench_command(args),
    }
    if args.large_mib is not None:
        changes["large_bytes"] = args.large_mib * 2**20
    if args.small_mib is not None:
        changes["small_bytes"] = args.small_mib * 2**20
    if args.systems:
        changes["systems"] = tuple(args.systems.split(","))
    if args.scale_systems:
        changes["scale_systems"] = tuple(args.scale_systems.split(","))
    unknown = set(changes.get("systems", ()) + changes.get("scale_systems", ())) - set(SYSTEMS)
    if unknown:
        print(f"wavepipe bench: unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    changes = {k: v for k, v in changes.items() if v is not None}
    options = BenchOptions.quick_options(**changes) if args.quick else BenchOptions(**changes)
    options.out_dir = (
        Path(args.out) if args.out else (settings.home / "bench" / "quick" if args.quick else options.out_dir)
    )
    results = run_bench(settings, options)
    paths = save(results, options.out_dir)
    failed = [m for m in results["measurements"] if m["error"]]

    print()
    for name, met, numbers in goals(results):
        print(f"  {'n/a ' if met is None else ('met ' if met else 'MISS')} {name}: {numbers}")
    print(f"results: {', '.join(map(str, paths))}")
    if failed:
        print(
            f"{len(failed)} measurement(s) failed: "
            + "; ".join(f"{m['system']} {m['workload']} x{m['scale']}: {m['error']}" for m in failed),
            file=sys.stderr,
        )
        return 1
    return 0


def _bench_refresh_docs() -> int:

    root = source_checkout()
    if root is None:
        print(
            "wavepipe bench --refresh-docs: run it in a source checkout (it rewrites README.md and docs/)",
            file=sys.stderr,
        )
        return 2
    changed = refresh_pages(root)
    print("\n".join(f"rewrote the figures of {p.relative_to(root)}" for p in changed) or "every figure agrees already")
    return 0


def _bench_command(args) -> str:
    """The benchmark's command line as typed, for its results page (options before ``bench`` too)."""
    return " ".join(["wavepipe", *args.argv])


def _bench_trickle(settings, args) -> int:
    options = trickle.TrickleOptions(command=_bench_command(args))
    if args.quick:
        options.seconds, options.drain_s, options.watcher_load_s = 20.0, 240.0, 20.0
    if args.seconds is not None:
        if args.seconds < 10:
            print("wavepipe bench: --seconds must be at least 10", file=sys.stderr)
            return 2
        options.seconds = float(args.seconds)
    if args.systems:
        options.systems = tuple(args.systems.split(","))
        unknown = sorted(set(options.systems) - set(trickle.LABELS))
        if unknown:
            print(
                f"wavepipe bench --trickle: unknown systems {unknown}; known: {', '.join(trickle.LABELS)}",
                file=sys.stderr,
            )
            return 2
    result = trickle.run_trickle(settings, options)
    _saved_and_said(trickle, result, _bench_out(settings, args))
    return 0 if all(r["exactly_once"] for r in result["results"]) else 1


def _bench_out(settings, args):
    """Where a benchmark mode saves its results: ``--out``, a quick run's folder, or the default."""
    from pathlib import Path

    return Path(args.out) if args.out else (settings.home / "bench" / "quick" if args.quick else default_results_dir())


def _saved_and_said(bench, result: dict, out) -> None:
    """A benchmark mode's ``result`` saved in ``out`` (``bench.save``), its page and goals printed."""
    paths = bench.save(result, out)
    print(bench.to_markdown(result))
    for name, met, numbers in bench.goals(result):
        print(f"  {'n/a ' if met is None else ('met ' if met else 'MISS')} {name}: {numbers}")
    print(f"results: {', '.join(map(str, paths))}")


def _bench_soak(settings, args) -> int:
    options = soak.SoakOptions(command=_bench_command(args))
    if args.minutes is not None:
        if not 1 <= args.minutes < math.inf:  # nan and inf too
            print(f"wavepipe bench: --minutes must be at least 1 and finite, got {args.minutes}", file=sys.stderr)
            return 2
        options.minutes = float(args.minutes)
    elif args.quick:
        options.minutes = 3.0
    result = soak.run_soak(settings, options)
    _saved_and_said(soak, result, _bench_out(settings, args))
    return 0 if result["exactly_once"] else 1


def _bench_table_layout(settings, args) -> int:
    command = _bench_command(args)
    out = _bench_out(settings, args)
    exactly_once = True
    for options in table_layout.cases(args.quick, command):
        result = table_layout.run_layout(settings, options)
        paths = table_layout.save(result, out)
        print(table_layout.to_markdown(result, f"{options.name}.png"))
        goals = table_layout.goals(result)
        for name, met, numbers in goals:
            print(f"  {'n/a ' if met is None else ('met ' if met else 'MISS')} {name}: {numbers}")
        print(f"results: {', '.join(map(str, paths))}")
        exactly_once = exactly_once and bool(goals[-1][1])
    return 0 if exactly_once else 1


def _bench_txn_state(settings, args) -> int:
    out = _bench_out(settings, args)
    result = txn_state.measure(settings, txn_state.TxnStateSize.quick() if args.quick else txn_state.TxnStateSize())
    print(txn_state.to_markdown(result))
    paths = txn_state.save(result, out)
    print(f"results: {', '.join(map(str, paths))}")
    return 0 if txn_state.state_kept(result) else 1


def _bench_consume_scaling(settings, args) -> int:
    import tempfile
    from pathlib import Path

    total = (args.large_mib or (16 if args.quick else 1024)) * 2**20
    out = _bench_out(settings, args)
    with tempfile.TemporaryDirectory(
        prefix="consume-scaling-", dir=settings.home if settings.home.exists() else None
    ) as tmp:
        result = consume_scaling.measure_consume_scaling(settings, Path(tmp), total_bytes=total)
    print(consume_scaling.to_markdown(result))
    print(f"results: {', '.join(map(str, consume_scaling.save(result, out)))}")
    return 0


def cmd_config(args) -> int:
    print(json.dumps(_settings(args).as_dict(redact=True), indent=2))
    return EXIT_OK


def _count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give 0 (no cap) or a positive number")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _epoch_ns(text: str) -> int:
    """An argparse type: an ISO 8601 time (UTC when it names no zone) as UTC epoch nanoseconds."""
    try:
        return epoch_ns(parse_datetime(text))
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


EPILOG = """exit codes: 0 done; 1 the run or operation failed (the message says what to do next; a retry
is safe); 2 a flag, setting or name is wrong (nothing ran); 3 the output failed validation (nothing
was published, no offset moved)"""


def _json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f'print {what} as one JSON document on stdout (keys: docs/operations.md, "Scripting"); '
        "messages and progress stay on stderr",
    )


def _as_json(doc) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, default=str)


def _waveform_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--count", type=_positive, default=24, help=f"{what} (default 24)")
    parser.add_argument(
        "--waveform-bytes",
        type=_positive,
        default=512 * 1024,
        help="about this many bytes per waveform (default 524288)",
    )


def _actions(parser: argparse.ArgumentParser, actions: dict[str, str]) -> dict[str, argparse.ArgumentParser]:
    """One sub-command per action of ``parser`` (in ``args.action``): each one's ``--help`` lists its
    own options, and an option of another action is refused before anything runs."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="{" + ",".join(actions) + "}")
    return {name: sub.add_parser(name, help=text, description=text) for name, text in actions.items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wavepipe", description=__doc__, epilog=EPILOG)
    parser.add_argument("--home", help="state folder (default: WAVEPIPE_HOME or <project>/.wavepipe)")
    parser.add_argument("--bootstrap-servers", help="Kafka bootstrap servers (default: config)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"wavepipe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    k = sub.add_parser("kafka", help="the local Apache Kafka broker (KRaft, one node)")
    _actions(k, {"up": "start it (idempotent)", "down": "stop it", "status": "is it running, where"})
    k.set_defaults(func=cmd_kafka)

    o = sub.add_parser(
        "objectstore",
        help="this home's local S3 object store (SeaweedFS on loopback, built with Go the first time)",
    )
    _actions(o, {"up": "start it (idempotent)", "down": "stop it", "status": "is it running, where"})
    o.set_defaults(func=cmd_objectstore)

    em = sub.add_parser(
        "emulator",
        help="this home's GCS and Azure emulators (fake-gcs-server built with Go, Azurite from npm, the first "
        "time), on loopback, for gcs_endpoint / azure_endpoint = local",
    )
    for action in _actions(
        em, {"up": "start it (idempotent)", "down": "stop it", "status": "is it running, where"}
    ).values():
        action.add_argument("store", choices=("gcs", "azure", "all"), help="which emulator")
    em.set_defaults(func=cmd_emulator)

    sp = sub.add_parser(
        "spark",
        help="this home's Spark engine: a Spark Connect server on loopback that runs "
        "attach to (runs start it on demand); status shows its memory",
    )
    spark = _actions(
        sp,
        {
            "up": "start it on loopback and wait until it answers (idempotent)",
            "down": "stop it",
            "status": "its pid, address, memory and log",
            "restart": "stop it and start it again (e.g. after changing spark_conf)",
            "serve": "run a Spark Connect server in the foreground, bound to --host (a container's command)",
        },
    )
    spark["serve"].add_argument("--host", default="0.0.0.0", help="the address to bind (default 0.0.0.0)")
    spark["serve"].add_argument("--port", type=_positive, default=15002, help="the port (default 15002)")
    for name in ("down", "restart"):
        spark[name].add_argument(
            "--force",
            action="store_true",
            help="at once, failing the steps attached to it (default: wait until they end)",
        )
    sp.set_defaults(func=cmd_spark)

    sc = sub.add_parser(
        "spark-cluster",
        help="a local Spark standalone cluster (master and workers on loopback) "
        "to try the cluster path; the engine uses it with WAVEPIPE_SPARK_MASTER",
    )
    cluster = _actions(
        sc, {"up": "start the master and its workers", "down": "stop them", "status": "are they running"}
    )
    for action in cluster.values():
        action.add_argument("--port", type=_positive, default=7077, help="the master's port (default 7077)")
    cluster["up"].add_argument("--workers", type=_positive, default=1, help="workers to start (default 1)")
    sc.set_defaults(func=cmd_spark_cluster, workers=1)

    p = sub.add_parser("produce", help="produce chunked waveforms")
    p.add_argument("--demo", action="store_true", help="synthetic seismic, ECG and audio recordings")
    p.add_argument(
        "--files",
        nargs="+",
        metavar="PATH",
        help="recordings in files, folders or globs: what obspy reads (MiniSEED, SAC, GSE2, ...; "
        "wavepipe[seismic]), WAV/FLAC (wavepipe[audio]), WFDB records' .hea (wavepipe[ecg])",
    )
    p.add_argument(
        "--group-components",
        action="store_true",
        help="with --files: a station's aligned components (e.g. BHZ, BHN, BHE) as one 3-channel waveform",
    )
    p.add_argument(
        "--start",
        type=_epoch_ns,
        help="with --files: the start time of recordings whose file has none (WAV; WFDB without a base "
        "time), ISO 8601 UTC (default: the file's modification time)",
    )
    _waveform_options(p, "demo waveforms to produce")
    p.add_argument("--topic", help="default: config `topic` (created if missing)")
    p.set_defaults(func=cmd_produce)

    r = sub.add_parser("run", help="one bounded run without Airflow (plan, consume, reassemble, commit)", epilog=EPILOG)
    r.add_argument("--run-id", help="resume or repeat this run id (default: the active run, else a new one)")
    r.add_argument("--topic", help="the topic to read (default: config `topic`)")
    r.add_argument(
        "--group", help="the consumer group whose committed offsets are the progress (default: config `group`)"
    )
    r.add_argument(
        "--max-records",
        type=_count,
        help="cap: records per partition in this run (0: no cap; default: config `max_records_per_partition`)",
    )
    r.add_argument(
        "--max-bytes",
        type=_count,
        help="cap: payload bytes per partition in this run (0: no cap; default: config `max_bytes_per_partition`)",
    )
    r.add_argument(
        "--new-group-start",
        metavar="earliest|latest|TIME",
        help="where a group with no committed offsets on the topic starts (default: config "
        "`new_group_start`; without one such a run is refused, so a typo'd group reads nothing)",
    )
    r.add_argument(
        "--skip-lost-offsets",
        action="store_true",
        help="if the group is behind what the topic retains, start at the earliest retained offsets "
        "and record the lost range in the report (default: fail, naming the range)",
    )
    r.add_argument(
        "--window",
        nargs=2,
        metavar=("START", "END"),
        help="reprocess the time window [START, END) (ISO-8601, UTC if no zone) instead of continuing "
        "from the group's offsets: its output is replaced, no offset is committed",
    )
    _json_flag(r, "the run's report")
    r.set_defaults(func=cmd_run)

    f = sub.add_parser(
        "follow",
        help="bounded runs back to back while the group lags, waiting on lag between them (a micro-batch "
        "loop; SIGTERM ends it after the run in flight)",
        epilog=EPILOG,
    )
    f.add_argument("--topic", help="the topic to read (default: config `topic`)")
    f.add_argument("--group", help="the consumer group (default: config `group`)")
    f.add_argument("--poll", type=float, default=1.0, help="seconds between lag polls while idle (default 1)")
    f.add_argument("--max-batches", type=_count, default=0, help="end after this many micro-batches (default 0: none)")
    f.add_argument(
        "--max-seconds", type=float, default=0.0, help="start no micro-batch after this many seconds (default 0: none)"
    )
    f.add_argument(
        "--max-idle",
        type=float,
        default=0.0,
        help="end after this many seconds with no micro-batch due, e.g. once the backlog is read (default 0: never)",
    )
    f.add_argument(
        "--max-failures", type=int, default=3, help="failed micro-batches in a row before the loop gives up (default 3)"
    )
    f.set_defaults(func=cmd_follow)

    a = sub.add_parser("abandon", help="release a group's unfinished run without committing it")
    a.add_argument("--group", help="default: config `group`")
    a.set_defaults(func=cmd_abandon)

    s = sub.add_parser("status", help="committed offsets, lag and recent runs of a group")
    s.add_argument("--topic", help="default: config `topic`")
    s.add_argument("--group", help="default: config `group`")
    _json_flag(s, "the group's status")
    s.set_defaults(func=cmd_status)

    ck = sub.add_parser(
        "check",
        help="try every configured service as a run uses it (Kafka, the Spark engine, the tables', staging's and "
        "state's storage, this home's Airflow): one line each, what works or what to fix; exit 1 if one fails",
    )
    _json_flag(ck, "the checks")
    ck.set_defaults(func=cmd_check)

    tb = sub.add_parser(
        "table",
        help="the output tables: status (files, size, what VACUUM frees), optimize (compact, --zorder), vacuum, "
        "repair (make them readable by every Delta reader, lay the waveforms out by date)",
    )
    table = _actions(
        tb,
        {
            "status": "per table: version, rows, files, size, partitions, what VACUUM frees",
            "optimize": "compact the partitions that hold more than one file",
            "vacuum": "delete the files no version within the retention uses",
            "repair": "make tables an earlier wavepipe wrote readable by every Delta reader",
        },
    )
    for action in table.values():
        action.add_argument(
            "--table", action="append", help="only this table (waveforms, quarantine, dead_letter, qc; repeatable)"
        )
    table["optimize"].add_argument(
        "--zorder",
        action="store_true",
        help="also cluster the waveforms by source and start_time within each date partition (rewrites "
        "every file of the partitions it touches: limit it with --since or --days)",
    )
    table["optimize"].add_argument("--since", help="only the waveforms' date partitions from this day on (YYYY-MM-DD)")
    table["optimize"].add_argument("--days", type=int, help="only the date partitions of the last N days (0: today)")
    table["vacuum"].add_argument(
        "--retention-hours",
        type=float,
        help="keep unused files this many hours (default: setting table_retention_hours, 168)",
    )
    for name in ("vacuum", "repair"):
        table[name].add_argument(
            "--dry-run", action="store_true", help="say what it would delete or change, change nothing"
        )
    _json_flag(table["status"], "the tables' state")
    tb.set_defaults(func=cmd_table)

    rw = sub.add_parser("rewind", help="move a group's committed offsets (dry run unless --execute)")
    rw.add_argument("--topic", help="default: config `topic`")
    rw.add_argument("--group", help="default: config `group`")
    rw.add_argument("--partitions", help="comma-separated partitions (default: all of the topic's)")
    to = rw.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the earliest offset the topic retains")
    to.add_argument("--to-latest", action="store_true", help="the end (last stable offset): skip everything")
    to.add_argument("--to-offset", type=int, help="this offset in every selected partition")
    to.add_argument("--to-datetime", help="the first record at or after this ISO-8601 instant (UTC if no zone)")
    to.add_argument("--shift-by", type=int, help="move by N offsets from the committed one (negative: back)")
    to.add_argument("--by-duration", help="the first record at or after now minus this duration (e.g. 2h, 90m, P1D)")
    rw.add_argument("--execute", action="store_true", help="apply it (default: dry run, print before/after/lag)")
    rw.add_argument(
        "--force",
        action="store_true",
        help="accept a target outside what the topic retains (clamped to the retained range)",
    )
    rw.add_argument("--reason", default="", help="why: kept in the audit record")
    _json_flag(rw, "the rewind's plan and outcome")
    rw.set_defaults(func=cmd_rewind)

    af = sub.add_parser("airflow", help="Airflow on this machine (api-server, scheduler, dag-processor, triggerer)")
    airflow = _actions(
        af,
        {
            "up": "start the services (idempotent) and print the UI's address and login",
            "down": "stop every service",
            "status": "which services run, where",
            "backfill": "create a backfill of a DAG through Airflow's REST API: one run per window",
        },
    )
    backfill = airflow["backfill"]
    backfill.add_argument("--from-date", required=True, help="first logical date (ISO-8601, inclusive)")
    backfill.add_argument("--to-date", required=True, help="last logical date (ISO-8601, inclusive)")
    backfill.add_argument("--dag-id", default="wavepipe_ingest", help="the DAG (default wavepipe_ingest)")
    backfill.add_argument("--conf", help='params as JSON, e.g. \'{"topic": "waveforms"}\'')
    backfill.add_argument(
        "--max-active-runs", type=_positive, help="runs at once (window runs of a group still take turns)"
    )
    backfill.add_argument(
        "--reprocess",
        choices=["all", "failed", "missing"],
        default="all",
        help="windows that already had a window run are reprocessed again: all (default), only those "
        "whose run failed, or none (missing: the windows never reprocessed); incremental runs never count",
    )
    af.set_defaults(func=cmd_airflow)

    d = sub.add_parser("demo", help="the main job end to end: Kafka up, demo data, the DAG through Airflow, checks")
    _waveform_options(d, "demo waveforms to produce")
    d.set_defaults(func=cmd_demo)

    st = sub.add_parser(
        "setup",
        help="resolve the Kafka, Delta Lake and S3 jars from Maven Central, build the LogStore, repair the tables an "
        "earlier wavepipe wrote (idempotent)",
    )
    st.add_argument(
        "--object-store",
        action="store_true",
        help="also build the local object store (SeaweedFS, with Go; once, a few minutes): `make test` does",
    )
    st.add_argument(
        "--emulators",
        action="store_true",
        help="also build the GCS emulator (fake-gcs-server, with Go) and install the Azure one (Azurite, with npm); "
        "once, about a minute: `make test` does",
    )
    st.set_defaults(func=cmd_setup)

    b = sub.add_parser("bench", help="throughput and memory against the read ceiling and two alternatives")
    b.add_argument(
        "--quick", action="store_true", help="small sizes (a smoke test): 8 + 2 MiB, scaling x2 for wavepipe"
    )
    b.add_argument("--large-mib", type=int, help="backlog of the large workload, MiB (default 1024)")
    b.add_argument("--small-mib", type=int, help="backlog of the small workload, MiB (default 1024)")
    b.add_argument("--scale", type=int, help="the scaling pass's multiple of the backlog (default 4; 1 skips it)")
    b.add_argument("--partitions", type=int, help="partitions of the benchmark topics (default 4)")
    b.add_argument("--parallelism", type=int, help="readers at once, and Spark's local[N] (default 2)")
    b.add_argument(
        "--systems",
        help="comma-separated subset of: ceiling_kcat, ceiling_confluent, wavepipe, "
        "wavepipe_s3, wavepipe_no_qc, python_consumer, spark_kafka_source",
    )
    b.add_argument(
        "--scale-systems", help="systems that also run the scaling pass (default: all but wavepipe_s3, wavepipe_no_qc)"
    )
    b.add_argument("--out", help="results folder (default docs/benchmarks, or <home>/bench/quick with --quick)")
    b.add_argument("--keep", action="store_true", help="keep the topics and outputs (they are deleted by default)")
    b.add_argument(
        "--consume-scaling",
        action="store_true",
        help="only the consume step's scale-out over 1, 2 and 4 partitions (backlog: --large-mib, default "
        "1024; 16 with --quick); results in docs/benchmarks/consume-scaling.*",
    )
    b.add_argument(
        "--trickle",
        action="store_true",
        help="only the freshness benchmark: one waveform a second, then bursts, into wavepipe's event-driven "
        "DAG (real Airflow services) and into Spark Structured Streaming; results in docs/benchmarks/trickle.*",
    )
    b.add_argument(
        "--txn-state",
        action="store_true",
        help="only the transaction-state benchmark: 10,000 micro-batch commits (500 with --quick) with a stable "
        "transaction id against one per run; results in docs/benchmarks/txn-state.*",
    )
    b.add_argument(
        "--table-layout",
        action="store_true",
        help="only the table-layout benchmark: 200 micro-batch appends against one batch, a typical read before "
        "and after `wavepipe table optimize`; results in docs/benchmarks/table-layout.*",
    )
    b.add_argument(
        "--soak",
        action="store_true",
        help="only the soak: the ingest DAG's follow task through the real Airflow services for --minutes, with a "
        "trickle, bursts and hostile waveforms and a maintenance run half-way; memory per process, the run "
        "state's and tables' files and freshness over time; results in docs/benchmarks/soak.*",
    )
    b.add_argument("--minutes", type=float, help="--soak: how long the producer sends (default 30; 3 with --quick)")
    b.add_argument("--seconds", type=int, help="--trickle: how long each system is sent to, per mode (default 180)")
    b.add_argument(
        "--refresh-docs",
        action="store_true",
        help="run nothing: rewrite the figures README.md and docs/ quote (each tagged with its key) from "
        "docs/benchmarks/*.json, as the last run left them; read the diff for the words around them",
    )
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser("config", help="print the effective settings")
    c.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit codes: see ``wavepipe.contracts.errors`` (0 done, 1 failed, 2 usage or configuration, 3 validation)."""
    args, extra = build_parser().parse_known_args(argv)
    if extra:  # argparse would print the top-level usage: name the command and action instead
        where = " ".join(filter(None, [args.command, getattr(args, "action", None)]))
        print(
            f"wavepipe {where}: {' '.join(extra)}: not an option of `{where}` (see `wavepipe {where} --help`)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed, for a benchmark's page
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # httpx logs a line per request (the engine's job list, a run's): nothing a user acts on
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except WavepipeError as exc:
        if args.verbose:
            raise
        said = " failed" if exc.exit_code == EXIT_FAILED else ""
        print(f"wavepipe {args.command}{said}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"wavepipe {args.command}: {exc or 'interrupted'}; a retry resumes where it stopped", file=sys.stderr)
        return 130
    except BUGS as exc:  # a defect of wavepipe: its traceback, never a line that reads like the world's fault
        traceback.print_exc()
        print(f"wavepipe {args.command}: a defect of wavepipe ({type(exc).__name__}, traceback above)", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # another library's error that wavepipe does not translate yet
        if args.verbose:
            raise
        print(
            f"wavepipe {args.command} failed: {exc or type(exc).__name__} (run with -v for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
