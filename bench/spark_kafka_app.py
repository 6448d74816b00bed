"""The "Spark Kafka source" alternative: Spark's own Kafka batch source, reassembly by group-by.

What a Spark user writes without wavepipe: ``spark.read.format("kafka")`` over fixed
``startingOffsets``/``endingOffsets``, the chunk headers parsed with SQL functions, chunks
collected per waveform id, sorted by sequence number, concatenated, sha256-checked, Parquet out.
Run by spark-submit with the spark-sql-kafka jars (see bench/spark-kafka-pom.xml).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def reassembled(raw):
    headers = F.map_from_entries("headers")

    def header(name: str):
        return F.element_at(headers, F.lit(name)).cast("string")

    chunks = raw.select(
        header("wp-id").alias("waveform_id"),
        header("wp-seq").cast("int").alias("seq"),
        header("wp-count").cast("int").alias("chunk_count"),
        header("wp-checksum").alias("checksum"),
        header("wp-dtype").alias("dtype"),
        header("wp-channels").cast("int").alias("channels"),
        header("wp-sample-rate").cast("double").alias("sample_rate"),
        header("wp-start-ns").cast("long").alias("start_ns"),
        header("wp-source").alias("source"),
        "value",
        "topic",
        "partition",
        "offset",
    )
    per = chunks.groupBy("waveform_id").agg(
        F.sort_array(F.collect_list(F.struct("seq", "value"))).alias("parts"),
        F.max("chunk_count").alias("chunk_count"),
        F.first("checksum").alias("checksum"),
        F.first("dtype").alias("dtype"),
        F.first("channels").alias("channels"),
        F.first("sample_rate").alias("sample_rate"),
        F.first("start_ns").alias("start_ns"),
        F.first("source").alias("source"),
        F.first("topic").alias("topic"),
        F.min(F.struct("partition", "offset")).alias("first"),
        F.max("offset").alias("last_offset"),
    )
    payload = F.aggregate("parts", F.lit(bytearray()), lambda acc, part: F.concat(acc, part["value"]))
    whole = per.where(F.size("parts") == F.col("chunk_count")).withColumn("payload", payload)
    return whole.select(
        "waveform_id",
        "source",
        F.timestamp_micros(F.expr("start_ns div 1000")).alias("start_time"),
        F.to_date(F.timestamp_micros(F.expr("start_ns div 1000"))).alias("date"),
        "dtype",
        "channels",
        "sample_rate",
        F.length("payload").cast("long").alias("size_bytes"),
        F.size("parts").alias("n_chunks"),
        "checksum",
        "payload",
        "topic",
        F.col("first.partition").alias("partition"),
        F.col("first.offset").alias("first_offset"),
        "last_offset",
        (F.concat(F.lit("sha256:"), F.sha2("payload", 256)) == F.col("checksum")).alias("checksum_ok"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--ranges", required=True, help='JSON {"partition": [start, end], ...}')
    parser.add_argument("--out", required=True)
    parser.add_argument("--result", required=True, help="where to write the counts (JSON)")
    args = parser.parse_args(argv)
    ranges = {int(p): r for p, r in json.loads(args.ranges).items() if r[1] > r[0]}
    spark = SparkSession.builder.appName("wavepipe-bench-spark-kafka-source").getOrCreate()
    began = time.monotonic()
    try:
        raw = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("assign", json.dumps({args.topic: sorted(ranges)}))
            .option("startingOffsets", json.dumps({args.topic: {str(p): r[0] for p, r in ranges.items()}}))
            .option("endingOffsets", json.dumps({args.topic: {str(p): r[1] for p, r in ranges.items()}}))
            .option("includeHeaders", "true")
            .load()
        )
        out = reassembled(raw)
        out.where("checksum_ok").drop("checksum_ok").write.mode("overwrite").partitionBy("source", "date").parquet(
            args.out
        )
        # counted from the written files (one small column), not by a second read of Kafka
        written = (
            spark.read.parquet(args.out).agg(F.count(F.lit(1)).alias("n"), F.sum("size_bytes").alias("bytes")).first()
        )
    finally:
        spark.stop()
    result = {
        "waveforms": written["n"],
        "bytes": written["bytes"] or 0,
        "spark_app_s": round(time.monotonic() - began, 3),
    }
    with open(args.result, "w") as fh:
        json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
