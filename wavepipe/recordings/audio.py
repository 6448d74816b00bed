"""Audio recordings through soundfile (libsndfile: WAV, FLAC, OGG, AIFF, ...), and back.

Samples are read in the dtype that holds the file's exactly (``SUBTYPE_DTYPES``): 16-bit PCM as
int16, 24- and 32-bit PCM as int32, 8-bit PCM as int16, float as float32/float64. libsndfile
scales integers to fill the dtype: a 24-bit sample ``s`` is read as the int32 ``s * 256`` (left
justified) and an 8-bit one as the int16 ``s * 256``; writing them back to the same subtype keeps
the top bits, so the file's samples come back exactly. Lossy codecs (Vorbis, Opus, MP3) are
decoded to float32.

An audio file has no start time: ``start_ns`` when given, else the file's modification time
(``st_mtime_ns``), so the same unchanged file always gets the same start (and id).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wavepipe.contracts.protocol import Extension
from wavepipe.recordings import Recording, Skipped, require, short_text, with_ids

if TYPE_CHECKING:
    from wavepipe.recordings.read import Waveform

sf = require("soundfile")

#: soundfile's subtype -> the dtype that keeps its samples exactly. Not listed: lossy codecs
#: (``LOSSY_SUBTYPES``) as float32, every other (ADPCM, G.72x, GSM, u-law, A-law: 16-bit PCM
#: once decoded) as int16.
SUBTYPE_DTYPES = {
    "PCM_S8": "int16",
    "PCM_U8": "int16",
    "PCM_16": "int16",
    "PCM_24": "int32",
    "PCM_32": "int32",
    "FLOAT": "float32",
    "DOUBLE": "float64",
    "ALAC_16": "int16",
    "ALAC_20": "int32",
    "ALAC_24": "int32",
    "ALAC_32": "int32",
    "DWVW_24": "int32",
}
LOSSY_SUBTYPES = frozenset({"VORBIS", "OPUS", "MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III"})
#: The subtype a waveform of each dtype is written as when its format says none soundfile knows.
DTYPE_SUBTYPES = {"int16": "PCM_16", "int32": "PCM_32", "float32": "FLOAT", "float64": "DOUBLE"}


def dtype_for(subtype: str) -> str:
    """The numpy dtype that holds samples of soundfile ``subtype`` exactly (float32: lossy)."""
    if subtype in SUBTYPE_DTYPES:
        return SUBTYPE_DTYPES[subtype]
    return "float32" if subtype in LOSSY_SUBTYPES else "int16"


def recordings_from_sound(path: str | Path, *, start_ns: int | None = None) -> Iterator[Recording | Skipped]:
    """The audio file at ``path`` as one recording (a ``Skipped`` for a file without frames): samples
    (frames, channels) in ``dtype_for`` its subtype, source = the file's stem, format
    ``"<format>:<subtype>"`` (``WAV:PCM_16``), channels ``left``/``right`` when there are two,
    start = ``start_ns`` or the file's modification time."""
    path = Path(path)
    info = sf.info(str(path))
    if info.frames == 0:
        yield Skipped(f"{path.name}: no frames")
        return
    samples, rate = sf.read(str(path), dtype=dtype_for(info.subtype), always_2d=True)
    extension = Extension(
        channel_names=("left", "right") if info.channels == 2 else None,
        format=short_text(f"{info.format}:{info.subtype}"),
    )
    start = path.stat().st_mtime_ns if start_ns is None else start_ns
    recording = Recording(np.ascontiguousarray(samples), "", path.stem, start, float(rate), extension, str(path))
    yield from with_ids([recording])


def _format_and_subtype(waveform: Waveform) -> tuple[str | None, str | None]:
    """The stored ``<format>:<subtype>`` when soundfile can write it; else (None, the dtype's
    subtype): the format then follows the path's suffix."""
    fmt, _, subtype = (waveform.extension.format or "").partition(":")
    if fmt in sf.available_formats() and sf.check_format(fmt, subtype or None):
        return fmt, subtype or None
    return None, DTYPE_SUBTYPES.get(waveform.samples.dtype.name)


def write_sound(waveform: Waveform, path: str | Path) -> Path:
    """Write ``waveform`` as an audio file at ``path``, in its stored format and subtype (a
    recording's file comes back sample for sample); a waveform from elsewhere in the format of
    ``path``'s suffix, its dtype's subtype. The sample rate must be a whole number."""
    if waveform.sample_rate != int(waveform.sample_rate):
        raise ValueError(f"{waveform.waveform_id}: an audio file needs a whole sample rate, not {waveform.sample_rate}")
    fmt, subtype = _format_and_subtype(waveform)
    sf.write(str(path), waveform.samples, int(waveform.sample_rate), subtype=subtype, format=fmt)
    return Path(path)
