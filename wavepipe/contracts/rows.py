"""The columns of a waveform's row in the output table, but its payload: one definition for the
readers' rows (waveforms they hashed as they staged them) and the Spark assembly's."""

from __future__ import annotations

import pyarrow as pa

#: ``protocol.output_facts``'s keys and types. ``end_time``: the instant after the last sample
#: (``start_time`` + ``n_samples`` / ``sample_rate``), where a contiguous next waveform starts; the
#: columns after it come from extension 1.1 (``protocol.Extension``), null where a producer sent none.
ROW_FACTS = pa.schema(
    [
        pa.field("waveform_id", pa.string(), False),
        pa.field("source", pa.string(), False),
        pa.field("start_time", pa.timestamp("us", tz="UTC"), False),
        pa.field("date", pa.date32(), False),
        pa.field("dtype", pa.string(), False),
        pa.field("channels", pa.int32(), False),
        pa.field("sample_rate", pa.float64(), False),
        pa.field("n_samples", pa.int64(), False),
        pa.field("duration_s", pa.float64(), False),
        pa.field("size_bytes", pa.int64(), False),
        pa.field("n_chunks", pa.int32(), False),
        pa.field("checksum", pa.string(), False),
        pa.field("topic", pa.string(), False),
        pa.field("partition", pa.int32(), False),
        pa.field("first_offset", pa.int64(), False),
        pa.field("last_offset", pa.int64(), False),
        pa.field("end_time", pa.timestamp("us", tz="UTC"), True),
        pa.field("channel_names", pa.list_(pa.string()), True),
        pa.field("units", pa.list_(pa.string()), True),
        pa.field("calibration", pa.list_(pa.float64()), True),
        pa.field("baseline", pa.list_(pa.float64()), True),
        pa.field("network", pa.string(), True),
        pa.field("station", pa.string(), True),
        pa.field("location", pa.string(), True),
        pa.field("format", pa.string(), True),
    ]
)

#: A waveform's quality measured from its samples as its row is written (``spark_apps.quality``;
#: docs/quality.md), per channel lists.
QC_FIELDS = [
    pa.field("qc_min", pa.list_(pa.float64()), True),
    pa.field("qc_max", pa.list_(pa.float64()), True),
    pa.field("qc_mean", pa.list_(pa.float64()), True),
    pa.field("qc_median", pa.list_(pa.float64()), True),
    pa.field("qc_rms", pa.list_(pa.float64()), True),
    pa.field("qc_std", pa.list_(pa.float64()), True),
    pa.field("qc_nan_share", pa.list_(pa.float64()), True),
    pa.field("qc_clipped_share", pa.list_(pa.float64()), True),
    pa.field("qc_dead", pa.list_(pa.bool_()), True),
    pa.field("qc_spikes", pa.list_(pa.int64()), True),
]
QC_NAMES = [f.name for f in QC_FIELDS]
#: A waveform's place among its source's: ``gap_s``, its start minus the end (``end_time``) of
#: the waveform of its source that starts last before it (negative: an overlap; null: none known),
#: in this run or an earlier one; ``latency_s``, from its end to when its row was written (a few
#: seconds before the run's commit publishes it).
TIMING_FIELDS = [pa.field("gap_s", pa.float64(), True), pa.field("latency_s", pa.float64(), True)]
#: The names of the quality rules (``contracts.quality.QualityRule``) the row breaks.
FLAGS_FIELD = pa.field("qc_flags", pa.list_(pa.string()), True)
#: Every quality column of a published row.
QUALITY_FIELDS = [*QC_FIELDS, *TIMING_FIELDS, FLAGS_FIELD]
QUALITY_NAMES = [f.name for f in QUALITY_FIELDS]

#: A staged dead letter: the record as it came, where from, and why it is not a chunk.
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("headers_json", pa.string()),
        ("value", pa.binary()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)
