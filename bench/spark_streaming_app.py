"""The "Spark Structured Streaming" alternative of the trickle benchmark: what a Spark user writes
for fresh data without wavepipe. A Kafka source, a processing-time trigger, and a ``foreachBatch``
that reassembles each micro-batch's chunks (with the chunks of waveforms still incomplete from
earlier batches) by waveform id and sequence number, and appends the complete waveforms to a
Delta table, idempotently per batch (``txnAppId``/``txnVersion``: a batch run again after a
failure commits nothing twice). No validation gate, quarantine or run accounting.

Runs until the ``--stop`` file exists; writes ``--ready`` once its query has started.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from wavepipe.bench.spark_kafka_app import reassembled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True, help="the Delta table of whole waveforms")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--trigger-s", type=float, default=2.0)
    parser.add_argument("--ready", required=True)
    parser.add_argument("--stop", required=True)
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("wavepipe-bench-structured-streaming").getOrCreate()
    pending_root = Path(args.checkpoint) / "pending"  # chunks of waveforms not complete yet
    app_id = f"trickle-{args.topic}"
    state: dict[str, str | None] = {"pending": None}

    def write_batch(batch, batch_id: int) -> None:
        raw = batch.select("key", "value", "headers", "topic", "partition", "offset")
        if state["pending"]:
            raw = raw.unionByName(spark.read.parquet(state["pending"]))
        raw = raw.localCheckpoint()  # read Kafka (and the pending chunks) once for both outputs
        whole = reassembled(raw).where("checksum_ok").drop("checksum_ok")
        whole.write.format("delta").mode("append").option("txnAppId", app_id).option("txnVersion", batch_id).save(
            args.out
        )
        ids = raw.withColumn("waveform_id", F.map_from_entries("headers")["wp-id"].cast("string"))
        leftover = ids.join(whole.select("waveform_id"), "waveform_id", "left_anti").drop("waveform_id")
        path = str(pending_root / str(batch_id))
        leftover.write.mode("overwrite").parquet(path)
        state["pending"] = path

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .load()
        .writeStream.foreachBatch(write_batch)
        .trigger(processingTime=f"{args.trigger_s} seconds")
        .option("checkpointLocation", str(Path(args.checkpoint) / "query"))
        .start()
    )
    Path(args.ready).write_text(query.id + "\n")
    try:
        while not Path(args.stop).exists():
            if query.exception() is not None:
                raise query.exception()
            time.sleep(0.5)
        deadline = time.monotonic() + 30  # let a batch in flight finish rather than cancel it
        while query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        query.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
