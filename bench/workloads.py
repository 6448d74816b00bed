"""The two benchmark workloads and the producer that lays down their backlog."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import numpy as np

from wavepipe.contracts.config import Settings

log = logging.getLogger(__name__)
MiB = 1024 * 1024
KiB = 1024
_POOL_SAMPLES = 16 * MiB  # 64 MiB of float32 signal that waveforms are cut from


@dataclass(frozen=True)
class Workload:
    name: str
    waveform_bytes: int
    chunk_bytes: int
    total_bytes: int

    @property
    def waveforms(self) -> int:
        return max(1, self.total_bytes // self.waveform_bytes)

    @property
    def chunks_per_waveform(self) -> int:
        return math.ceil(self.waveform_bytes / self.chunk_bytes)

    @property
    def chunks(self) -> int:
        return self.waveforms * self.chunks_per_waveform

    @property
    def payload_bytes(self) -> int:
        return self.waveforms * self.waveform_bytes

    def scaled(self, factor: int) -> Workload:
        return replace(self, total_bytes=self.total_bytes * factor)

    def describe(self) -> str:
        return (
            f"{self.name}: {self.waveforms} waveforms of {_size(self.waveform_bytes)} in "
            f"{_size(self.chunk_bytes)} chunks ({self.chunks} chunks, {self.payload_bytes / MiB:.0f} MiB)"
        )


def default_workloads(large_bytes: int, small_bytes: int) -> list[Workload]:
    """large: 1 MiB waveforms in 64 KiB chunks; small: 16 KiB waveforms in 4 KiB chunks."""
    return [Workload("large", 1 * MiB, 64 * KiB, large_bytes), Workload("small", 16 * KiB, 4 * KiB, small_bytes)]


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // KiB} KiB"


class SignalPool:
    """Waveforms cut at varying offsets from one pool of noisy multi-tone float32 signal, each
    with its own gain and offset, so generating gigabytes costs a slice and one multiply-add, not a
    random draw per sample. The gain and offset change every byte: no two waveforms share content
    that a compressor could find (their bytes compress like real noisy recordings, barely)."""

    def __init__(self, seed: int = 7):
        rng = np.random.default_rng(seed)
        t = np.arange(_POOL_SAMPLES, dtype=np.float32) / 1000.0
        signal = np.sin(2 * np.pi * 1.3 * t) + 0.4 * np.sin(2 * np.pi * 17.0 * t)
        self.samples = (signal + rng.normal(0, 0.3, _POOL_SAMPLES)).astype(np.float32)

    def waveform(self, index: int, nbytes: int) -> np.ndarray:
        n = nbytes // 4
        start = (index * 7919) % (len(self.samples) - n)
        gain = np.float32(1.0 + (index % 9973) * 1e-5)
        return self.samples[start : start + n] * gain + np.float32(index * 1e-3)


def produce_backlog(
    settings: Settings, topic: str, workload: Workload, *, first_index: int, count: int, pool: SignalPool
) -> dict[str, str]:
    """Produce ``count`` waveforms of ``workload`` (ids from ``first_index``); return id -> sha256.

    Keyed and batched like a real wavepipe producer, so one waveform's chunks travel together.
    """
    from wavepipe.consumers.producer import ChunkProducer

    producer = ChunkProducer(settings, topic, **{"queue.buffering.max.kbytes": 256 * 1024})
    manifest: dict[str, str] = {}
    base = datetime(2026, 1, 1, tzinfo=UTC)
    began = last = time.monotonic()
    for i in range(first_index, first_index + count):
        sent = producer.send(
            pool.waveform(i, workload.waveform_bytes),
            waveform_id=f"{workload.name}-{i:09d}",
            sample_rate=1000.0,
            start_time=base + timedelta(seconds=i),
            source=f"bench-{workload.name}",
            chunk_size=workload.chunk_bytes,
        )
        manifest[sent.waveform_id] = sent.checksum
        now = time.monotonic()
        if now - last >= 5:
            last = now
            done = i - first_index + 1
            log.info(
                "  producing %s: %d/%d waveforms, %.0f MB/s",
                workload.name,
                done,
                count,
                done * workload.waveform_bytes / 1e6 / (now - began),
            )
    producer.flush()
    seconds = time.monotonic() - began
    log.info(
        "  produced %d %s waveforms (%.0f MiB) in %.1fs, %.0f MB/s",
        count,
        workload.name,
        count * workload.waveform_bytes / MiB,
        seconds,
        count * workload.waveform_bytes / 1e6 / max(seconds, 1e-9),
    )
    return manifest
