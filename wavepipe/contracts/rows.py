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
