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

import numpy as np
from confluent_kafka import KafkaError, Message

from wavepipe.consumers.kafka_admin import new_producer, require_reachable
from wavepipe.contracts.config import Settings
from wavepipe.contracts.protocol import Extension, checksum, split_waveform

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProducedWaveform:
    """What a producer sent, for checking the output against it."""

    waveform_id: str
    source: str
    checksum: str
    size: int
    chunks: int


class DeliveryError(RuntimeError):
    pass


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
    start_time: datetime
    source: str


def demo_waveforms(count: int, *, seed: int, batch: str, target_bytes: int = 512 * 1024) -> Iterator[DemoWaveform]:
    """Realistic synthetic recordings: 3-component seismograms (float32, 100 Hz) with a P and an S
    arrival, 12-lead ECGs (int16, 500 Hz), and stereo audio (int16, 16 kHz) with a chirp.
    ``target_bytes`` sets the approximate size of each; ``batch`` makes the ids unique."""
    rng = np.random.default_rng(seed)
    t0 = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=int(rng.integers(0, 60 * 24 * 14)))
    kinds = ("seismic", "ecg", "audio")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        start = t0 + timedelta(seconds=37 * i)
        if kind == "seismic":
            n = max(64, target_bytes // (4 * 3))
            t = np.arange(n) / 100.0
            x = rng.normal(0, 0.05, size=(n, 3)).astype(np.float32)
            p_at, s_at = rng.uniform(0.1, 0.4) * t[-1], rng.uniform(0.5, 0.8) * t[-1]
            for at, amp, freq in ((p_at, 1.0, 6.0), (s_at, 2.5, 2.0)):
                env = np.where(t >= at, np.exp(-(t - at) / 3.0), 0.0)
                x += (amp * env * np.sin(2 * np.pi * freq * (t - at)))[:, None].astype(np.float32) * rng.uniform(
                    0.5, 1.0, 3
                ).astype(np.float32)
            yield DemoWaveform(x, f"{batch}-seismic-{i:05d}", 100.0, start, f"station-{i % 4:02d}")
        elif kind == "ecg":
            n = max(64, target_bytes // (2 * 12))
            t = np.arange(n) / 500.0
            beat = np.exp(-(((t % 0.8) - 0.2) ** 2) / 0.0005) * 1200 - np.exp(-(((t % 0.8) - 0.5) ** 2) / 0.004) * 150
            leads = beat[:, None] * rng.uniform(0.3, 1.0, 12) + rng.normal(0, 15, size=(n, 12))
            yield DemoWaveform(leads.astype(np.int16), f"{batch}-ecg-{i:05d}", 500.0, start, f"ward-{i % 3}")
        else:
            n = max(64, target_bytes // (2 * 2))
            t = np.arange(n) / 16000.0
            chirp = np.sin(2 * np.pi * (200 + 400 * t / max(t[-1], 1e-9)) * t)
            stereo = np.stack([chirp, np.roll(chirp, 40)], axis=1) * 12000 + rng.normal(0, 300, (n, 2))
            yield DemoWaveform(stereo.astype(np.int16), f"{batch}-audio-{i:05d}", 16000.0, start, f"mic-{i % 2}")


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
    sent = [
        producer.send(
            w.samples, waveform_id=w.waveform_id, sample_rate=w.sample_rate, start_time=w.start_time, source=w.source
        )
        for w in demo_waveforms(count, seed=seed, batch=batch, target_bytes=target_bytes)
    ]
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
    from wavepipe.recordings import Skipped
    from wavepipe.recordings.files import expand, recordings

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
            sent.append(
                producer.send(
                    item.samples,
                    waveform_id=item.waveform_id,
                    sample_rate=item.sample_rate,
                    start_time=item.start_ns,
                    source=item.source,
                    extension=item.extension,
                )
            )
            count += 1
        progress(done, len(found), str(path), count)
    producer.flush()
    return FilesProduced(len(found), sent, failed, skipped)


def manifest_lines(sent: list[ProducedWaveform]) -> list[dict]:
    return [asdict(s) for s in sent]
