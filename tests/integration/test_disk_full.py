"""A disk that fills under a run: a small filesystem (tmpfs) mounted where the run stages its
records or where its tables are, filled but for a little room. The run fails with nothing
committed, and once space is freed the next run resumes the same run and publishes each waveform
once (read back with Spark and with delta-rs)."""

from __future__ import annotations

import re
import subprocess

import pytest
from confluent_kafka.admin import OffsetSpec

from tests.helpers import assert_delta_rs_reads_as_spark, output_rows, run_cli
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic, list_offsets
from wavepipe.consumers.producer import produce_demo

#: The small filesystem, and the room a filler file leaves on it (less than one partition's records).
SIZE, ROOM = 8 * 1024 * 1024, 256 * 1024


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of ``SIZE`` bytes at ``tmp_path/small``, all but ``ROOM`` taken by ``filler``;
    unmounted afterwards. Mounting needs root (CI's machine, as this one, runs the suite as root)."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(where)], check=False, capture_output=True
    )
    assert mounted.returncode == 0, f"mount a tmpfs (the suite runs as root): {mounted.stderr.decode()}"
    filler = where / "filler"
    filler.write_bytes(b"\0" * (SIZE - ROOM))
    try:
        yield where, filler
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize(("setting", "step"), [("staging_uri", "consume"), ("tables_uri", "publish")])
def test_a_full_disk_commits_nothing_and_the_run_resumes_once_space_is_freed(
    settings, spark, small_disk, setting, step
):
    where, filler = small_disk
    full = settings.replace(**{setting: str(where / "lake")})
    ensure_topic(full, partitions=2)
    sent = produce_demo(full, count=6, target_bytes=400 * 1024)

    code, out = run_cli(full, "run")
    # one line: the location, its free space (and what the engine's step writes), the setting that moves it
    (line,) = [said for said in out.splitlines() if "wavepipe run failed" in said or "Traceback" in said] or [out]
    assert code == 1 and line.startswith("wavepipe run failed: "), out
    assert f"no space left on the disk of {where / 'lake'} (" in line and " free of 8.0 MiB" in line, line
    assert f"give {setting} a location with room, then run again" in line, line
    assert ("this step writes about" in line) == (step == "publish"), line
    (failed,) = re.findall(r"run (\S+): planned", out)
    assert committed_offsets(full, full.group, full.topic, [0, 1]) == {0: None, 1: None}, out

    filler.unlink()  # space freed on the same filesystem
    code, out = run_cli(full, "run")
    assert code == 0 and f"resuming unfinished run {failed}" in out, out
    assert f"run {failed}: 6 new waveforms" in out, out
    rows = output_rows(spark, full)  # each produced waveform once, bit-exact, from the resumed run
    assert {wid: checksum for wid, checksum, _, _ in rows} == {w.waveform_id: w.checksum for w in sent}
    assert len(rows) == len(sent) and all(checksum == sha and run_id == failed for _, checksum, sha, run_id in rows)
    assert assert_delta_rs_reads_as_spark(spark, full.output_table) == 6
    ends = list_offsets(full, full.topic, [0, 1], OffsetSpec.latest())
    assert committed_offsets(full, full.group, full.topic, [0, 1]) == ends
