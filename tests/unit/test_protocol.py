from datetime import UTC, datetime

import numpy as np
import pytest

from wavepipe.contracts import protocol as p

START = datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize("dtype", ["<i2", ">i4", "<u1", "<f4", ">f8", "<c8", "<i8"])
@pytest.mark.parametrize("channels", [1, 3])
def test_split_then_parse_round_trips(dtype, channels):
    rng = np.random.default_rng(7)
    samples = (rng.normal(size=(1001, channels)) * 100).astype(np.dtype(dtype))
    records = p.split_waveform(
        samples, waveform_id="w-1", sample_rate=250.0, start_time=START, source="st-01", chunk_size=1000
    )
    size = samples.nbytes
    assert len(records) == -(-size // 1000)
    chunks = [p.parse_chunk(headers, value) for _, headers, value in records]
    assert [c.seq for c in chunks] == list(range(len(records)))
    assert {c.count for c in chunks} == {len(records)}
    assert all(key == b"w-1" for key, _, _ in records)
    meta = chunks[0].meta
    assert (meta.dtype, meta.channels, meta.sample_rate, meta.source) == (np.dtype(dtype).str, channels, 250.0, "st-01")
    assert meta.start_time == START
    payload = b"".join(c.payload for c in chunks)
    assert p.checksum(payload) == chunks[0].checksum
    np.testing.assert_array_equal(p.rebuild(payload, meta.dtype, meta.channels), samples)


def test_one_dimensional_waveform_is_one_channel():
    records = p.split_waveform(
        np.arange(10, dtype="<i2"), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=64
    )
    assert len(records) == 1
    assert p.parse_chunk(records[0][1], records[0][2]).meta.channels == 1


def _headers(**changes):
    _, headers, value = p.split_waveform(
        np.arange(8, dtype="<f4"), waveform_id="w", sample_rate=10.0, start_time=START, source="s", chunk_size=1024
    )[0]
    hd = dict(headers)
    for name, new in changes.items():
        name = name.replace("_", "-")
        if new is None:
            hd.pop(name)
        else:
            hd[name] = new
    return list(hd.items()), value


@pytest.mark.parametrize(
    "changes,reason",
    [
        ({"wp_version": None}, "missing_header"),
        ({"wp_version": b"2"}, "unknown_version"),
        ({"wp_checksum": None}, "missing_header"),
        ({"wp_seq": b"x"}, "malformed_header"),
        ({"wp_seq": b"5"}, "malformed_header"),  # seq >= count
        ({"wp_count": b"0"}, "malformed_header"),
        ({"wp_dtype": b"<U4"}, "malformed_header"),
        ({"wp_dtype": b"nonsense"}, "malformed_header"),
        ({"wp_sample_rate": b"-1"}, "malformed_header"),
        ({"wp_sample_rate": b"nan"}, "malformed_header"),
        ({"wp_size": b"31"}, "malformed_header"),  # not whole <f4 samples
        ({"wp_checksum": b"md5:abc"}, "malformed_header"),
        ({"wp_id": b"\xff\xfe"}, "malformed_header"),
    ],
)
def test_bad_headers_are_protocol_errors_with_reasons(changes, reason):
    headers, value = _headers(**changes)
    with pytest.raises(p.ProtocolError) as err:
        p.parse_chunk(headers, value)
    assert err.value.reason == reason


def test_empty_value_and_no_headers():
    headers, _ = _headers()
    with pytest.raises(p.ProtocolError) as err:
        p.parse_chunk(headers, b"")
    assert err.value.reason == "empty_value"
    with pytest.raises(p.ProtocolError) as err:
        p.parse_chunk(None, b"junk")
    assert err.value.reason == "missing_header"


def test_split_rejects_what_the_protocol_cannot_carry():
    with pytest.raises(ValueError):
        p.split_waveform(np.array(["a"]), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=8)
    with pytest.raises(ValueError):
        p.split_waveform(
            np.zeros(4), waveform_id="w", sample_rate=1.0, start_time=datetime(2026, 1, 1), source="s", chunk_size=8
        )
    with pytest.raises(ValueError):
        p.split_waveform(
            np.zeros((2, 2, 2)), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=8
        )


@pytest.mark.parametrize(
    "changes",
    [
        {"wp_dtype": b"(-1,)f4"},
        {"wp_dtype": b"(2,)f4"},
        {"wp_count": b"3000000000"},
        {"wp_channels": b"3000000000"},
        {"wp_start_ns": str(2**63).encode()},
        {"wp_checksum": ("sha256:" + "A" * 64).encode()},
        {"wp_checksum": ("sha256:" + "g" * 64).encode()},
    ],
)
def test_values_the_staging_columns_cannot_hold_are_malformed(changes):
    headers, value = _headers(**changes)
    with pytest.raises(p.ProtocolError) as err:
        p.parse_chunk(headers, value)
    assert err.value.reason == "malformed_header"


SEED = p.Extension(
    channel_names=("BHZ", "BHN", "BHE"),
    units=("m/s", "m/s", ""),
    calibration=(1.5e-9, 2.0, 0.25),
    baseline=(0.0, 0.0, 12.0),
    network="IU",
    station="ANMO",
    location="00",
    format="MSEED",
)


def test_extension_headers_travel_with_every_chunk_and_land_in_the_row():
    samples = np.arange(300, dtype="<i4").reshape(100, 3)
    records = p.split_waveform(
        samples, waveform_id="w", sample_rate=20.0, start_time=START, source="IU.ANMO.00.BH?", chunk_size=400,
        extension=SEED,
    )  # fmt: skip
    metas = {p.parse_chunk(headers, value).meta for _, headers, value in records}
    assert len(records) == 3 and len(metas) == 1
    meta = metas.pop()
    assert p.Extension.from_json(meta.extension) == SEED
    facts = {**vars(meta), "checksum": p.checksum(samples.tobytes()), "topic": "t"}
    row = p.output_facts(facts, samples.nbytes, 3, 0, 10, 12)
    assert row["channel_names"] == ["BHZ", "BHN", "BHE"] and row["calibration"] == [1.5e-9, 2.0, 0.25]
    assert (row["network"], row["station"], row["location"], row["format"]) == ("IU", "ANMO", "00", "MSEED")
    assert row["end_time"] - row["start_time"] == 5_000_000  # 100 samples at 20 Hz, in microseconds


def test_a_waveform_without_extension_headers_is_a_version_1_0_waveform():
    _, headers, value = p.split_waveform(
        np.arange(4, dtype="<f4"), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=64
    )[0]
    assert not any(name in p.EXTENSION_HEADERS for name, _ in headers)
    meta = p.parse_chunk(headers, value).meta
    assert meta.extension is None
    row = p.output_facts({**vars(meta), "checksum": "x", "topic": "t"}, 16, 1, 0, 0, 0)
    assert row["channel_names"] is None and row["network"] is None


def test_extension_as_json_is_canonical():
    again = p.Extension(**dict(reversed(list(vars(SEED).items()))))
    assert again.as_json() == SEED.as_json()
    assert p.Extension().as_json() is None and p.Extension.from_json(None) == p.Extension()


@pytest.mark.parametrize(
    "header,value,says",
    [
        ("wp-channel-names", b'["Z", "N"]', "3 items"),
        ("wp-channel-names", b"Z,N,E", "not a JSON array"),
        ("wp-channel-names", b'["Z", 1, "E"]', "strings"),
        ("wp-units", b'["m/s", "m/s", "' + b"x" * 65 + b'"]', "over 64 bytes"),
        ("wp-calibration", b"[1, NaN, 2]", "finite numbers"),
        ("wp-calibration", b"[1, true, 2]", "finite numbers"),
        ("wp-baseline", b'{"a": 1}', "3 items"),
        ("wp-station", b"\xff\xfe", "not UTF-8"),
        ("wp-network", b"N" * 65, "over 64 bytes"),
    ],
)
def test_malformed_extension_headers_are_dead_letters_that_say_which(header, value, says):
    _, headers, chunk = p.split_waveform(
        np.zeros((4, 3), "<f4"), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=64
    )[0]
    with pytest.raises(p.ProtocolError) as caught:
        p.parse_chunk([*headers, (header, value)], chunk)
    assert caught.value.reason == "malformed_header"
    assert header in caught.value.detail and says in caught.value.detail


def test_split_refuses_an_extension_a_reader_would_dead_letter():
    with pytest.raises(ValueError, match="wp-channel-names must be a JSON array of 2 items"):
        p.split_waveform(
            np.zeros((4, 2), "<i2"), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=64,
            extension=p.Extension(channel_names=("Z",)),
        )  # fmt: skip
    with pytest.raises(ValueError, match="finite"):
        p.split_waveform(
            np.zeros(4, "<i2"), waveform_id="w", sample_rate=1.0, start_time=START, source="s", chunk_size=64,
            extension=p.Extension(calibration=(float("inf"),)),
        )  # fmt: skip


def test_a_waveform_ending_after_the_year_9999_has_no_end_time():
    facts = {"waveform_id": "w", "source": "s", "dtype": "<f4", "channels": 1, "sample_rate": 1e-12}
    row = p.output_facts({**facts, "start_ns": 0, "checksum": "x", "topic": "t", "extension": None}, 400, 1, 0, 0, 0)
    assert row["end_time"] is None and row["duration_s"] == 1e14
    row = p.output_facts(
        {**facts, "sample_rate": 0.5, "start_ns": 10**18, "checksum": "x", "topic": "t", "extension": None},
        8,
        1,
        0,
        0,
        0,
    )
    assert row["end_time"] == 10**15 + 4_000_000


def test_hostile_headers_raise_only_protocol_errors():
    """Whatever headers a producer sends, parsing either gives a chunk or a ``ProtocolError`` (a
    dead letter with its reason): the reader treats any other error as wavepipe's own defect and
    stops, so none may come from a record's content (numpy parses some dtype strings as Python,
    json recurses on nested arrays)."""
    import random

    headers, value = _headers()
    base = dict(headers)
    names = [*base, *p.EXTENSION_HEADERS]
    hostile = [b"", b"\xff\xfe", b"-1", b"1e400", b"nan", b"[" * 100_000, b"[1e999]", b"9" * 5000, b"(1e400,)f4",
               b"i4, i4", b",", b"O", b"V8", b"M8[ns]", b"[('a','<f4')]", b"[null]", b"{}", b"(2,3)f4"]  # fmt: skip
    rng = random.Random(1)
    for _ in range(3000):
        h = dict(base)
        for _ in range(rng.randint(1, 3)):
            name, r = rng.choice(names), rng.random()
            if r < 0.1:
                h.pop(name, None)
            elif r < 0.6:
                h[name] = rng.choice(hostile)
            else:
                h[name] = rng.randbytes(rng.randint(0, 12))
        try:
            p.parse_chunk(list(h.items()), rng.choice([value, b"", None]))
        except p.ProtocolError as exc:
            assert exc.reason in {"missing_header", "unknown_version", "malformed_header", "empty_value"}
