"""The chunk protocol, version 1 (docs/chunk-protocol.md is the normative text).

A waveform is a C-ordered array of shape (samples, channels) of one numeric dtype. Its bytes are
split into chunks of at most ``chunk_size`` bytes; each chunk is one Kafka record whose value is
the chunk's bytes and whose headers describe the chunk and the whole waveform. The record key is
the waveform id, so all chunks of a waveform share a partition.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

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


class ProtocolError(ValueError):
    """A record does not follow the chunk protocol; ``reason`` is a stable, short code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class WaveformMeta:
    """What every chunk says about its whole waveform."""

    waveform_id: str
    dtype: str  # numpy dtype string with byte order, e.g. "<f4"
    channels: int
    sample_rate: float
    start_ns: int  # UTC epoch nanoseconds of the first sample
    source: str

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
    start_time: datetime,
    source: str,
    chunk_size: int,
) -> list[tuple[bytes, list[tuple[str, bytes]], bytes]]:
    """Split one waveform into ``(key, headers, value)`` records following protocol v1.

    ``samples`` is (samples,) or (samples, channels) of a numeric dtype; the bytes are taken in
    C order with an explicit byte order in the dtype string so any reader can rebuild it.
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
    if start_time.tzinfo is None:
        raise ValueError("start_time must be timezone-aware")
    data = np.ascontiguousarray(array).tobytes()
    count = max(1, -(-len(data) // chunk_size))
    start_ns = int(start_time.timestamp()) * 1_000_000_000 + start_time.microsecond * 1000
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
    ]
    key = waveform_id.encode()
    view = memoryview(data)
    return [
        (key, common + [(H_SEQ, str(seq).encode())], bytes(view[seq * chunk_size : (seq + 1) * chunk_size]))
        for seq in range(count)
    ]


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
    meta, count, size, check = _waveform_headers(tuple(h[name] for name in _WAVEFORM_HEADERS))
    seq = _int_header(h, H_SEQ, 0, INT32_MAX)
    if seq >= count:
        raise ProtocolError("malformed_header", f"{H_SEQ}={seq} is not below {H_COUNT}={count}")
    return Chunk(meta, seq, count, size, check, value)


#: The headers every chunk of a waveform repeats, in ``_waveform_headers``'s order.
_WAVEFORM_HEADERS = (H_ID, H_SOURCE, H_DTYPE, H_CHECKSUM, H_COUNT, H_SIZE, H_CHANNELS, H_START, H_RATE)


@functools.lru_cache(maxsize=4096)
def _waveform_headers(values: tuple[bytes, ...]) -> tuple[WaveformMeta, int, int, str]:
    """The waveform's facts from the headers all its chunks repeat (``_WAVEFORM_HEADERS``'s
    values), checked once per waveform, not once per chunk: a reader sees the same values for
    every chunk of a waveform (a ``ProtocolError`` is not cached: it is raised for each chunk)."""
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
    except (TypeError, ValueError):
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
    return WaveformMeta(waveform_id, dtype.str, channels, rate, start_ns, source), count, size, check


def output_facts(facts: dict, size: int, n_chunks: int, partition: int, first_offset: int, last_offset: int) -> dict:
    """What the output table says about a whole waveform of ``size`` bytes, all but its payload.
    ``facts``: the chunks' ``waveform_id``, ``source``, ``dtype``, ``channels``, ``sample_rate``,
    ``start_ns``, ``checksum`` and ``topic``. One definition for both places that make these rows:
    the readers (for a waveform they hashed as they staged it) and the Spark assembly."""
    n_samples = size // (np.dtype(facts["dtype"]).itemsize * facts["channels"])
    start_us = facts["start_ns"] // 1000
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
        "size_bytes": size,
        "n_chunks": n_chunks,
        "checksum": facts["checksum"],
        "topic": facts["topic"],
        "partition": partition,
        "first_offset": first_offset,
        "last_offset": last_offset,
    }


def rebuild(payload: bytes, dtype: str, channels: int) -> np.ndarray:
    """The (samples, channels) array a reassembled payload stands for."""
    return np.frombuffer(payload, dtype=np.dtype(dtype)).reshape(-1, channels)
