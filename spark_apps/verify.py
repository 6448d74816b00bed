"""Checks of the output table against what producers sent (used by the demo and the tests)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def compare_to_manifest(output: DataFrame, manifest: DataFrame) -> DataFrame:
    """Per produced waveform: how many output rows carry its id and whether the payload's sha256
    equals the checksum the producer computed. ``manifest`` has ``waveform_id``, ``checksum``."""
    out = (
        output.select(
            "waveform_id",
            F.concat(F.lit("sha256:"), F.sha2("payload", 256)).alias("payload_sha256"),
        )
        .groupBy("waveform_id")
        .agg(F.count(F.lit(1)).alias("rows"), F.first("payload_sha256").alias("payload_sha256"))
    )
    return (
        manifest.select("waveform_id", F.col("checksum").alias("produced_checksum"))
        .join(out, "waveform_id", "left")
        .select(
            "waveform_id",
            F.coalesce("rows", F.lit(0)).alias("rows"),
            (F.col("payload_sha256") == F.col("produced_checksum")).alias("bit_exact"),
        )
    )
