"""wavepipe.recordings: files to recordings and back (obspy, soundfile, wfdb), a table read back
with delta-rs, path expansion. No Kafka, no Spark; a test that needs an optional package skips
without it (the compatibility tier runs these without the extras)."""

from __future__ import annotations

import importlib
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from wavepipe.contracts.protocol import MAX_ID_BYTES, Extension, checksum, output_facts
from wavepipe.contracts.rows import ROW_FACTS
from wavepipe.recordings import MissingExtraError, Recording, native, require, waveform_id_for
from wavepipe.recordings.files import expand, kind_of, recordings
from wavepipe.recordings.read import Waveform, read_table

START = datetime(2024, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
START_NS = int(START.timestamp()) * 1_000_000_000 + START.microsecond * 1000


def _obspy_data(fmt: str, name: str) -> str:
    obspy = pytest.importorskip("obspy")
    return str(Path(obspy.__path__[0]) / "io" / fmt / "tests" / "data" / name)


# -- ids and extras ---------------------------------------------------------------------------


def test_waveform_id_is_readable_and_stable():
    assert waveform_id_for("NL.HGN.00.BHZ", START_NS, 100) == "NL.HGN.00.BHZ/2024-03-01T12:00:00.250000Z/100"
    assert waveform_id_for("s", START_NS, 100, occurrence=2).endswith("/100#2")
    assert waveform_id_for("s", 1_500, 1) == "s/1970-01-01T00:00:00.000001500Z/1"  # nanoseconds kept when present
    assert waveform_id_for("s", START_NS, 100) == waveform_id_for("s", START_NS, 100)


def test_waveform_id_of_a_long_source_fits_and_stays_distinct():
    long_a, long_b = "é" * 300 + "a", "é" * 300 + "b"
    id_a, id_b = waveform_id_for(long_a, START_NS, 7, 3), waveform_id_for(long_b, START_NS, 7, 3)
    assert len(id_a.encode()) <= MAX_ID_BYTES and len(id_b.encode()) <= MAX_ID_BYTES
    assert id_a != id_b
    assert id_a.startswith("éé") and id_a.endswith("/2024-03-01T12:00:00.250000Z/7#3")


def test_a_missing_extra_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "obspy", None)
    monkeypatch.delitem(sys.modules, "wavepipe.recordings.seismic", raising=False)
    with pytest.raises(MissingExtraError, match=r"pip install 'wavepipe\[seismic\]'"):
        require("obspy")
    with pytest.raises(ImportError, match=r"wavepipe\[seismic\]"):
        importlib.import_module("wavepipe.recordings.seismic")
    (tmp_path / "a.mseed").write_bytes(b"not read")
    [(path, error)] = list(recordings([tmp_path]))
    assert path.name == "a.mseed" and isinstance(error, MissingExtraError)


def test_samples_of_a_non_numeric_dtype_are_refused_naming_the_file():
    with pytest.raises(ValueError, match=r"odd\.sac"):
        native(np.array(["a", "b"]), "odd.sac")
    big = np.arange(4, dtype=">i4")
    assert native(big, "x").dtype.str == "<i4" and native(big, "x").tolist() == [0, 1, 2, 3]


# -- seismic ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,name",
    [
        ("mseed", "test.mseed"),  # int32, Steim
        ("mseed", "gaps.mseed"),  # four traces of one id
        ("sac", "test.sac"),  # float32
        ("sac", "test.sac.swap"),  # big-endian float32
        ("gse2", "loc_RJOB20050831023349.z"),  # calib 0.0949
    ],
)
def test_obspy_file_round_trips_through_recordings(fmt, name):
    obspy = pytest.importorskip("obspy")
    from wavepipe.recordings.seismic import recordings_from_obspy, to_stream

    path = _obspy_data(fmt, name)
    found = list(recordings_from_obspy(path))
    assert all(r.samples.dtype.byteorder in "<=|" and r.samples.flags.c_contiguous for r in found)
    stream = to_stream(Waveform.from_recording(r) for r in found)
    expected = obspy.read(path)
    assert len(stream) == len(expected) == len(found)
    for got, want, rec in zip(stream, expected, found, strict=True):
        assert got.id == want.id == rec.source
        assert got.stats.starttime == want.stats.starttime
        assert (got.stats.sampling_rate, got.stats.npts, got.stats.calib) == (
            want.stats.sampling_rate,
            want.stats.npts,
            want.stats.calib,
        )
        assert got.data.dtype == want.data.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got.data, want.data)
        assert rec.extension.format == want.stats._format
        assert rec.waveform_id == waveform_id_for(want.id, want.stats.starttime.ns, want.stats.npts)


def test_a_recording_becomes_records_the_protocol_reads_back():
    pytest.importorskip("obspy")
    from wavepipe.contracts.protocol import parse_chunk, rebuild
    from wavepipe.recordings.seismic import recordings_from_obspy

    [rec] = list(recordings_from_obspy(_obspy_data("mseed", "test.mseed")))
    chunks = [parse_chunk(headers, value) for _, headers, value in rec.records(chunk_size=4096)]
    assert len(chunks) == -(-rec.samples.nbytes // 4096)
    meta = chunks[0].meta
    assert (meta.waveform_id, meta.source, meta.start_ns) == (rec.waveform_id, "NL.HGN.00.BHZ", rec.start_ns)
    assert Extension.from_json(meta.extension) == rec.extension
    np.testing.assert_array_equal(rebuild(b"".join(c.payload for c in chunks), meta.dtype, meta.channels), rec.samples)


def test_a_trace_without_samples_is_skipped_and_reported():
    obspy = pytest.importorskip("obspy")
    from wavepipe.recordings.seismic import stream_to_recordings

    path = _obspy_data("mseed", "three_records_zero_data_in_middle.mseed")
    converted = stream_to_recordings(obspy.read(path), path)
    assert [r.samples.shape for r in converted.recordings] == [(412, 1), (412, 1)]
    assert len(converted.skipped) == 1 and "BW.BGLD..EHE" in converted.skipped[0]


def _trace(channel: str, data: np.ndarray, *, station: str = "STA", start_ns: int = START_NS, calib: float = 1.0):
    obspy = pytest.importorskip("obspy")
    header = {"network": "XX", "station": station, "location": "00", "channel": channel, "sampling_rate": 20.0}
    return obspy.Trace(data=data, header=header | {"starttime": obspy.UTCDateTime(ns=start_ns), "calib": calib})


def test_a_trace_with_gaps_is_split_and_identical_traces_are_numbered():
    obspy = pytest.importorskip("obspy")
    from wavepipe.recordings.seismic import stream_to_recordings

    first = _trace("BHZ", np.arange(10, dtype=np.int32))
    later = _trace("BHZ", np.arange(10, dtype=np.int32), start_ns=START_NS + 2_000_000_000)
    merged = obspy.Stream([first, later]).merge()
    assert np.ma.isMaskedArray(merged[0].data)
    split = stream_to_recordings(merged, "m.mseed").recordings
    assert [r.start_ns for r in split] == [START_NS, START_NS + 2_000_000_000]
    assert all(r.samples.shape == (10, 1) for r in split)

    twice = stream_to_recordings(obspy.Stream([first, first.copy()]), "t.mseed").recordings
    assert [r.waveform_id.rsplit("/", 1)[1] for r in twice] == ["10", "10#1"]


def test_aligned_components_group_into_one_recording():
    obspy = pytest.importorskip("obspy")
    from wavepipe.recordings.seismic import stream_to_recordings, to_stream

    e, z, n = (np.arange(50, dtype=np.float32) + k * 100 for k in range(3))
    stream = obspy.Stream(
        [
            _trace("BHE", e, calib=0.5),
            _trace("BHZ", z, calib=2.0),
            _trace("BHN", n, calib=1.5),
            _trace("BH1", np.zeros(49, dtype=np.float32)),  # one sample short: stays single
            _trace("BHZ", z, station="OTHER"),  # another station
        ]
    )
    grouped, single, other = stream_to_recordings(stream, "three.mseed", group_components=True).recordings
    assert grouped.source == "XX.STA.00.BH?"
    assert grouped.extension.channel_names == ("BHZ", "BHN", "BHE")
    assert grouped.extension.calibration == (2.0, 1.5, 0.5)
    np.testing.assert_array_equal(grouped.samples, np.column_stack([z, n, e]))
    assert grouped.samples.flags.c_contiguous
    assert (single.source, other.source) == ("XX.STA.00.BH1", "XX.OTHER.00.BHZ")

    back = to_stream([Waveform.from_recording(grouped)])
    assert [t.id for t in back] == ["XX.STA.00.BHZ", "XX.STA.00.BHN", "XX.STA.00.BHE"]
    assert [t.stats.calib for t in back] == [2.0, 1.5, 0.5]
    np.testing.assert_array_equal(back[2].data, e)
    assert back[0].stats.starttime.ns == START_NS


def test_two_channels_of_a_real_file_group():
    pytest.importorskip("obspy")
    from wavepipe.recordings.seismic import recordings_from_obspy

    [rec] = list(recordings_from_obspy(_obspy_data("mseed", "two_channels.mseed"), group_components=True))
    assert (rec.source, rec.extension.channel_names, rec.samples.shape) == ("BW.UH3..EH?", ("EHZ", "EHE"), (386, 2))


def test_to_stream_names_channels_of_a_waveform_without_extension():
    pytest.importorskip("obspy")
    from wavepipe.recordings.seismic import to_stream

    seed = Waveform("w", "AB.CDE.10.HHZ", START_NS, 100.0, np.ones((5, 1), dtype="<i2"))
    plain = Waveform("v", "pump-3", START_NS, 100.0, np.ones((5, 2), dtype="<i2"))
    assert [t.id for t in to_stream([seed, plain])] == ["AB.CDE.10.HHZ", ".pump-3..0", ".pump-3..1"]


# -- audio ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,subtype,suffix,dtype",
    [
        ("WAV", "PCM_16", "wav", "int16"),
        ("WAV", "PCM_24", "wav", "int32"),
        ("WAV", "FLOAT", "wav", "float32"),
        ("FLAC", "PCM_24", "flac", "int32"),
        ("WAV", "PCM_U8", "wav", "int16"),
    ],
)
def test_sound_round_trips_sample_for_sample(tmp_path, fmt, subtype, suffix, dtype):
    sf = pytest.importorskip("soundfile")
    from wavepipe.recordings.audio import recordings_from_sound, write_sound

    original = tmp_path / f"tone.{suffix}"
    sf.write(original, np.random.default_rng(3).uniform(-0.9, 0.9, (800, 2)), 8000, format=fmt, subtype=subtype)
    [rec] = list(recordings_from_sound(original, start_ns=START_NS))
    assert (rec.source, rec.start_ns, rec.sample_rate) == ("tone", START_NS, 8000.0)
    assert rec.samples.dtype == np.dtype(dtype) and rec.samples.shape == (800, 2)
    assert rec.extension.format == f"{fmt}:{subtype}" and rec.extension.channel_names == ("left", "right")

    copy = write_sound(Waveform.from_recording(rec), tmp_path / f"copy.{suffix}")
    assert (sf.info(copy).format, sf.info(copy).subtype) == (fmt, subtype)
    for read_as in ("int32", "float64"):
        np.testing.assert_array_equal(sf.read(copy, dtype=read_as)[0], sf.read(original, dtype=read_as)[0])


def test_sound_starts_at_its_modification_time_without_a_start(tmp_path):
    sf = pytest.importorskip("soundfile")
    from wavepipe.recordings.audio import recordings_from_sound

    path = tmp_path / "mono.wav"
    sf.write(path, np.zeros(10, dtype=np.int16), 100, subtype="PCM_16")
    os.utime(path, ns=(START_NS, START_NS))
    [rec] = list(recordings_from_sound(path))
    assert rec.start_ns == START_NS and rec.extension.channel_names is None
    assert rec.waveform_id == waveform_id_for("mono", START_NS, 10)


def test_a_sound_file_without_frames_is_reported_as_skipped(tmp_path):
    sf = pytest.importorskip("soundfile")
    from wavepipe.recordings import Skipped
    from wavepipe.recordings.files import recordings

    sf.write(tmp_path / "empty.wav", np.zeros((0, 2), dtype=np.int16), 8000, subtype="PCM_16")
    assert list(recordings([tmp_path])) == [(tmp_path / "empty.wav", Skipped("empty.wav: no frames"))]


# -- ECG (WFDB) -------------------------------------------------------------------------------


def _write_record(folder: Path, name: str, *, dated: bool) -> np.ndarray:
    wfdb = pytest.importorskip("wfdb")
    d_signal = np.random.default_rng(5).integers(-2000, 2000, size=(600, 3))
    when = {"base_date": START.date(), "base_time": START.time().replace(tzinfo=None)} if dated else {}
    wfdb.wrsamp(
        name,
        fs=360,
        units=["mV", "mV", "uV"],
        sig_name=["I", "II", "V1"],
        d_signal=d_signal,
        fmt=["16", "16", "212"],
        adc_gain=[200.0, 200.0, 123.456],
        baseline=[0, 1024, 0],
        write_dir=str(folder),
        **when,
    )
    return d_signal


@pytest.mark.parametrize("dated", [True, False])
def test_wfdb_record_round_trips(tmp_path, dated):
    wfdb = pytest.importorskip("wfdb")
    from wavepipe.recordings.ecg import recordings_from_wfdb, write_wfdb

    (tmp_path / "in").mkdir()
    d_signal = _write_record(tmp_path / "in", "rec", dated=dated)
    given_start = START_NS + 7_000
    [rec] = list(recordings_from_wfdb(tmp_path / "in" / "rec.hea", start_ns=given_start))
    assert rec.samples.dtype == np.int16
    np.testing.assert_array_equal(rec.samples, d_signal)
    assert rec.source == "rec" and rec.start_ns == (START_NS if dated else given_start)
    assert rec.extension.channel_names == ("I", "II", "V1") and rec.extension.units == ("mV", "mV", "uV")
    assert rec.extension.calibration == (1 / 200, 1 / 200, 1 / 123.456)
    assert rec.extension.baseline == (0.0, 1024.0, 0.0) and rec.extension.format == "WFDB:16,16,212"

    header = write_wfdb(Waveform.from_recording(rec), tmp_path / "out")
    original = wfdb.rdrecord(str(tmp_path / "in" / "rec"), physical=False)
    again = wfdb.rdrecord(str(header.with_suffix("")), physical=False)
    np.testing.assert_array_equal(again.d_signal, original.d_signal)
    assert (again.fs, again.sig_name, again.units, again.fmt) == (
        original.fs,
        original.sig_name,
        original.units,
        original.fmt,
    )
    assert (again.adc_gain, again.baseline) == (original.adc_gain, original.baseline)
    [back] = list(recordings_from_wfdb(header))
    assert back.start_ns == rec.start_ns // 1000 * 1000  # WFDB keeps microseconds


def test_wfdb_24_bit_samples_are_int32(tmp_path):
    wfdb = pytest.importorskip("wfdb")
    from wavepipe.recordings.ecg import adc_gain, recordings_from_wfdb

    d_signal = np.array([[-8_000_000], [8_000_000], [3]])
    wfdb.wrsamp(
        "wide",
        fs=250,
        units=["uV"],
        sig_name=["a"],
        d_signal=d_signal,
        fmt=["24"],
        adc_gain=[1000.0],
        baseline=[0],
        write_dir=str(tmp_path),
    )
    os.utime(tmp_path / "wide.hea", ns=(START_NS, START_NS))
    [rec] = list(recordings_from_wfdb(tmp_path / "wide"))
    assert rec.samples.dtype == np.int32 and rec.samples[:, 0].tolist() == [-8_000_000, 8_000_000, 3]
    assert rec.start_ns == START_NS  # no base date: the header's modification time
    assert adc_gain(1 / 123.456) == 123.456 and adc_gain(1 / 200) == 200.0


# -- reading a table back ---------------------------------------------------------------------

SOURCES = ["XX.AAA.00.BHZ", "XX.AAB.00.BHZ", "YY.CCC..HHZ"]
RATE, N = 10.0, 100  # each waveform lasts 10 s


def _recording(source: str, start_ns: int, seed: int) -> Recording:
    samples = np.random.default_rng(seed).integers(-1000, 1000, size=(N, 2)).astype("<i4")
    ext = Extension(channel_names=("BHZ", "BHN"), units=("m/s", "m/s"), calibration=(0.5, 2.0), format="MSEED")
    return Recording(samples, waveform_id_for(source, start_ns, N), source, start_ns, RATE, ext, "test")


def _row(rec: Recording, offset: int) -> dict:
    payload = rec.samples.tobytes()
    facts = {
        "waveform_id": rec.waveform_id,
        "source": rec.source,
        "dtype": rec.samples.dtype.str,
        "channels": rec.channels,
        "sample_rate": rec.sample_rate,
        "start_ns": rec.start_ns,
        "checksum": checksum(payload),
        "topic": "t",
        "extension": rec.extension.as_json(),
    }
    return output_facts(facts, len(payload), 1, 0, offset, offset) | {"payload": payload, "run_id": "r1"}


@pytest.fixture
def table(tmp_path) -> tuple[str, list[Recording]]:
    """A partitioned output table of 3 sources x 2 waveforms (an hour apart), a file per waveform."""
    from deltalake import write_deltalake

    schema = pa.schema([*ROW_FACTS, pa.field("payload", pa.binary()), pa.field("run_id", pa.string())])
    recs = [_recording(s, START_NS + h * 3_600_000_000_000, 10 * i + h) for i, s in enumerate(SOURCES) for h in (0, 1)]
    uri = str(tmp_path / "waveforms")
    for offset, rec in enumerate(recs):
        write_deltalake(
            uri, pa.Table.from_pylist([_row(rec, offset)], schema=schema), mode="append", partition_by=["date"]
        )
    return uri, recs


def test_read_table_selects_sources_by_pattern_in_order(table):
    uri, recs = table
    everything = read_table(uri)
    assert [(w.source, w.start_ns) for w in everything] == sorted((r.source, r.start_ns) for r in recs)
    assert {w.source for w in read_table(uri, "XX.*")} == {"XX.AAA.00.BHZ", "XX.AAB.00.BHZ"}
    assert {w.source for w in read_table(uri, "XX.AA[B]*")} == {"XX.AAB.00.BHZ"}
    assert len(read_table(uri, "YY.CCC..HHZ")) == 2
    assert read_table(uri, "XX.AAA") == [] and read_table(uri, "xx.*") == []
    first = read_table(uri, "XX.AAA.00.BHZ")[0]
    np.testing.assert_array_equal(first.samples, recs[0].samples)
    assert (first.waveform_id, first.start_ns, first.sample_rate) == (recs[0].waveform_id, START_NS, RATE)
    assert first.extension == recs[0].extension


def test_read_table_returns_what_overlaps_the_range(table):
    uri, _ = table
    hour = timedelta(hours=1)

    def starts(**bounds) -> set[datetime]:
        return {datetime.fromtimestamp(w.start_ns / 1e9, UTC) for w in read_table(uri, **bounds)}

    assert starts(start=START + timedelta(seconds=5), end=START + timedelta(seconds=6)) == {START}
    assert starts(start=START + timedelta(seconds=10)) == {START + hour}  # ends are exclusive
    assert starts(end=START + hour) == {START}  # so are ends of the range
    assert starts(start=(START + hour).isoformat(), end=START_NS + 7_200_000_000_000) == {START + hour}
    assert starts(start="2024-03-01T12:00:09.9") == {START, START + hour}  # text without a zone is UTC
    assert len(read_table(uri, "XX.AAA*", start=START - hour, end=START + 2 * hour)) == 2


def test_read_table_of_an_older_table_computes_ends(tmp_path, table):
    import deltalake

    uri, _ = table
    old = deltalake.DeltaTable(uri).to_pyarrow_table().drop_columns(["end_time", "channel_names", "units", "format"])
    old_uri = str(tmp_path / "older")
    deltalake.write_deltalake(old_uri, old, partition_by=["date"])
    found = read_table(old_uri, "XX.AAA*", start=START + timedelta(seconds=9), end=START + timedelta(minutes=1))
    assert [w.start_ns for w in found] == [START_NS]
    assert found[0].extension == Extension(calibration=(0.5, 2.0))
    assert read_table(old_uri, "XX.AAA*", start=START + timedelta(seconds=10), end=START + timedelta(minutes=1)) == []


def test_waveforms_become_streams_and_data_arrays(table):
    from wavepipe.recordings import read

    uri, recs = table
    [w] = read(uri, "YY.*", end=START + timedelta(seconds=1))
    expected_times = np.datetime64(START_NS, "ns") + np.arange(N) * np.timedelta64(100_000_000, "ns")
    np.testing.assert_array_equal(w.times(), expected_times)

    pytest.importorskip("xarray")
    [array] = read(uri, "YY.*", end=START + timedelta(seconds=1), as_="xarray")
    assert array.dims == ("time", "channel") and list(array.channel.values) == ["BHZ", "BHN"]
    np.testing.assert_array_equal(array.sel(channel="BHN").values, recs[4].samples[:, 1])
    np.testing.assert_array_equal(array.time.values, expected_times)
    assert (array.attrs["source"], array.attrs["units"], array.attrs["calibration"]) == (
        "YY.CCC..HHZ",
        ["m/s", "m/s"],
        [0.5, 2.0],
    )

    obspy = pytest.importorskip("obspy")
    stream = read(uri, "YY.*", end=START + timedelta(seconds=1), as_="obspy")
    assert [t.id for t in stream] == ["YY.CCC..BHZ", "YY.CCC..BHN"]  # channel codes from the extension
    np.testing.assert_array_equal(stream[1].data, recs[4].samples[:, 1])
    assert stream[0].stats.starttime == obspy.UTCDateTime(ns=START_NS) and stream[1].stats.calib == 2.0


# -- paths ------------------------------------------------------------------------------------


def test_expand_finds_files_folders_and_globs(tmp_path):
    for name in ("a/x.mseed", "a/sub/y.wav", "a/.hidden", "a/.h/z.wav", "b/r.hea", "b/r.dat"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert expand([tmp_path / "a"]) == [tmp_path / "a/sub/y.wav", tmp_path / "a/x.mseed"]
    assert expand([f"{tmp_path}/**/*.wav", tmp_path / "b/r.hea"]) == [tmp_path / "a/sub/y.wav", tmp_path / "b/r.hea"]
    assert expand([tmp_path / "a/.hidden"]) == [tmp_path / "a/.hidden"]  # named outright: kept
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        expand([tmp_path / "a", tmp_path / "nothing-here*"])
    assert [kind_of(p) for p in ("x.WAV", "r.hea", "x.mseed", "x.sac", "noext")] == ["audio", "ecg"] + ["seismic"] * 3


def test_recordings_read_each_file_and_report_the_unreadable(tmp_path):
    pytest.importorskip("obspy")
    pytest.importorskip("wfdb")
    _write_record(tmp_path, "rec", dated=True)
    (tmp_path / "broken.mseed").write_bytes(b"no seismic data here")
    found = list(recordings(sorted(tmp_path.iterdir())))
    assert [p.name for p, _ in found] == ["broken.mseed", "rec.hea"]  # rec's signal files read with it
    (_, error), (_, rec) = found
    assert isinstance(error, Exception) and not isinstance(error, Recording)
    assert isinstance(rec, Recording) and rec.samples.shape == (600, 3)


def test_the_core_never_imports_a_domain_package():
    """DESIGN: readers of domain formats are extras the core never imports; the CLI, the
    producer, the run's steps and ``wavepipe.recordings`` itself load none of them."""
    import subprocess
    import sys

    code = (
        "import sys; import wavepipe.cli, wavepipe.consumers.producer, wavepipe.pipeline, wavepipe.recordings; "
        "print(sorted(m for m in ('obspy', 'soundfile', 'wfdb', 'xarray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
