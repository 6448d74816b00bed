"""Tables an earlier wavepipe wrote (string columns logged as ``string collate UTF8_BINARY``, the
waveforms partitioned by source and date, columns missing) are mended by ``wavepipe table repair``
(what ``wavepipe setup`` runs on an upgrade), never by a run: a run that meets them is refused,
naming the command, and commits nothing. The repair fixes the types in one metadata-only commit,
adds the columns in another and lays the waveforms out by date; rows, history and transaction ids
are kept, and delta-rs then reads them as Spark does."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from tests.helpers import (
    START,
    assert_accounted,
    assert_delta_rs_reads_as_spark,
    assert_protocol_types,
    produce_in_order,
    run_cli,
    waveform_records,
)
from wavepipe import pipeline
from wavepipe.consumers.kafka_admin import committed_positions, ensure_topic
from wavepipe.contracts.rows import QUALITY_NAMES, ROW_FACTS
from wavepipe.delta_protocol import schema_problems
from wavepipe.storage import TableNeedsRepairError

pytestmark = pytest.mark.integration

LEGACY_TXN = "wavepipe-publish-legacy-waveforms-0"
#: The output's columns a wavepipe before extension 1.1 did not write.
LATER_COLUMNS = [*ROW_FACTS.names[ROW_FACTS.get_field_index("end_time") :], *QUALITY_NAMES]


def write_legacy_tables(spark, settings, n: int = 12) -> None:
    """The waveforms and quarantine tables as wavepipe wrote them up to 77ad3ff: rows made by
    ``mapInArrow`` over Spark Connect (so every string column is logged with a collation), the
    waveforms partitioned by source and date, appended under a transaction id."""
    from pyspark.sql import types as T

    from wavepipe.spark_apps.reassemble import OUTPUT_SCHEMA

    legacy = [f for f in OUTPUT_SCHEMA.fields if f.name not in LATER_COLUMNS]
    schema = T.StructType([*legacy, T.StructField("run_id", T.StringType(), False)])

    def rows(batches):  # pickled by value: defined here, not in an importable module
        from datetime import UTC, datetime

        import pyarrow as pa

        from wavepipe.spark_apps.reassemble import ARROW_OUTPUT_SCHEMA

        legacy = [f for f in ARROW_OUTPUT_SCHEMA if f.name not in LATER_COLUMNS]
        arrow = pa.schema([*legacy, pa.field("run_id", pa.string(), False)])
        for batch in batches:
            out = []
            for i in batch.column(0).to_pylist():
                start = datetime(2026, 11, 19 + i % 2, 3, i, tzinfo=UTC)
                payload = bytes([i]) * 64
                out.append(
                    [f"old-{i}", f"station-{i % 3}", start, start.date(), "<f4", 1, 100.0, 16, 0.16, 64, 1]
                    + [f"sha256:{i}", payload, "legacy-topic", 0, i, i, True, "legacy-run"]
                )
            yield pa.RecordBatch.from_pylist([dict(zip(arrow.names, r, strict=True)) for r in out], schema=arrow)

    frame = spark.range(n).mapInArrow(rows, schema).drop("checksum_ok")
    (
        frame.write.format("delta")
        .option("txnAppId", LEGACY_TXN)
        .option("txnVersion", 1)
        .partitionBy("source", "date")
        .save(str(settings.output_table))
    )
    quarantined = frame.selectExpr("waveform_id", "'checksum_mismatch' AS reason", "run_id").limit(2)
    quarantined.write.format("delta").save(str(settings.quarantine_table))


def test_tables_of_an_earlier_wavepipe_are_repaired_in_place_and_laid_out_by_date(settings, spark):
    write_legacy_tables(spark, settings)
    # the guard: what the earlier code wrote is refused by every reader that follows the protocol
    assert "waveform_id: 'string collate UTF8_BINARY'" in schema_problems(settings.output_table)
    with pytest.raises(Exception, match="Unsupported Delta table type"):
        DeltaTable(str(settings.output_table))
    code, out = run_cli(settings, "table", "status")
    assert code == 0 and "run `wavepipe table repair`" in out, out
    history_before = spark.sql(f"DESCRIBE HISTORY delta.`{settings.output_table}`").count()

    # a run meeting them is refused before it publishes, naming the command; nothing is committed
    ensure_topic(settings)
    records, _ = waveform_records("new-one", 3, seed=3)
    produce_in_order(settings, records)
    with pytest.raises(TableNeedsRepairError, match="run `wavepipe table repair`"):
        pipeline.run_once(settings)
    assert schema_problems(settings.output_table), "a run mended a table"
    committed = committed_positions(settings, settings.group, settings.topic, [0])
    assert committed == {0: (None, None)}, committed

    code, out = run_cli(settings, "table", "repair", "--dry-run")
    assert code == 0, out
    assert "waveforms: would repair" in out and "would add" in out and "would lay it out by date" in out, out
    assert schema_problems(settings.output_table)
    code, out = run_cli(settings, "setup")  # an upgrade's setup repairs them
    assert code == 0, out
    assert "waveforms: repaired in commit" in out and "added" in out and "laid out by date (was source, date)" in out
    waveforms = DeltaTable(str(settings.output_table))
    repair_commit = next(h for h in waveforms.history() if h["operation"] == "REPAIR SCHEMA")
    assert "waveform_id" in repair_commit["operationParameters"]["columns"]
    assert set(LATER_COLUMNS) <= set(waveforms.schema().to_arrow().names)
    assert waveforms.metadata().partition_columns == ["date"]

    # the refused run resumes and publishes into them: the new columns null in the earlier rows
    report = pipeline.run_once(settings)
    assert report["waveforms"] == {"output_new": 1}
    assert_accounted(spark, settings, report)  # its own check of the logs' types among them
    waveforms = DeltaTable(str(settings.output_table))
    later = waveforms.to_pyarrow_table(columns=["waveform_id", "end_time"]).to_pylist()
    assert [r["waveform_id"] for r in later if r["end_time"] is not None] == ["new-one"]
    folders = {uri.rsplit("/", 2)[1] for uri in waveforms.file_uris()}
    assert folders == {"date=2026-11-19", "date=2026-11-20", f"date={START.date()}"}
    assert assert_delta_rs_reads_as_spark(spark, settings.output_table) == 13
    assert assert_delta_rs_reads_as_spark(spark, settings.quarantine_table) == 2
    assert_protocol_types(settings)

    # the history is kept (the legacy version still reads), and so is the idempotence of a publish:
    # the earlier transaction id is still known, so its append is skipped
    assert spark.sql(f"DESCRIBE HISTORY delta.`{settings.output_table}`").count() == history_before + 4
    assert spark.read.format("delta").option("versionAsOf", 0).load(str(settings.output_table)).count() == 12
    version = waveforms.version()
    again = spark.read.format("delta").load(str(settings.output_table)).limit(1)
    again.write.format("delta").mode("append").option("txnAppId", LEGACY_TXN).option("txnVersion", 1).save(
        str(settings.output_table)
    )
    assert DeltaTable(str(settings.output_table)).version() == version, "a known transaction committed again"
    code, out = run_cli(settings, "table", "repair")
    assert code == 0 and "waveforms: nothing to do" in out, out
