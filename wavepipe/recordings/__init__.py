"""Recordings: waveforms as files hold them (seismic, audio, ECG), ready to send, and read back.

A ``Recording`` is one waveform read from a file: its samples exactly as the file stores them (no
conversion to physical units; ``Extension`` says how), its identity (``source``, ``start_ns``) and
the file it came from. ``files.recordings`` turns paths into recordings; ``read.read`` turns a
wavepipe table back into arrays, obspy Streams or xarray DataArrays.

The domain packages are optional extras, imported only when a function needs them; one that is
missing raises ``MissingExtraError`` naming the extra to install (``wavepipe[seismic]``: obspy,
``[audio]``: soundfile, ``[ecg]``: wfdb, ``[xarray]``).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import numpy as np

from wavepipe.contracts.protocol import MAX_ID_BYTES, MAX_NAME_BYTES, Extension, split_waveform
from wavepipe.recordings.extras import EXTRAS, MissingExtraError, require

# the package's ``read`` is the function (``from wavepipe.recordings.read import ...`` reaches the module)
from wavepipe.recordings.read import Waveform, read

__all__ = [
    "EXTRAS",
    "MissingExtraError",
    "Recording",
    "Skipped",
    "Waveform",
    "read",
    "require",
    "short_text",
    "waveform_id_for",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Recording:
    """One waveform read from a file, its samples as the file stores them.

    ``samples``: (n_samples, channels), native byte order, C-contiguous; ``start_ns``: UTC epoch
    nanoseconds of the first sample; ``origin``: the file it came from."""

    samples: np.ndarray
    waveform_id: str
    source: str
    start_ns: int
    sample_rate: float
    extension: Extension
    origin: str

    def __post_init__(self) -> None:
        if self.samples.ndim != 2 or self.samples.shape[0] < 1 or self.samples.shape[1] < 1:
            raise ValueError(f"{self.origin}: samples must be (n_samples>0, channels>0), got {self.samples.shape}")

    @property
    def channels(self) -> int:
        return self.samples.shape[1]

    def records(self, chunk_size: int) -> list[tuple[bytes, list[tuple[str, bytes]], bytes]]:
        """The recording as Kafka ``(key, headers, value)`` records (``protocol.split_waveform``)."""
        return split_waveform(
            self.samples,
            waveform_id=self.waveform_id,
            sample_rate=self.sample_rate,
            start_time=self.start_ns,
            source=self.source,
            chunk_size=chunk_size,
            extension=self.extension,
        )


@dataclass(frozen=True)
class Skipped:
    """A part of a file that is no waveform and is not sent (a trace without samples, an ASCII log
    channel), and why: reported beside the recordings, never dropped unsaid."""

    reason: str


def iso_ns(start_ns: int) -> str:
    """``start_ns`` as ISO 8601 UTC text with microseconds (nanoseconds when it has them), ``Z``-suffixed."""
    micros, nanos = divmod(start_ns, 1000)
    text = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return f"{text}{nanos:03d}Z" if nanos else f"{text}Z"


#: Hex digits of the source's sha256 kept in an id whose source had to be shortened.
_HASH_DIGITS = 16


def waveform_id_for(source: str, start_ns: int, n_samples: int, occurrence: int = 0) -> str:
    """A readable waveform id from the recording's identity: ``<source>/<start>Z/<n_samples>``,
    ``#<occurrence>`` appended when a file holds more than one recording of that identity.

    The same identity always gives the same id (a file sent again is a redelivery; a changed file
    a visible id conflict). The id is at most ``MAX_ID_BYTES`` UTF-8 bytes: a source too long is
    cut and ends in ``~`` and its sha256's first 16 hex digits, so distinct sources stay distinct."""
    tail = f"/{iso_ns(start_ns)}/{n_samples}" + (f"#{occurrence}" if occurrence else "")
    budget = MAX_ID_BYTES - len(tail.encode())
    if len(source.encode()) > budget:
        digest = hashlib.sha256(source.encode()).hexdigest()[:_HASH_DIGITS]
        source = _cut_utf8(source, budget - _HASH_DIGITS - 1) + "~" + digest
    return source + tail


def _cut_utf8(text: str, max_bytes: int) -> str:
    """``text``'s longest prefix of at most ``max_bytes`` UTF-8 bytes (never half a character)."""
    return text.encode()[: max(0, max_bytes)].decode(errors="ignore")


def short_text(text: str) -> str:
    """``text`` as an extension item may hold it: at most ``MAX_NAME_BYTES`` UTF-8 bytes (cut, with
    a warning, when longer)."""
    if len(text.encode()) <= MAX_NAME_BYTES:
        return text
    cut = _cut_utf8(text, MAX_NAME_BYTES)
    log.warning("%r is over %d bytes; kept as %r", text, MAX_NAME_BYTES, cut)
    return cut


def texts(items) -> tuple[str, ...] | None:
    """``items`` as an extension's per-channel texts (each ``short_text``, a missing one ``""``);
    None stays None."""
    return None if items is None else tuple(short_text("" if item is None else str(item)) for item in items)


def with_ids(recordings: list[Recording]) -> list[Recording]:
    """``recordings`` of one file with their ids: ``waveform_id_for`` of each identity, numbered by
    occurrence in file order when the file holds an identity more than once."""
    seen: dict[tuple[str, int, int], int] = {}
    out = []
    for rec in recordings:
        identity = (rec.source, rec.start_ns, rec.samples.shape[0])
        occurrence = seen.get(identity, 0)
        seen[identity] = occurrence + 1
        out.append(replace(rec, waveform_id=waveform_id_for(*identity, occurrence=occurrence)))
    return out


def native(samples: np.ndarray, origin: str) -> np.ndarray:
    """``samples`` as a little-endian (native), C-contiguous array of its own numeric dtype;
    ``ValueError`` naming ``origin`` when the dtype is not numeric."""
    if samples.dtype.kind not in "iufc":
        raise ValueError(f"{origin}: samples of dtype {samples.dtype} are not numeric")
    return np.ascontiguousarray(samples, dtype=samples.dtype.newbyteorder("<"))
