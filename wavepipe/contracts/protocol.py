"""The chunk protocol, version 1 (docs/chunk-protocol.md is the normative text).

A waveform is a C-ordered array of shape (samples, channels) of one numeric dtype. Its bytes are
split into chunks of at most ``chunk_size`` bytes; each chunk is one Kafka record whose value is
the chunk's bytes and whose headers describe the chunk and the whole waveform. The record key is
the waveform id, so all chunks of a waveform share a partition.

Extension 1.1 adds optional headers that describe the recording (``Extension``: channel names,
units, calibration, the SEED network, station and location, the file format); a reader of 1.0
ignores them, and a record without them is a 1.0 record.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from wavepipe.contracts.errors import BadRecordError

PROTOCOL_VERSION = 1

H_VERSION = "wp-version"
H_ID = "wp-id"
H_SEQ = "wp-seq"
H_COUNT = "wp-count"
H_SIZE = "wp-size"
H_CHECKSUM = "wp-checksum"
H_DTYPE = "wp-dtype"
H_CHANNELS = "wp-channels"
H_RATE = "wp-sample-rate"
H_START = "wp-start-ns"
H_SOURCE = "wp-source"

#: Extension 1.1: optional headers, each on every chunk of a waveform or on none (``Extension``).
H_CHANNEL_NAMES = "wp-channel-names"
H_UNITS = "wp-units"
H_CALIBRATION = "wp-calibration"
H_BASELINE = "wp-baseline"
H_NETWORK = "wp-network"
H_STATION = "wp-station"
H_LOCATION = "wp-location"
H_FORMAT = "wp-format"
#: Per channel: a JSON array of ``wp-channels`` items; the others are plain text.
_LIST_HEADERS = {H_CHANNEL_NAMES: str, H_UNITS: str, H_CALIBRATION: float, H_BASELINE: float}
_TEXT_HEADERS = (H_NETWORK, H_STATION, H_LOCATION, H_FORMAT)
EXTENSION_HEADERS = (*_LIST_HEADERS, *_TEXT_HEADERS)
#: The longest text an extension header's item may be, in UTF-8 bytes.
MAX_NAME_BYTES = 64

REQUIRED_HEADERS = (
    H_VERSION,
    H_ID,
    H_SEQ,
    H_COUNT,
    H_SIZE,
    H_CHECKSUM,
    H_DTYPE,
    H_CHANNELS,
    H_RATE,
    H_START,
    H_SOURCE,
)
CHECKSUM_PREFIX = "sha256:"
#: numpy dtype kinds a waveform may have: signed/unsigned integers, floats, complex.
NUMERIC_KINDS = frozenset("iufc")
MAX_ID_BYTES = 256


class ProtocolError(BadRecordError):
    """A record does not follow the chunk protocol; ``reason`` is a stable, short code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Extension:
    """What a recording's file says about it beyond the samples (extension 1.1; each optional).

    ``channel_names``: one per channel (SEED channel codes such as ``BHZ``, ECG leads, ``left``);
    ``units``: of the physical values, one per channel (``m/s``, ``mV``; ``""`` unknown);
    ``calibration`` and ``baseline``: one per channel, physical value = (sample - baseline) *
    calibration (obspy's ``calib``; WFDB's 1 / ``adc_gain`` and ``baseline``); ``network``,
    ``station``, ``location``: SEED codes; ``format``: the file format the samples came from
    (``MSEED``, ``SAC``, ``WAV:PCM_16``, ``WFDB:212``), so a writer can give them back as they were."""

    channel_names: tuple[str, ...] | None = None
    units: tuple[str, ...] | None = None
    calibration: tuple[float, ...] | None = None
    baseline: tuple[float, ...] | None = None
    network: str | None = None
    station: str | None = None
    location: str | None = None
    format: str | None = None

    def headers(self) -> list[tuple[str, bytes]]:
        """The extension's headers (only those it has)."""
        out = []
        for header, field in _EXTENSION_FIELDS.items():
            value = getattr(self, field)
            if value is None:
                continue
            text = json.dumps(list(value)) if header in _LIST_HEADERS else value
            out.append((header, text.encode()))
        return out

    def as_json(self) -> str | None:
        """The extension as one canonical JSON text (None: empty): what a chunk's staged row
        carries, equal for equal extensions."""
        present = {f: list(v) if isinstance(v, tuple) else v for f, v in vars(self).items() if v is not None}
        return json.dumps(present, sort_keys=True, separators=(",", ":")) if present else None

    @classmethod
    def from_json(cls, text: str | None) -> Extension:
        if not text:
            return cls()
        return cls(**{f: tuple(v) if isinstance(v, list) else v for f, v in json.loads(text).items()})


_EXTENSION_FIELDS = {
    H_CHANNEL_NAMES: "channel_names",
    H_UNITS: "units",
    H_CALIBRATION: "calibration",
    H_BASELINE: "baseline",
    H_NETWORK: "network",
    H_STATION: "station",
    H_LOCATION: "location",
    H_FORMAT: "format",
}


@dataclass(frozen=True)
class WaveformMeta:
    """What every chunk says about its whole waveform."""

    waveform_id: str
    dtype: str  # numpy dtype string with byte order, e.g. "<f4"
    channels: int
    sample_rate: float
    start_ns: int  # UTC epoch nanoseconds of the first sample
    source: str
    extension: str | None = None  # ``Extension.as_json`` of its extension headers (None: a 1.0 waveform)

    @property
    def start_time(self) -> datetime:
        return datetime.fromtimestamp(self.start_ns / 1e9, tz=UTC)


@dataclass(frozen=True)
class Chunk:
    """One decoded record: which waveform, where in it, and the waveform's facts."""

    meta: WaveformMeta
    seq: int
    count: int
    size: int
    checksum: str
    payload: bytes


def checksum(data: bytes | memoryview) -> str:
    return CHECKSUM_PREFIX + hashlib.sha256(data).hexdigest()


def split_waveform(
    samples: np.ndarray,
    *,
    waveform_id: str,
    sample_rate: float,
    start_time: datetime | int,
    source: str,
    chunk_size: int,
    extension: Extension | None = None,
) -> list[tuple[bytes, list[tuple[str, bytes]], bytes]]:
    """Split one waveform into ``(key, headers, value)`` records following protocol v1.

    ``samples`` is (samples,) or (samples, channels) of a numeric dtype; the bytes are taken in
    C order with an explicit byte order in the dtype string so any reader can rebuild it.
    ``start_time``: aware, or UTC epoch nanoseconds; ``extension``: its headers (1.1) are added,
    checked as a reader checks them.
    """
    array = np.asarray(samples)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"waveform must be (samples,) or (samples, channels), got {array.shape}")
    if array.dtype.kind not in NUMERIC_KINDS:
        raise ValueError(f"waveform dtype must be numeric, got {array.dtype}")
    if chunk_size <= 0:
        raise ValueError("chunk_size must be positive")
    if not waveform_id or len(waveform_id.encode()) > MAX_ID_BYTES:
        raise ValueError(f"waveform_id must be 1..{MAX_ID_BYTES} bytes")
    if sample_rate <= 0:
        raise ValueError("sample_rate must be positive")
    start_ns = start_time if isinstance(start_time, int) else epoch_ns(start_time)
    extra = (extension or Extension()).headers()
    try:
        parse_extension(tuple(value for _, value in extra), tuple(name for name, _ in extra), array.shape[1])
    except ProtocolError as exc:
        raise ValueError(exc.detail) from None
    data = np.ascontiguousarray(array).tobytes()
    count = max(1, -(-len(data) // chunk_size))
    common = [
        (H_VERSION, str(PROTOCOL_VERSION).encode()),
        (H_ID, waveform_id.encode()),
        (H_COUNT, str(count).encode()),
        (H_SIZE, str(len(data)).encode()),
        (H_CHECKSUM, checksum(data).encode()),
        (H_DTYPE, array.dtype.str.encode()),
        (H_CHANNELS, str(array.shape[1]).encode()),
        (H_RATE, repr(float(sample_rate)).encode()),
        (H_START, str(start_ns).encode()),
        (H_SOURCE, source.encode()),
        *extra,
    ]
    key = waveform_id.encode()
    view = memoryview(data)
    return [
        (key, common + [(H_SEQ, str(seq).encode())], bytes(view[seq * chunk_size : (seq + 1) * chunk_size]))
        for seq in range(count)
    ]


def epoch_ns(when: datetime) -> int:
    """An aware ``datetime`` as UTC epoch nanoseconds (exact to its microsecond)."""
    if when.tzinfo is None:
        raise ValueError("start_time must be timezone-aware")
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_CHECKSUM_RE = re.compile(r"sha256:[0-9a-f]{64}")


def _int_header(headers: dict[str, bytes], name: str, minimum: int, maximum: int) -> int:
    try:
        value = int(headers[name])
    except ValueError:
        raise ProtocolError("malformed_header", f"{name}={headers[name]!r} is not an integer") from None
    if not minimum <= value <= maximum:
        raise ProtocolError("malformed_header", f"{name}={value} is outside [{minimum}, {maximum}]")
    return value


def decode_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    """Headers as a dict; a header repeated with different values is a protocol error."""
    out: dict[str, bytes] = {}
    for name, value in headers or ():
        if value is None:
            continue
        if name in out and out[name] != value:
            raise ProtocolError("malformed_header", f"header {name} repeated with different values")
        out[name] = value
    return out


def parse_chunk(headers: Sequence[tuple[str, bytes | None]] | None, value: bytes | None) -> Chunk:
    """Decode one record, or raise ``ProtocolError`` with the reason to dead-letter it."""
    h = decode_headers(headers)
    if H_VERSION not in h:
        raise ProtocolError("missing_header", f"no {H_VERSION} header: not a wavepipe chunk")
    if h[H_VERSION] != str(PROTOCOL_VERSION).encode():
        raise ProtocolError("unknown_version", f"protocol version {h[H_VERSION]!r} is not supported")
    missing = [name for name in REQUIRED_HEADERS if name not in h]
    if missing:
        raise ProtocolError("missing_header", f"missing {', '.join(missing)}")
    if not value:
        raise ProtocolError("empty_value", "record value is empty")
    present = tuple(name for name in EXTENSION_HEADERS if name in h)
    meta, count, size, check = _waveform_headers(
        tuple(h[name] for name in _WAVEFORM_HEADERS), tuple(h[name] for name in present), present
    )
    seq = _int_header(h, H_SEQ, 0, INT32_MAX)
    if seq >= count:
        raise ProtocolError("malformed_header", f"{H_SEQ}={seq} is not below {H_COUNT}={count}")
    return Chunk(meta, seq, count, size, check, value)


#: The headers every chunk of a waveform repeats, in ``_waveform_headers``'s order.
_WAVEFORM_HEADERS = (H_ID, H_SOURCE, H_DTYPE, H_CHECKSUM, H_COUNT, H_SIZE, H_CHANNELS, H_START, H_RATE)


@functools.lru_cache(maxsize=4096)
def _waveform_headers(
    values: tuple[bytes, ...], extension: tuple[bytes, ...] = (), names: tuple[str, ...] = ()
) -> tuple[WaveformMeta, int, int, str]:
    """The waveform's facts from the headers all its chunks repeat (``_WAVEFORM_HEADERS``'s
    values, then the extension headers ``names`` present and their values), checked once per
    waveform, not once per chunk: a reader sees the same values for every chunk of a waveform (a
    ``ProtocolError`` is not cached: it is raised for each chunk)."""
    h = dict(zip(_WAVEFORM_HEADERS, values, strict=True))
    try:
        waveform_id = h[H_ID].decode()
        source = h[H_SOURCE].decode()
        dtype_str = h[H_DTYPE].decode()
        check = h[H_CHECKSUM].decode()
    except UnicodeDecodeError as exc:
        raise ProtocolError("malformed_header", f"header is not UTF-8: {exc}") from None
    if not waveform_id or len(h[H_ID]) > MAX_ID_BYTES:
        raise ProtocolError("malformed_header", f"{H_ID} must be 1..{MAX_ID_BYTES} bytes")
    try:
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError, SyntaxError, OverflowError):  # numpy parses some strings as Python code
        raise ProtocolError("malformed_header", f"{H_DTYPE}={dtype_str!r} is not a dtype") from None
    if dtype.kind not in NUMERIC_KINDS or dtype.shape or dtype.names:
        raise ProtocolError("malformed_header", f"{H_DTYPE}={dtype_str!r} is not a numeric scalar type")
    if not _CHECKSUM_RE.fullmatch(check):
        raise ProtocolError("malformed_header", f"{H_CHECKSUM} must be sha256:<64 lowercase hex digits>")
    count = _int_header(h, H_COUNT, 1, INT32_MAX)
    size = _int_header(h, H_SIZE, 1, INT64_MAX)
    channels = _int_header(h, H_CHANNELS, 1, INT32_MAX)
    start_ns = _int_header(h, H_START, -INT64_MAX, INT64_MAX)
    try:
        rate = float(h[H_RATE])
    except ValueError:
        raise ProtocolError("malformed_header", f"{H_RATE}={h[H_RATE]!r} is not a number") from None
    if not rate > 0 or rate == float("inf"):
        raise ProtocolError("malformed_header", f"{H_RATE} must be a positive finite number")
    if size % (dtype.itemsize * channels):
        raise ProtocolError("malformed_header", f"{H_SIZE}={size} is not whole samples of {dtype_str} x {channels}")
    ext = parse_extension(extension, names, channels).as_json()
    return WaveformMeta(waveform_id, dtype.str, channels, rate, start_ns, source, ext), count, size, check


def _text(name: str, raw: bytes | str) -> str:
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ProtocolError("malformed_header", f"{name} is not UTF-8") from None
    if len(text.encode()) > MAX_NAME_BYTES:
        raise ProtocolError("malformed_header", f"{name}: {text[:20]!r}... is over {MAX_NAME_BYTES} bytes")
    return text


def _list_header(name: str, raw: bytes, channels: int) -> tuple:
    try:
        items = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: arrays nested too deep
        raise ProtocolError("malformed_header", f"{name} is not a JSON array") from None
    if not isinstance(items, list) or len(items) != channels:
        raise ProtocolError("malformed_header", f"{name} must be a JSON array of {channels} items (wp-channels)")
    if _LIST_HEADERS[name] is str:
        if not all(isinstance(i, str) for i in items):
            raise ProtocolError("malformed_header", f"{name} must hold strings")
        return tuple(_text(name, i) for i in items)
    if not all(isinstance(i, int | float) and not isinstance(i, bool) and math.isfinite(i) for i in items):
        raise ProtocolError("malformed_header", f"{name} must hold finite numbers")
    return tuple(float(i) for i in items)


def parse_extension(values: tuple[bytes, ...], names: tuple[str, ...], channels: int) -> Extension:
    """The extension headers ``names`` (their ``values``) of a waveform of ``channels``
    channels, checked; a ``ProtocolError`` (``malformed_header``) says which is wrong."""
    fields = {}
    for name, raw in zip(names, values, strict=True):
        parsed = _list_header(name, raw, channels) if name in _LIST_HEADERS else _text(name, raw)
        fields[_EXTENSION_FIELDS[name]] = parsed
    return Extension(**fields)


def output_facts(facts: dict, size: int, n_chunks: int, partition: int, first_offset: int, last_offset: int) -> dict:
    """What the output table says about a whole waveform of ``size`` bytes, all but its payload.
    ``facts``: the chunks' ``waveform_id``, ``source``, ``dtype``, ``channels``, ``sample_rate``,
    ``start_ns``, ``checksum``, ``topic`` and ``extension`` (``Extension.as_json``). One definition
    for both places that make these rows: the readers (for a waveform they hashed as they staged
    it) and the Spark assembly."""
    n_samples = size // (np.dtype(facts["dtype"]).itemsize * facts["channels"])
    start_us = facts["start_ns"] // 1000
    ext = Extension.from_json(facts["extension"])
    return {
        "waveform_id": facts["waveform_id"],
        "source": facts["source"],
        "start_time": start_us,
        "date": start_us // 86_400_000_000,
        "dtype": facts["dtype"],
        "channels": facts["channels"],
        "sample_rate": facts["sample_rate"],
        "n_samples": n_samples,
        "duration_s": n_samples / facts["sample_rate"],
        "end_time": end_us(facts["start_ns"], n_samples, facts["sample_rate"]),
        "size_bytes": size,
        "n_chunks": n_chunks,
        "checksum": facts["checksum"],
        "topic": facts["topic"],
        "partition": partition,
        "first_offset": first_offset,
        "last_offset": last_offset,
        **{name: list(value) if isinstance(value, tuple) else value for name, value in vars(ext).items()},
    }


#: The latest instant a table's time column holds (9999-12-31T23:59:59.999999Z, Spark's limit), in
#: microseconds since 1970.
MAX_TIME_US = 253_402_300_799_999_999
#: The earliest (0001-01-01T00:00:00Z).
MIN_TIME_US = -62_135_596_800_000_000


def end_us(start_ns: int, n_samples: int, sample_rate: float) -> int | None:
    """The instant after the last sample, in microseconds; None beyond what a time column holds
    (a sample rate so low that the waveform would end after the year 9999)."""
    span_ns = n_samples * 1e9 / sample_rate
    if not span_ns < MAX_TIME_US * 1000:
        return None
    end_us = (start_ns + round(span_ns)) // 1000
    return end_us if end_us <= MAX_TIME_US else None


def rebuild(payload: bytes, dtype: str, channels: int) -> np.ndarray:
    """The (samples, channels) array a reassembled payload stands for."""
    return np.frombuffer(payload, dtype=np.dtype(dtype)).reshape(-1, channels)
