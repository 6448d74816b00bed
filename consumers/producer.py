"""The chunking producer: waveforms in, protocol-v1 chunk records out.

Delivery is idempotent (``enable.idempotence``, ``acks=all``), batched (``linger.ms``,
``batch.size``) and keyed by waveform id with the ``murmur2_random`` partitioner, so a waveform's
chunks land in the partition a Java client would choose, together and in order. ``flush`` raises
if any record failed: nothing is dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import TYPE_CHECKING

import numpy as np
from confluent_kafka import KafkaError, Message

from wavepipe.consumers.kafka_admin import new_producer, require_reachable
from wavepipe.contracts.config import Settings
from wavepipe.contracts.errors import UnavailableError
from wavepipe.contracts.protocol import Extension, checksum, epoch_ns, split_waveform
from wavepipe.recordings import Skipped
from wavepipe.recordings.files import expand, recordings

if TYPE_CHECKING:
    from wavepipe.recordings import Recording

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProducedWaveform:
    """What a producer sent, for checking the output against it."""

    waveform_id: str
    source: str
    checksum: str
    size: int
    chunks: int


class DeliveryError(UnavailableError):
    """Records the brokers did not acknowledge; sending them again is safe (ids are content hashes)."""


class ChunkProducer:
    def __init__(self, settings: Settings, topic: str | None = None, **extra_config):
        self.settings = settings
        self.topic = topic or settings.topic
        self._errors: list[str] = []
        self.delivered = 0
        require_reachable(settings)
        self._producer = new_producer(
            settings.kafka_config(
                **{
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": settings.linger_ms,
                    "batch.size": settings.batch_size,
                    "partitioner": "murmur2_random",
                    "compression.type": "none",  # waveform samples barely compress; keep CPU for throughput
                    "message.max.bytes": max(2 * settings.chunk_size, 1_000_000),
                    **extra_config,
                }
            )
        )

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")
        else:
            self.delivered += 1

    def send(
        self,
        samples: np.ndarray,
        *,
        waveform_id: str,
        sample_rate: float,
        start_time: datetime | int,
        source: str,
        chunk_size: int | None = None,
        extension: Extension | None = None,
    ) -> ProducedWaveform:
        """Queue one waveform's chunks; call ``flush`` to wait for delivery. ``start_time``:
        aware, or UTC epoch nanoseconds; ``extension``: what the recording's file says of it."""
        records = split_waveform(
            samples,
            waveform_id=waveform_id,
            sample_rate=sample_rate,
            start_time=start_time,
            source=source,
            chunk_size=chunk_size or self.settings.chunk_size,
            extension=extension,
        )
        for key, headers, value in records:
            while True:
                try:
                    self._producer.produce(
                        self.topic, value=value, key=key, headers=headers, on_delivery=self._on_delivery
                    )
                    break
                except BufferError:  # local queue full: let deliveries drain, then retry
                    self._producer.poll(0.5)
            self._producer.poll(0)
        data = np.ascontiguousarray(np.asarray(samples)).tobytes()
        return ProducedWaveform(waveform_id, source, checksum(data), len(data), len(records))

    def send_waveform(self, waveform: DemoWaveform | Recording) -> ProducedWaveform:
        """``send`` of a waveform that carries its facts: a ``DemoWaveform`` or a recording read
        from a file (samples, id, rate, ``start_ns``, source and extension)."""
        return self.send(waveform.samples, **facts_of(waveform))

    def flush(self, timeout: float = 120.0) -> None:
        remaining = self._producer.flush(timeout)
        if remaining:
            raise DeliveryError(f"{remaining} records still undelivered after {timeout:.0f}s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise DeliveryError(f"{len(errors)} records failed delivery, first: {errors[0]}")


# --- demo source ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoWaveform:
    samples: np.ndarray
    waveform_id: str
    sample_rate: float
    start_ns: int  # UTC epoch nanoseconds of the first sample
    source: str
    extension: Extension | None = None


DEMO_KINDS = ("seismic", "ecg", "audio")
ECG_LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
#: The faults the demo puts in its recordings, each one a quality rule's (docs/quality.md): by
#: kind and the recording's number among its kind's.
DEMO_FAULTS = {
    ("ecg", 0): "dead_channel",  # lead V1 flat
    ("audio", 1): "clipped",  # the left channel saturated
    ("seismic", 5): "gap",  # station-01's second record starts 40 s after its first ends
    ("seismic", 3): "late",  # station-03 sent its records hours after they ended
    ("seismic", 7): "late",
}


def demo_faults(count: int) -> set[str]:
    """The quality rules the first ``count`` demo recordings break (``DEMO_FAULTS``)."""
    return {rule for (kind, k), rule in DEMO_FAULTS.items() if 3 * k + DEMO_KINDS.index(kind) < count}


def demo_waveforms(
    count: int, *, seed: int, batch: str, target_bytes: int = 512 * 1024, faults: bool = True
) -> Iterator[DemoWaveform]:
    """Realistic synthetic recordings: 3-component seismograms (float32, 100 Hz; ``station-NN``)
    with a P and an S arrival, 12-lead ECGs (int16, 500 Hz; ``ward-N``), and stereo audio (int16,
    16 kHz; ``mic-N``) with a chirp, with their channel names and units. Each source's records
    follow one another without a gap, the last ending a minute ago. ``faults``: some carry the
    faults of ``DEMO_FAULTS``. ``target_bytes`` sets the approximate size of each; ``batch``
    makes the ids unique."""
    rng = np.random.default_rng(seed)
    made = [_demo_recording(i, rng, batch, target_bytes, faults) for i in range(count)]
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    span: dict[str, float] = {}  # seconds of each source's records (and its gaps) before ``end``
    for w, (_, _, gap_before, _) in made:
        span[w.source] = span.get(w.source, 0.0) + gap_before + len(w.samples) / w.sample_rate
    at = {source: end - timedelta(seconds=seconds) for source, seconds in span.items()}
    for w, (_, _, gap_before, late) in made:
        start = at[w.source] + timedelta(seconds=gap_before)
        at[w.source] = start + timedelta(seconds=len(w.samples) / w.sample_rate)
        yield DemoWaveform(w.samples, w.waveform_id, w.sample_rate, epoch_ns(start - late), w.source, w.extension)


def _demo_recording(i: int, rng, batch: str, target_bytes: int, faults: bool) -> tuple[DemoWaveform, tuple]:
    """Recording ``i`` of the demo (no start yet) and (kind, number, seconds of gap before it,
    how much earlier its source recorded it)."""
    kind = DEMO_KINDS[i % 3]
    k = i // 3
    fault = DEMO_FAULTS.get((kind, k)) if faults else None
    maker = {"seismic": _demo_seismic, "ecg": _demo_ecg, "audio": _demo_audio}[kind]
    samples, rate, source, extension = maker(k, rng, target_bytes, fault)
    gap = 40.0 if fault == "gap" else 0.0
    late = timedelta(hours=3) if source == "station-03" and faults else timedelta(0)
    return DemoWaveform(samples, f"{batch}-{kind}-{i:05d}", rate, 0, source, extension), (kind, k, gap, late)


def _demo_seismic(k: int, rng, target_bytes: int, fault: str | None):
    n = max(64, target_bytes // (4 * 3))
    t = np.arange(n) / 100.0
    x = rng.normal(0, 0.05, size=(n, 3)).astype(np.float32)
    p_at, s_at = rng.uniform(0.1, 0.4) * t[-1], rng.uniform(0.5, 0.8) * t[-1]
    for at, amp, freq in ((p_at, 1.0, 6.0), (s_at, 2.5, 2.0)):
        env = np.where(t >= at, np.exp(-(t - at) / 3.0), 0.0)
        x += (amp * env * np.sin(2 * np.pi * freq * (t - at)))[:, None].astype(np.float32) * rng.uniform(
            0.5, 1.0, 3
        ).astype(np.float32)
    ext = Extension(channel_names=("HHZ", "HHN", "HHE"), units=("um/s",) * 3, network="XX", station=f"S{k % 4:02d}")
    return x, 100.0, f"station-{k % 4:02d}", ext


def _demo_ecg(k: int, rng, target_bytes: int, fault: str | None):
    n = max(64, target_bytes // (2 * 12))
    t = np.arange(n) / 500.0
    beat = np.exp(-(((t % 0.8) - 0.2) ** 2) / 0.0005) * 1200 - np.exp(-(((t % 0.8) - 0.5) ** 2) / 0.004) * 150
    leads = (beat[:, None] * rng.uniform(0.3, 1.0, 12) + rng.normal(0, 15, size=(n, 12))).astype(np.int16)
    if fault == "dead_channel":
        leads[:, ECG_LEADS.index("V1")] = 212  # the lead's electrode came off: a flat line at its offset
    ext = Extension(channel_names=ECG_LEADS, units=("mV",) * 12, calibration=(0.001,) * 12)
    return leads, 500.0, f"ward-{k % 3}", ext


def _demo_audio(k: int, rng, target_bytes: int, fault: str | None):
    n = max(64, target_bytes // (2 * 2))
    t = np.arange(n) / 16000.0
    chirp = np.sin(2 * np.pi * (200 + 400 * t / max(t[-1], 1e-9)) * t)
    stereo = np.stack([chirp, np.roll(chirp, 40)], axis=1) * 12000 + rng.normal(0, 300, (n, 2))
    if fault == "clipped":  # the left input overdriven: its peaks flat at the converter's range
        stereo[:, 0] *= 3.0
    stereo = np.clip(stereo, -32768, 32767).astype(np.int16)
    return stereo, 16000.0, f"mic-{k % 2}", Extension(channel_names=("left", "right"))


def produce_demo(
    settings: Settings,
    *,
    count: int = 24,
    batch: str | None = None,
    target_bytes: int = 512 * 1024,
    seed: int | None = None,
) -> list[ProducedWaveform]:
    """Produce ``count`` demo waveforms to the configured topic and wait for delivery."""
    batch = batch or "demo-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    seed = seed if seed is not None else abs(hash(batch)) % (2**32)
    producer = ChunkProducer(settings)
    sent = [producer.send_waveform(w) for w in demo_waveforms(count, seed=seed, batch=batch, target_bytes=target_bytes)]
    producer.flush()
    return sent


# --- recordings in files ---------------------------------------------------------------------


@dataclass
class FilesProduced:
    """What ``produce_files`` did: the waveforms sent, and each file it could not read (path,
    one-line reason), which it left out and went on."""

    files: int
    sent: list[ProducedWaveform]
    failed: list[tuple[str, str]]
    #: parts of files that are no waveform (a trace without samples, a log channel): path, what
    skipped: list[tuple[str, str]] = field(default_factory=list)


def produce_files(
    settings: Settings,
    paths: list[str],
    *,
    group_components: bool = False,
    start_ns: int | None = None,
    progress: Callable[[int, int, str, int], None] = lambda done, files, path, waveforms: None,
) -> FilesProduced:
    """Produce every recording in ``paths`` (files, folders, globs; ``wavepipe.recordings``:
    what obspy reads, WAV/FLAC, WFDB records) and wait for delivery. Each waveform's id comes
    from its identity (source, start, length), so a file sent again is a re-delivery and a
    changed file a visible id conflict. ``progress(done, files, path, waveforms)`` after each
    file. A file that cannot be read is listed in ``failed`` and the others are still sent; a
    part of a file that is no waveform is listed in ``skipped``."""
    found = expand(paths)
    producer = ChunkProducer(settings)
    sent: list[ProducedWaveform] = []
    failed: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    for done, (path, items) in enumerate(
        groupby(recordings(found, group_components=group_components, start_ns=start_ns), key=lambda pair: pair[0]), 1
    ):
        count = 0
        for _, item in items:
            if isinstance(item, Exception):
                failed.append((str(path), f"{type(item).__name__}: {str(item).splitlines()[0] if str(item) else ''}"))
                continue
            if isinstance(item, Skipped):
                skipped.append((str(path), item.reason))
                continue
            sent.append(producer.send_waveform(item))
            count += 1
        progress(done, len(found), str(path), count)
    producer.flush()
    return FilesProduced(len(found), sent, failed, skipped)


def manifest_lines(sent: list[ProducedWaveform]) -> list[dict]:
    return [asdict(s) for s in sent]


def facts_of(waveform: DemoWaveform | Recording) -> dict:
    """What ``split_waveform`` (and ``ChunkProducer.send``) take of a waveform besides its samples."""
    return {
        "waveform_id": waveform.waveform_id,
        "sample_rate": waveform.sample_rate,
        "start_time": waveform.start_ns,
        "source": waveform.source,
        "extension": waveform.extension,
    }
