"""ECG (and other physiological) recordings through wfdb: a WFDB record to a recording, and back.

The samples are the record's digital values (``d_signal``), exactly as its signal files hold them:
int16 for formats of at most 16 bits, int32 for 24- and 32-bit ones. The header's ``adc_gain``
and ``baseline`` travel as the extension's calibration (1 / gain) and baseline, so physical =
(sample - baseline) / gain, as WFDB defines it.

Start: the header's base date and time, taken as UTC (WFDB gives no zone); a record without a base
date starts at ``start_ns`` when given, else at its header file's modification time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wavepipe.contracts.protocol import MAX_NAME_BYTES, Extension, epoch_ns
from wavepipe.recordings import Recording, native, require, texts, with_ids

if TYPE_CHECKING:
    from wavepipe.recordings.read import Waveform

wfdb = require("wfdb")

#: Bits of a sample of each WFDB signal format (as wfdb's own table says).
FMT_BITS = {
    "8": 8,
    "16": 16,
    "24": 24,
    "32": 32,
    "61": 16,
    "80": 8,
    "160": 16,
    "212": 12,
    "310": 10,
    "311": 10,
    "508": 8,
    "516": 16,
    "524": 24,
}
FORMAT_PREFIX = "WFDB"


def record_name(path: str | Path) -> str:
    """The record ``path`` names: the path of its ``.hea`` file without the suffix, or the record's path."""
    path = Path(path)
    return str(path.with_suffix("")) if path.suffix == ".hea" else str(path)


def _return_res(fmts: list[str]) -> int:
    """The ``rdrecord`` resolution that holds every digital sample of ``fmts`` exactly."""
    return 16 if all(FMT_BITS.get(fmt, 32) <= 16 for fmt in fmts) else 32


def _format_text(fmts: list[str]) -> str:
    """``WFDB:<fmt>`` (all channels one format), ``WFDB:<fmt>,<fmt>,...`` (one per channel) or,
    when that is longer than an extension item may be, ``WFDB``."""
    text = f"{FORMAT_PREFIX}:" + (fmts[0] if len(set(fmts)) == 1 else ",".join(fmts))
    return text if len(text.encode()) <= MAX_NAME_BYTES else FORMAT_PREFIX


def _start_ns(record, header_path: Path, start_ns: int | None) -> int:
    if record.base_date is not None:
        base = datetime.combine(record.base_date, record.base_time or datetime.min.time())
        return epoch_ns(base.replace(tzinfo=UTC))
    return header_path.stat().st_mtime_ns if start_ns is None else start_ns


def recordings_from_wfdb(path: str | Path, *, start_ns: int | None = None) -> Iterator[Recording]:
    """The WFDB record at ``path`` (its ``.hea`` file, or the record's path without a suffix) as
    one recording of its digital samples (none for a record without signals): source = the
    record's name, channel names and units from the header, calibration = 1 / ``adc_gain``
    (none when a gain is 0), baseline, format ``WFDB:<fmt>``."""
    name = record_name(path)
    header = wfdb.rdheader(name)
    if isinstance(header, wfdb.MultiRecord):
        raise ValueError(f"{path}: multi-segment WFDB records are not supported")
    if not header.n_sig:
        return
    if any(spf != 1 for spf in header.samps_per_frame or []):
        raise ValueError(f"{path}: signals of several samples per frame are not supported")
    record = wfdb.rdrecord(name, physical=False, return_res=_return_res(header.fmt))
    gains = [float(g) for g in record.adc_gain]
    extension = Extension(
        channel_names=texts(record.sig_name),
        units=texts(record.units),
        calibration=None if 0.0 in gains else tuple(1.0 / g for g in gains),
        baseline=tuple(float(b) for b in record.baseline),
        format=_format_text(list(record.fmt)),
    )
    samples = native(np.asarray(record.d_signal), str(path))
    start = _start_ns(record, Path(f"{name}.hea"), start_ns)
    yield from with_ids([Recording(samples, "", record.record_name, start, float(record.fs), extension, str(path))])


def adc_gain(calibration: float) -> float:
    """The WFDB gain of ``calibration``: the shortest decimal whose reciprocal is exactly
    ``calibration``, so a header's gain (``200``, ``123.456``) comes back as it was written,
    not as ``1 / (1 / gain)`` (``123.45599999999999``)."""
    for digits in range(1, 18):
        gain = float(f"{1.0 / calibration:.{digits}g}")
        if 1.0 / gain == calibration:
            return gain
    return 1.0 / calibration


def _fmts(waveform: Waveform) -> list[str]:
    """Each channel's WFDB format: the stored ones, else 16 or 32 by the samples' dtype."""
    prefix, _, listed = (waveform.extension.format or "").partition(":")
    fmts = listed.split(",") if prefix == FORMAT_PREFIX and listed else []
    if len(fmts) == waveform.channels:
        return fmts
    if len(fmts) == 1:
        return fmts * waveform.channels
    dtype = waveform.samples.dtype
    return ["16" if dtype.kind == "i" and dtype.itemsize <= 2 else "32"] * waveform.channels


def _record_name(source: str) -> str:
    """``source`` as a WFDB record name (letters, digits, ``-`` and ``_``; others become ``_``)."""
    return re.sub(r"[^-\w]", "_", source, flags=re.ASCII)


def write_wfdb(waveform: Waveform, folder: str | Path) -> Path:
    """Write ``waveform`` (integer samples) as a WFDB record in ``folder``; its ``.hea`` file's path.

    The record: name from the source (``_record_name``), signal names (the channel names, or
    ``0``, ``1``...), units (``NU`` where unknown), the stored formats, gains and baselines (gain
    1, baseline 0 without them: the samples are the physical values), and the waveform's start as
    base date and time (UTC; also for a record that had none, then the start it was given)."""
    if waveform.samples.dtype.kind not in "iu":
        raise ValueError(f"{waveform.waveform_id}: a WFDB record holds integer samples, not {waveform.samples.dtype}")
    ext, n = waveform.extension, waveform.channels
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=waveform.start_ns // 1000)
    name = _record_name(waveform.source)
    Path(folder).mkdir(parents=True, exist_ok=True)
    wfdb.wrsamp(
        name,
        fs=waveform.sample_rate,
        units=[unit or "NU" for unit in ext.units] if ext.units else ["NU"] * n,
        sig_name=waveform.channel_names(),
        d_signal=np.asarray(waveform.samples, dtype=np.int64),
        fmt=_fmts(waveform),
        adc_gain=[adc_gain(c) for c in ext.calibration] if ext.calibration else [1.0] * n,
        baseline=[round(b) for b in ext.baseline] if ext.baseline else [0] * n,
        base_date=start.date(),
        base_time=start.time(),
        write_dir=str(folder),
    )
    return Path(folder) / f"{name}.hea"
