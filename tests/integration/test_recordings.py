"""Real recordings in and out through the real broker and engine: every obspy test-data file that
obspy can both read and write, a WAV and a WFDB record are produced from their files (`produce
--files`), published by a run, read back from the table by delta-rs (`wavepipe.recordings.read`)
and compared with what the format's own library reads; written back in their format, they read
as the originals written the same way."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import assert_accounted, make_settings, quarantine_reasons, run_cli
from wavepipe import storage
from wavepipe.consumers.kafka_admin import ensure_topic
from wavepipe.consumers.producer import produce_files
from wavepipe.contracts.runfiles import html_path
from wavepipe.pipeline import run_once

obspy = pytest.importorskip("obspy")
soundfile = pytest.importorskip("soundfile")
wfdb = pytest.importorskip("wfdb")

from wavepipe.recordings import read  # noqa: E402  (after the extras are known to be there)

pytestmark = pytest.mark.integration


def _writable_test_files() -> list[tuple[Path, str]]:
    """obspy's own test-data files (up to 4 MB) that obspy reads, in a format it also writes."""
    from obspy.core.util.base import ENTRY_POINTS

    # WAV files are read by soundfile, not obspy (test_a_wav_and_a_wfdb_record_come_back_as_they_were)
    writable = {name.upper() for name in ENTRY_POINTS["waveform_write"]} - {"WAV"}
    found = []
    for path in sorted((Path(obspy.__path__[0]) / "io").glob("*/tests/data/**/*")):
        if not path.is_file() or path.stat().st_size > 4_000_000:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                stream = obspy.read(str(path))
        except Exception:  # not a waveform file obspy reads: not in the set
            continue
        if len(stream) and stream[0].stats._format.upper() in writable:
            found.append((path, stream[0].stats._format))
    return found


def _key(trace) -> tuple:
    """A trace's identity; its length is its data's (a test file's header may say another)."""
    return (trace.id, trace.stats.starttime.ns // 1000, len(trace.data))


def _traces(path: Path) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [t for t in obspy.read(str(path)).split() if len(t.data) and t.data.dtype.kind in "iufc"]


def _written_and_read(traces: list, fmt: str, where: Path):
    """``traces`` written in ``fmt`` by obspy and read back (None: obspy's writer refuses them)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obspy.Stream([t.copy() for t in traces]).write(str(where), format=fmt)
            return obspy.read(str(where), format=fmt)
    except Exception:  # obspy refuses: not a case the round trip can show
        return None


def _batches(files: list[tuple[Path, str]]) -> list[list[tuple[Path, str]]]:
    """``files`` in batches none of which holds one trace identity twice: obspy's test data holds
    the same trace in several files (encodings, byte orders), which in one table is one waveform
    id, and with other content a conflict (test_a_file_sent_again_is_a_redelivery_...)."""
    batches: list[tuple[list, set]] = []
    for path, fmt in files:
        keys = {_key(t) for t in _traces(path)}
        batch = next((b for b in batches if not keys & b[1]), None)
        if batch is None:
            batch = ([], set())
            batches.append(batch)
        batch[0].append((path, fmt))
        batch[1].update(keys)
    return [members for members, _ in batches]


def _published(spark, settings, files: list[tuple[Path, str]]) -> dict[tuple, object]:
    """``files`` produced from their files and published by one run; the traces read back."""
    ensure_topic(settings, partitions=2)
    produced = produce_files(settings, [str(path) for path, _ in files])
    assert produced.failed == [] and produced.files == len(files)
    skipped = {reason.rsplit(": ", 1)[-1] for _, reason in produced.skipped}
    assert skipped <= {"no samples", "|S1 samples (text, not a waveform)"}, produced.skipped
    report = run_once(settings)
    assert report["waveforms"]["output_new"] == len(produced.sent)
    assert_accounted(spark, settings, report)
    return {_key(t): t for t in read(settings.output_table, as_="obspy")}


def _same(back, original) -> bool:
    """Equal samples (bit for bit, NaNs too, and type, in native byte order) and stats (id,
    start, rate, count, calibration)."""
    native = original.data.dtype.newbyteorder("=")
    return (
        _key(back) == _key(original)
        and back.data.dtype == native
        and back.data.tobytes() == original.data.astype(native).tobytes()
        and back.stats.sampling_rate == original.stats.sampling_rate
        and back.stats.calib == original.stats.calib
    )


def _as_read(traces) -> list[tuple]:
    return [(_key(t), t.data.tolist()) for t in traces]


def _written_back_differently(i: int, path: Path, fmt: str, got: dict, where: Path) -> bool:
    """Whether the traces read back, written by obspy in the file's own format and read again,
    differ both from the file's traces and from those written and read the same way: a writer
    that drops something (AH's drops a start's fraction of a second when the trace carries the
    file's own AH header) may drop it from either."""
    originals = _traces(path)
    ours = _written_and_read([got[_key(t)] for t in originals], fmt, where / f"ours-{i}")
    if ours is not None and _as_read(ours) == _as_read(originals):
        return False
    reference = _written_and_read(originals, fmt, where / f"ref-{i}")
    if reference is None:
        return False  # obspy cannot write the file's own traces in its format (e.g. a dtype it cannot encode)
    return ours is None or _as_read(ours) != _as_read(reference)


def test_obspy_test_files_come_back_with_equal_samples_and_stats(kafka, engine, spark, tmp_path):
    files = _writable_test_files()
    assert len(files) > 100, f"obspy's test data changed: only {len(files)} files it reads and writes"
    mismatched, differ, compared = [], [], 0
    for b, batch in enumerate(_batches(files)):
        got = _published(spark, make_settings(tmp_path / f"batch-{b}", kafka, engine), batch)
        for i, (path, fmt) in enumerate(batch):
            traces = _traces(path)
            once = [t for t in traces if sum(_key(o) == _key(t) for o in traces) == 1]  # else told apart by order only
            mismatched += [(path.name, t.id) for t in once if not _same(got[_key(t)], t)]
            compared += len(once)
            if once == traces and _written_back_differently(i, path, fmt, got, tmp_path / f"batch-{b}"):
                differ.append(path.name)
    assert compared > 150 and mismatched == [], f"{len(mismatched)} of {compared} traces differ: {mismatched[:5]}"
    assert differ == [], f"written back in their format, these read differently from the originals: {differ}"


def test_station_components_filter_by_seed_columns(settings, tmp_path):
    rng = np.random.default_rng(3)
    start = obspy.UTCDateTime("2026-03-01T00:00:00.000500Z")
    stream = obspy.Stream(
        [
            obspy.Trace(rng.integers(-1000, 1000, 600).astype(np.int32), header={
                "network": "XX", "station": station, "location": "00", "channel": channel,
                "sampling_rate": 20.0, "starttime": start + 60 * hour,
            })
            for station in ("ALPHA", "BETA")
            for hour in range(2)
            for channel in ("BHZ", "BHN", "BHE")
        ]
    )  # fmt: skip
    stream.write(str(tmp_path / "day.mseed"), format="MSEED")
    ensure_topic(settings)
    produced = produce_files(settings, [str(tmp_path / "*.mseed")], group_components=True)
    assert len(produced.sent) == 4, "each station's three aligned components make one waveform"
    run_once(settings)
    table = storage.delta_table(settings.output_table).to_pyarrow_table(
        columns=["source", "station", "channel_names", "calibration", "format"]
    )
    rows = table.to_pylist()
    assert {r["station"] for r in rows} == {"ALPHA", "BETA"}
    assert all(r["format"] == "MSEED" and r["calibration"] == [1.0] * 3 for r in rows)  # MiniSEED has no calib
    assert all(sorted(r["channel_names"]) == ["BHE", "BHN", "BHZ"] for r in rows)
    beta = read(settings.output_table, source="XX.BETA.*", start="2026-03-01T00:01:10Z", end="2026-03-01T00:01:20Z")
    assert len(beta) == 1 and beta[0].start_ns == (start + 60).ns, "only BETA's second record overlaps the range"
    back = read(settings.output_table, source="XX.*", as_="obspy")
    for trace in stream:
        (match,) = [t for t in back.select(id=trace.id) if t.stats.starttime == trace.stats.starttime]
        np.testing.assert_array_equal(match.data, trace.data)


def test_a_wav_and_a_wfdb_record_come_back_as_they_were(settings, tmp_path):
    rng = np.random.default_rng(5)
    stereo = (rng.integers(-(2**23), 2**23, size=(4000, 2)) << 8).astype(np.int32)  # 24-bit, left-justified
    soundfile.write(str(tmp_path / "ward-3.wav"), stereo, 8000, subtype="PCM_24")
    leads = rng.integers(-2000, 2000, size=(5000, 3)).astype(np.int16)
    wfdb.wrsamp(
        "rec-100", fs=360, units=["mV", "mV", "mV"], sig_name=["I", "II", "V1"], d_signal=leads, fmt=["212"] * 3,
        adc_gain=[200.0, 200.0, 400.0], baseline=[0, 0, 1024], base_date=None, base_time=None, write_dir=str(tmp_path),
    )  # fmt: skip
    ensure_topic(settings)
    code, out = run_cli(
        settings, "produce", "--files", str(tmp_path / "ward-3.wav"), str(tmp_path / "rec-100.hea"),
        "--start", "2026-05-01T10:00:00Z",
    )  # fmt: skip
    assert code == 0, out
    run_once(settings)
    sound, ecg = sorted(read(settings.output_table), key=lambda w: w.source, reverse=True)
    assert (sound.source, sound.extension.format, sound.sample_rate) == ("ward-3", "WAV:PCM_24", 8000.0)
    np.testing.assert_array_equal(sound.samples, stereo)
    assert ecg.extension.channel_names == ("I", "II", "V1") and ecg.extension.units == ("mV",) * 3
    np.testing.assert_array_equal(ecg.samples, leads)
    from wavepipe.recordings.audio import write_sound
    from wavepipe.recordings.ecg import write_wfdb

    write_sound(sound, tmp_path / "out.wav")
    assert soundfile.info(str(tmp_path / "out.wav")).subtype == "PCM_24"
    np.testing.assert_array_equal(soundfile.read(str(tmp_path / "out.wav"), dtype="int32")[0], stereo)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    write_wfdb(ecg, out_dir)
    again = wfdb.rdrecord(str(out_dir / "rec-100"), physical=False, return_res=16)
    original = wfdb.rdrecord(str(tmp_path / "rec-100"), physical=False, return_res=16)
    np.testing.assert_array_equal(again.d_signal, original.d_signal)
    assert (again.fs, again.sig_name, again.units, again.adc_gain, again.baseline) == (
        original.fs, original.sig_name, original.units, original.adc_gain, original.baseline,
    )  # fmt: skip


def test_a_file_sent_again_is_a_redelivery_and_a_changed_one_a_conflict(settings, spark, tmp_path):
    trace = obspy.Trace(
        np.arange(2000, dtype=np.int32), header={"network": "XX", "station": "GAMMA", "sampling_rate": 50.0}
    )
    trace.write(str(tmp_path / "g.mseed"), format="MSEED")
    ensure_topic(settings)
    produce_files(settings, [str(tmp_path / "g.mseed")])
    assert run_once(settings)["waveforms"]["output_new"] == 1
    produce_files(settings, [str(tmp_path / "g.mseed")])  # the same file again
    trace.data[100] = -1  # then the file changes and is sent once more
    trace.write(str(tmp_path / "g.mseed"), format="MSEED")
    produce_files(settings, [str(tmp_path / "g.mseed")])
    report = run_once(settings)
    assert "output_new" not in report["waveforms"], report["waveforms"]
    assert set(quarantine_reasons(spark, settings).values()) == {"id_conflict"}
    (kept,) = read(settings.output_table, as_="obspy")
    assert kept.data[100] == 100, "the waveform written first stays"


def test_a_file_that_cannot_be_read_is_listed_and_the_others_are_sent(settings, tmp_path):
    obspy.Trace(np.ones(100, np.float32), header={"station": "OK"}).write(str(tmp_path / "fine.mseed"), format="MSEED")
    (tmp_path / "garbage.mseed").write_bytes(b"not a recording at all")
    ensure_topic(settings)
    code, out = run_cli(settings, "produce", "--files", str(tmp_path))
    assert code == 1, out
    assert "garbage.mseed" in out and "1 of 2 files could not be read" in out
    assert "produced 1 waveforms" in out
    code, out = run_cli(settings, "produce", "--files", str(tmp_path / "nothing-*.mseed"))
    assert code == 2 and "nothing-*.mseed" in out, out


def _published_rows(settings, columns: list[str]) -> list[dict]:
    """The output's rows in the order gap_s follows: by source, start and (starting together) id."""
    table = storage.delta_table(settings.output_table).to_pyarrow_table(columns=["waveform_id", *columns])
    return sorted(table.to_pylist(), key=lambda r: (r["source"], r["start_time"], r["waveform_id"]))


@pytest.mark.parametrize("name,runs", [("gaps.mseed", 2), ("qualityflags.mseed", 1)])
def test_gaps_and_overlaps_agree_with_obspy_also_across_runs(settings, tmp_path, name, runs):
    """gap_s of each record against obspy's ``Stream.get_gaps()`` on the same traces; with two
    runs, the later half is published by the second (its first record's predecessor is in the
    table). qualityflags.mseed holds one record many times over: one file, one run (the copies
    are told apart by their place in the file). A gap is what obspy reports; an overlap is one
    sample longer: gap_s counts every sample both records cover, obspy's overlap leaves one out."""
    stream = obspy.read(str(Path(obspy.__path__[0]) / "io" / "mseed" / "tests" / "data" / name))
    stream.sort()
    cut = len(stream) // runs
    ensure_topic(settings)
    for part, traces in (("first", stream[:cut]), ("second", stream[cut:]))[:runs]:
        obspy.Stream(traces).write(str(tmp_path / f"{part}.mseed"), format="MSEED")
        produce_files(settings, [str(tmp_path / f"{part}.mseed")])
        run_once(settings)
    rows = _published_rows(settings, ["source", "start_time", "gap_s", "latency_s"])
    assert len(rows) == len(stream) and rows[0]["gap_s"] is None, "the first record has no predecessor"
    rate = stream[0].stats.sampling_rate
    theirs = [g[6] if g[6] > 0 else g[6] - 1 / rate for g in stream.get_gaps()]
    assert len(theirs) == len(stream) - 1
    assert [r["gap_s"] for r in rows[1:]] == pytest.approx(theirs, abs=1e-6)
    assert all(r["latency_s"] > 365 * 86400 for r in rows), "recorded in 2008, published now"
    _assert_qc_hours_agree_with_obspy(settings, stream, runs)


def _assert_qc_hours_agree_with_obspy(settings, stream, commits: int) -> None:
    """The qc table's hours against obspy's view of the same traces: its gaps and overlaps
    (``get_gaps``) by the hour the trace after them starts in, and the samples of the traces
    merged (``merge(method=1)``, a gap masked) in each hour; one commit per run."""
    import deltalake

    qc = deltalake.DeltaTable(str(settings.qc_table))
    assert qc.version() == commits - 1
    rows = {r["hour"].timestamp(): r for r in qc.to_pyarrow_table().to_pylist()}
    merged = stream.copy().merge(method=1)
    delta = stream[0].stats.delta
    for hour, row in rows.items():
        gaps = [g for g in stream.get_gaps() if hour <= g[5].timestamp < hour + 3600]
        theirs_gaps = [g[6] for g in gaps if g[6] > delta / 2]
        theirs_overlaps = [g[6] for g in gaps if g[6] < 0]
        assert (row["gaps"], row["overlaps"]) == (len(theirs_gaps), len(theirs_overlaps)), row
        assert row["max_gap_s"] == (pytest.approx(max(theirs_gaps), abs=1e-6) if theirs_gaps else None)
        part = merged.slice(obspy.UTCDateTime(hour), obspy.UTCDateTime(hour + 3600) - delta / 2)
        covered = sum(np.ma.count(t.data) for t in part) * delta
        assert row["availability_pct"] == pytest.approx(covered / 36, abs=len(gaps) * delta / 36 + 1e-9)
    assert sum(r["waveforms"] for r in rows.values()) >= len(stream)


def test_quality_metrics_of_a_run_match_numpys_on_the_samples_read_back(settings, tmp_path):
    rng = np.random.default_rng(8)
    start = obspy.UTCDateTime("2026-04-01T00:00:00Z")
    live = rng.normal(0, 300, 3000).astype(np.int32)
    live[[500, 1700]] = 90_000  # two spikes
    dead = np.full(3000, 4096, np.int32)
    clipped = (rng.normal(0, 12000, 3000)).astype(np.int16)
    clipped[100:160] = 32767
    for code, data in (("HHZ", live), ("HHN", dead)):
        obspy.Trace(data, header={"network": "XX", "station": "Q", "channel": code, "sampling_rate": 100.0,
                                  "starttime": start}).write(str(tmp_path / f"{code}.mseed"), format="MSEED")  # fmt: skip
    soundfile.write(str(tmp_path / "ward-9.wav"), np.column_stack([clipped, clipped // 2]), 500, subtype="PCM_16")
    ensure_topic(settings)
    produce_files(settings, [str(tmp_path)], start_ns=start.ns)
    report = run_once(settings)
    rows = {r["source"]: r for r in storage.delta_table(settings.output_table).to_pyarrow_table().to_pylist()}
    for waveform in read(settings.output_table):
        row, x = rows[waveform.source], waveform.samples.astype(np.float64)
        assert row["qc_min"] == x.min(axis=0).tolist() and row["qc_max"] == x.max(axis=0).tolist()
        assert row["qc_mean"] == pytest.approx(x.mean(axis=0).tolist())
        assert row["qc_rms"] == pytest.approx(np.sqrt((x**2).mean(axis=0)).tolist())
    assert rows["XX.Q..HHZ"]["qc_spikes"] == [2] and rows["XX.Q..HHZ"]["qc_dead"] == [False]
    assert rows["XX.Q..HHN"]["qc_dead"] == [True] and rows["XX.Q..HHN"]["qc_spikes"] == [0]
    assert rows["ward-9"]["qc_clipped_share"] == [pytest.approx(60 / 3000), 0.0]
    # the run's page draws the flagged ones, each with the channels that break its rule
    assert report["quality"]["by_rule"] == {"late": 3, "clipped": 1, "dead_channel": 1}, report["quality"]
    assert Path(report["quality"]["plot"]).read_bytes()[:4] == b"\x89PNG"
    _assert_the_flagged_plot_reads_in_words(Path(report["quality"]["plot"]))
    page = html_path(settings, report["run_id"]).read_text()
    assert "Flagged waveforms" in page and not report["notes"], report["notes"]


def test_a_quarantining_rule_holds_a_dead_channel_back_in_a_run_and_its_window_run(settings, spark, tmp_path):
    """A rule with ``action = "quarantine"``: the waveform breaking it goes to the quarantine table
    with the rule as its reason and the channel in its detail, not to the waveforms; the records
    add up; a window run over the same records does the same, and changes nothing; with the rule
    made to flag only, a window run publishes the waveform."""
    from datetime import UTC, datetime, timedelta

    rules = [
        {"name": "dead_channel", "metric": "qc_dead", "action": "quarantine"},
        {"name": "clipped", "metric": "qc_clipped_share", "above": 0.01},
    ]
    settings = settings.replace(quality_rules=rules)
    rng = np.random.default_rng(3)
    start = obspy.UTCDateTime("2026-04-01T00:00:00Z")
    for code, data in (("HHZ", rng.normal(0, 300, 3000).astype(np.int32)), ("HHN", np.full(3000, 7, np.int32))):
        obspy.Trace(data, header={"network": "XX", "station": "Q", "channel": code, "sampling_rate": 100.0,
                                  "starttime": start}).write(str(tmp_path / f"{code}.mseed"), format="MSEED")  # fmt: skip
    clipped = rng.normal(0, 12000, 3000).astype(np.int16)
    clipped[:90] = 32767
    soundfile.write(str(tmp_path / "ward-9.wav"), clipped, 500, subtype="PCM_16")
    began = datetime.now(UTC) - timedelta(seconds=5)
    ensure_topic(settings)
    produce_files(settings, [str(tmp_path)], start_ns=start.ns)

    def assert_published(report: dict) -> None:
        assert_accounted(spark, settings, report)
        assert report["waveforms"] == {"output_new": 2, "quarantined:qc_dead_channel": 1}, report["waveforms"]
        rows = storage.delta_table(settings.output_table).to_pyarrow_table(columns=["source", "qc_flags"]).to_pylist()
        assert sorted((r["source"], r["qc_flags"]) for r in rows) == [("XX.Q..HHZ", []), ("ward-9", ["clipped"])]
        (held,) = storage.delta_table(settings.quarantine_table).to_pyarrow_table().to_pylist()
        assert (held["source"], held["reason"]) == ("XX.Q..HHN", "qc_dead_channel")
        assert held["detail"] == "breaks quality rule dead_channel (qc_dead on any channel): HHN", held["detail"]
        hours = {r["source"]: r for r in storage.delta_table(settings.qc_table).to_pyarrow_table().to_pylist()}
        assert hours["XX.Q..HHN"]["waveforms"] == 0 and hours["XX.Q..HHZ"]["waveforms"] == 1, hours

    assert_published(run_once(settings))
    window = run_once(settings, window=(began, datetime.now(UTC)))
    assert window["status"] == "window_replaced"
    assert_published(window)

    # the rule made to flag only, a window run over the same records publishes the dead channel
    settings = settings.replace(quality_rules=[{**rules[0], "action": "flag"}, rules[1]])
    again = run_once(settings, window=(began, datetime.now(UTC)))
    assert_accounted(spark, settings, again)
    assert again["waveforms"] == {"output_new": 3}, again["waveforms"]
    rows = storage.delta_table(settings.output_table).to_pyarrow_table(columns=["source", "qc_flags"]).to_pylist()
    assert ("XX.Q..HHN", ["dead_channel"]) in [(r["source"], r["qc_flags"]) for r in rows]
    assert storage.delta_table(settings.quarantine_table).to_pyarrow_table().num_rows == 0
    hours = {r["source"]: r for r in storage.delta_table(settings.qc_table).to_pyarrow_table().to_pylist()}
    assert hours["XX.Q..HHN"]["waveforms"] == 1 and hours["XX.Q..HHN"]["dead_minutes"] == pytest.approx(0.5)


def _assert_the_flagged_plot_reads_in_words(path: Path) -> None:
    """The flagged plot of the recordings says its rule and, for each waveform, its source, UTC
    start, duration, channels and rate in words, the channels that break its rule by name, and
    UTC time on its x axis (the PNG's text carries the figure's words)."""
    from PIL import Image

    from wavepipe import plots

    text = Image.open(path).text
    assert text["Title"] == plots.FLAGGED_RULE
    words = text["Description"]
    assert "XX.Q..HHN, from 2026-04-01 00:00:00.000 UTC, 30.0 s, 1 channel at 100 Hz" in words, words
    assert "ward-9, from 2026-04-01 00:00:00.000 UTC, 6.0 s, 2 channels at 500 Hz" in words, words
    assert "channels: left\n" in words, "the clipped channel, by its name"
    assert words.count("x axis: time (UTC)") == words.count("channels: "), words
    assert "<i" not in words and "channels stacked" not in words
