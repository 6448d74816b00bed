"""The main job on local defaults: real Kafka, demo waveforms, the DAG through Airflow, checks."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from wavepipe import storage
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import BUGS
from wavepipe.contracts.protocol import checksum


def run_demo(settings: Settings, *, count: int, waveform_bytes: int, dags_test: Callable) -> int:
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.local.kafka import LocalKafka

    began = time.monotonic()
    print(f"[1/4] {LocalKafka.from_settings(settings).up()}", flush=True)
    if settings.s3_endpoint == "local":  # the tables in this home's object store
        from wavepipe.local.objectstore import LocalObjectStore

        print(f"      {LocalObjectStore.from_settings(settings).up()}", flush=True)
    if settings.spark_engine == "connect" and not settings.spark_remote:
        from wavepipe.local.engine_server import LocalEngine

        print(f"      {LocalEngine(settings).up()}", flush=True)
    ensure_topic(settings)
    sent = produce_demo(settings, count=count, target_bytes=waveform_bytes)
    print(
        f"[2/4] produced {len(sent)} demo waveforms ({sum(s.chunks for s in sent)} chunks, "
        f"{sum(s.size for s in sent) / 1e6:.1f} MB) to topic {settings.topic!r}",
        flush=True,
    )
    reports_before = set(settings.reports_dir.glob("*.json"))
    print("[3/4] running DAG wavepipe_ingest through Airflow (airflow dags test) ...", flush=True)
    # the demo's group starts at the earliest offset the first time (a later demo continues from its offsets)
    dags_test(settings, "wavepipe_ingest", conf={"new_group_start": "earliest"})
    new_reports = sorted(set(settings.reports_dir.glob("*.json")) - reports_before, key=lambda p: p.stat().st_mtime)
    if not new_reports:
        print("FAILED: the DAG run wrote no run report; see the Airflow task logs above")
        return 1
    report = json.loads(new_reports[-1].read_text())
    print("[4/4] checking the output against what was produced ...", flush=True)
    problems = list(report["balance_errors"])
    if report.get("status") != "committed":
        problems.append(f"the run ended as {report.get('status')!r}, not committed")
    validation = report.get("validation") or {}
    if not validation.get("success"):
        problems.append("the run's output did not pass validation")
    problems += _check_output(settings, sent)
    partitions = [int(p) for p in report["partitions"]]
    committed = committed_offsets(settings, report["group"], report["topic"], partitions)
    for p, part in report["partitions"].items():
        if committed[int(p)] != part["end"]:
            problems.append(f"partition {p}: committed {committed[int(p)]}, planned end {part['end']}")
    t = report["totals"]
    print()
    print(
        f"run {report['run_id']}: read {t['records_read']} records ({t['payload_bytes_read'] / 1e6:.1f} MB) "
        f"from {len(partitions)} partitions; waveforms: "
        + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in report["outcome"].items() if n)
    )
    for p, part in sorted(report["partitions"].items(), key=lambda kv: int(kv[0])):
        print(
            f"  partition {p}: [{part['start']}, {part['end']}) output {part['output']}, pending "
            f"{part['pending']}, quarantined {part['quarantined']}, dead letter {part['dead_letter']}, "
            f"gap {part['gap']}; committed {committed[int(p)]}"
        )
    if validation:
        print(
            f"validation: {'passed' if validation['success'] else 'FAILED'}, "
            f"{sum(s['evaluated'] for s in validation['suites'])} expectations; "
            f"Great Expectations Data Docs: {validation['data_docs_index']}"
        )
    problems += _say_quality(report.get("quality"), count)
    print(f"output table (Delta Lake): {settings.output_table}")
    print(f"run report: file://{new_reports[-1].with_suffix('.html')} (JSON: {new_reports[-1]})")
    if problems:
        print("FAILED checks:\n  " + "\n  ".join(problems))
        return 1
    print(
        f"OK: all {len(sent)} produced waveforms are in the output once and bit-exact (sha256), "
        f"offsets committed at the planned ends, counts add up ({time.monotonic() - began:.0f}s in all)"
    )
    return 0


def _say_quality(quality: dict | None, count: int) -> list[str]:
    """Print what the run's quality summary flagged, each rule with its sources; the faults of
    the ``count`` demo recordings (``demo_faults``) that it did not flag, as problems."""
    from wavepipe.consumers.producer import demo_faults

    if not quality:
        return ["the run measured no quality (quality_metrics off?): the demo's faults went unseen"]
    print(f"quality: {quality['flagged']} of {quality['measured']} waveforms flagged (published all the same)")
    for rule, n in quality["by_rule"].items():
        where = sorted(s["source"] for s in quality["sources"] if rule in s["flags"])
        print(f"  {rule}: {n} waveforms ({', '.join(where)})")
    if quality.get("plot"):
        print(f"  the flagged waveforms drawn: file://{quality['plot']}")
    print(f"  the qc table's hours (per source and hour) this run recomputed: {quality.get('qc_hours')}")
    missed = sorted(demo_faults(count) - set(quality["by_rule"]))
    return [f"the demo's {rule} fault was not flagged" for rule in missed]


def _check_output(settings: Settings, sent) -> list[str]:
    from wavepipe.engine_client import table_session
    from wavepipe.spark_apps.verify import compare_to_manifest

    with table_session(settings) as spark:
        manifest = spark.createDataFrame(
            [(s.waveform_id, s.checksum) for s in sent], "waveform_id string, checksum string"
        )
        output = spark.read.format("delta").load(storage.for_spark(settings.output_table))
        bad = compare_to_manifest(output, manifest).where("rows != 1 OR NOT bit_exact OR bit_exact IS NULL").collect()
    problems = [f"waveform {r['waveform_id']}: {r['rows']} output rows, bit-exact {r['bit_exact']}" for r in bad]
    return problems + _check_with_delta_rs(settings, sent)


def _check_with_delta_rs(settings: Settings, sent) -> list[str]:
    """The same table read by delta-rs (the reader of Polars and most Python tools), not Spark:
    each sent waveform once, its payload bit-exact (sha256)."""
    ids = sorted({s.waveform_id for s in sent})
    try:
        table = storage.delta_table(settings.output_table)
        rows = table.to_pyarrow_table(columns=["waveform_id", "payload"], filters=[("waveform_id", "in", ids)])
    except BUGS:
        raise
    except Exception as exc:
        return [f"delta-rs cannot read the output table ({str(exc).splitlines()[0]}): run `wavepipe table repair`"]
    found: dict[str, list[str]] = {}
    for r in rows.to_pylist():
        found.setdefault(r["waveform_id"], []).append(checksum(r["payload"]))
    wrong = [s.waveform_id for s in sent if found.get(s.waveform_id) != [s.checksum]]
    print(
        f"read back by delta-rs as well: {rows.num_rows} rows for the {len(ids)} waveforms sent, {len(ids) - len(wrong)} bit-exact once"
    )
    return [f"delta-rs reads waveform {w} with payload checksums {found.get(w)}, not once bit-exact" for w in wrong]
