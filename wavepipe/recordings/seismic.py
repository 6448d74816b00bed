"""Seismic recordings through obspy: any file format obspy detects (MiniSEED, SAC, GSE2, SEG-Y...)
to recordings, and waveforms back to an obspy ``Stream``.

A trace becomes one recording of its own samples (its dtype kept, made little-endian and
C-contiguous): source = its SEED id ``NET.STA.LOC.CHA``, extension = its channel, ``calib``,
network, station, location and the format obspy read it as. A trace with gaps (a masked array) is
split into its contiguous pieces; a trace with no samples or with text samples (a log channel)
gives no recording (it is reported in ``StreamRecordings.skipped``). With ``group_components``, the aligned components of one
instrument (same NET.STA.LOC, band and instrument code, start, rate, length and dtype) become one
multi-channel recording, source ``NET.STA.LOC.BH?``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from wavepipe.contracts.protocol import NUMERIC_KINDS, Extension
from wavepipe.recordings import Recording, Skipped, native, require, short_text, with_ids

if TYPE_CHECKING:
    from wavepipe.recordings.read import Waveform

obspy = require("obspy")
log = logging.getLogger(__name__)

#: The component letters in the order a grouped recording's channels take (any other after, sorted).
COMPONENT_ORDER = "ZNE123"


@dataclass(frozen=True)
class StreamRecordings:
    """A stream's recordings, and the traces that gave none (``"<id> at <start>: no samples"``, or
    text samples: a MiniSEED log channel)."""

    recordings: tuple[Recording, ...]
    skipped: tuple[str, ...]


def recordings_from_obspy(path: str | Path, *, group_components: bool = False) -> Iterator[Recording | Skipped]:
    """The recordings of the file at ``path`` (``obspy.read``, format detected), in file order,
    then a ``Skipped`` for each trace that is no waveform (no samples, text samples)."""
    converted = stream_to_recordings(obspy.read(str(path)), str(path), group_components)
    yield from converted.recordings
    yield from map(Skipped, converted.skipped)


def stream_to_recordings(stream, origin: str, group_components: bool = False) -> StreamRecordings:
    """``stream``'s traces as recordings (ids by ``waveform_id_for``), read from file ``origin``."""
    traces, skipped = [], []
    for trace in stream:
        for piece in trace.split() if np.ma.isMaskedArray(trace.data) else [trace]:
            if piece.stats.npts == 0:
                skipped.append(f"{piece.id} at {piece.stats.starttime}: no samples")
            elif piece.data.dtype.kind not in NUMERIC_KINDS:
                skipped.append(
                    f"{piece.id} at {piece.stats.starttime}: {piece.data.dtype} samples (text, not a waveform)"
                )
            else:
                traces.append(piece)
    groups = _aligned_groups(traces) if group_components else [[trace] for trace in traces]
    recordings = [_recording(group, origin) for group in groups]
    return StreamRecordings(tuple(with_ids(recordings)), tuple(skipped))


def _group_key(trace) -> tuple | None:
    """What the traces of one instrument's aligned components share (None: not groupable)."""
    s = trace.stats
    if len(s.channel) != 3:
        return None
    return (s.network, s.station, s.location, s.channel[:2], s.starttime.ns, s.sampling_rate, s.npts, trace.data.dtype)


def _component_rank(trace) -> tuple[int, str]:
    component = trace.stats.channel[2:]
    return (COMPONENT_ORDER.index(component) if component in COMPONENT_ORDER else len(COMPONENT_ORDER), component)


def _aligned_groups(traces: list) -> list[list]:
    """``traces`` as groups, in the order of each group's first trace: an instrument's aligned
    components (distinct channel codes) together, sorted Z, N, E, 1, 2, 3, others; every other
    trace alone."""
    by_key: dict[tuple, list] = {}
    groups: list[list] = []
    for trace in traces:
        key = _group_key(trace)
        if key is None:
            groups.append([trace])
        elif key in by_key:
            by_key[key].append(trace)
        else:
            by_key[key] = [trace]
            groups.append(by_key[key])
    out = []
    for group in groups:
        if len({t.stats.channel for t in group}) == len(group):
            out.append(sorted(group, key=_component_rank))
        else:  # a channel twice: nothing to say which belong together
            out.extend([t] for t in group)
    return out


def _calibration(traces: list) -> tuple[float, ...] | None:
    calibs = tuple(float(t.stats.calib) for t in traces)
    return calibs if all(math.isfinite(c) for c in calibs) else None


def _recording(traces: list, origin: str) -> Recording:
    """One recording of ``traces`` (one, or an instrument's aligned components); its id is set later."""
    first = traces[0].stats
    formats = sorted({str(t.stats.get("_format", "")) for t in traces} - {""})
    channel = first.channel if len(traces) == 1 else first.channel[:2] + "?"
    extension = Extension(
        channel_names=tuple(short_text(t.stats.channel) for t in traces),
        calibration=_calibration(traces),
        network=short_text(first.network),
        station=short_text(first.station),
        location=short_text(first.location),
        format=short_text(",".join(formats)) if formats else None,
    )
    columns = [native(t.data, origin) for t in traces]
    samples = columns[0][:, None] if len(columns) == 1 else np.column_stack(columns)
    source = f"{first.network}.{first.station}.{first.location}.{channel}"
    return Recording(
        np.ascontiguousarray(samples), "", source, first.starttime.ns, float(first.sampling_rate), extension, origin
    )


def _seed_codes(waveform: Waveform) -> list[tuple[str, str, str, str]]:
    """Each channel's (network, station, location, channel): the extension's codes; else, from a
    source that is a SEED id (three dots), its codes; else the source as the station, the network
    and location empty, the channel empty (one channel) or its number."""
    ext = waveform.extension
    parsed = waveform.source.split(".") if waveform.source.count(".") == 3 else None
    net = ext.network if ext.network is not None else (parsed[0] if parsed else "")
    sta = ext.station if ext.station is not None else (parsed[1] if parsed else waveform.source)
    loc = ext.location if ext.location is not None else (parsed[2] if parsed else "")
    if ext.channel_names:
        channels = list(ext.channel_names)
    elif waveform.channels == 1:
        channels = [parsed[3] if parsed else ""]
    else:
        channels = [str(i) for i in range(waveform.channels)]
    return [(net, sta, loc, cha) for cha in channels]


def to_stream(waveforms: Iterable[Waveform]) -> obspy.Stream:
    """The waveforms as one obspy ``Stream``: a trace per channel (codes by ``_seed_codes``),
    starting at ``start_ns``, ``calib`` the channel's calibration (1.0 without one), data a
    C-contiguous native-order copy of the channel in the stored dtype."""
    traces = []
    for waveform in waveforms:
        calibration = waveform.extension.calibration or (1.0,) * waveform.channels
        start = obspy.UTCDateTime(ns=waveform.start_ns)
        for i, (net, sta, loc, cha) in enumerate(_seed_codes(waveform)):
            column = waveform.samples[:, i]
            data = np.array(column, dtype=column.dtype.newbyteorder("="), order="C", copy=True)
            header = {
                "network": net,
                "station": sta,
                "location": loc,
                "channel": cha,
                "starttime": start,
                "sampling_rate": waveform.sample_rate,
                "calib": calibration[i],
            }
            traces.append(obspy.Trace(data=data, header=header))
    return obspy.Stream(traces)
