"""The object store wavepipe's state and tables can live on: a real SeaweedFS on loopback (built
with Go the first time), its conditional writes, and Delta commits on it from Spark and delta-rs
at once (Spark through S3A and wavepipe's LogStore, delta-rs with conditional puts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from wavepipe import storage
from wavepipe.contracts.config import load_settings
from wavepipe.local.kafka import free_port
from wavepipe.local.objectstore import LocalObjectStore
from wavepipe.spark_launch import settings_env, without_connect_mode
from wavepipe.storage import S3Options, delta_storage_options, open_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """This module's own object store on a free port, stopped at the end."""
    settings = load_settings()
    local = LocalObjectStore(tmp_path_factory.mktemp("objectstore"), free_port(), settings.tools_dir)
    local.up()
    yield local
    local.down()


@pytest.fixture
def options(store) -> S3Options:
    return S3Options(**store.client_options())


def _prefix(name: str) -> str:
    return f"s3://{LocalObjectStore.bucket}/{name}-{time.time_ns()}"


def _race_to_create(bucket, key: str, writers: int = 6) -> dict[int, bool]:
    """``writers`` threads creating ``key`` at the same instant: which of them succeeded."""
    results: dict[int, bool] = {}
    barrier = threading.Barrier(writers)

    def create(i: int) -> None:
        barrier.wait()
        results[i] = bucket.put_if(key, f"writer {i}".encode()) is not None

    threads = [threading.Thread(target=create, args=(i,)) for i in range(writers)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results


def test_of_writers_racing_to_create_one_object_exactly_one_wins(options):
    bucket = open_store(_prefix("race"), options)
    for key in ("a", "b", "c"):
        results = _race_to_create(bucket, key)
        winners = [i for i, won in results.items() if won]
        assert len(winners) == 1, results
        assert bucket.get_bytes(key) == f"writer {winners[0]}".encode()  # the loser overwrote nothing


def test_a_replace_of_a_version_someone_replaced_since_is_refused(options):
    bucket = open_store(_prefix("cas"), options)
    seen = bucket.put_if("claim", b"run 1")
    assert seen is not None and seen == bucket.head("claim")["e_tag"]
    assert bucket.put_if("claim", b"run 2", seen) is not None
    assert bucket.put_if("claim", b"run 3", seen) is None  # run 3 read the version run 2 replaced
    assert bucket.get_tagged("claim")[0] == b"run 2"
    assert bucket.put_if("absent", b"x", seen) is None
    assert bucket.head("absent") is None


def _state_on_store(options: S3Options, tmp_path, name: str, **changes):
    """Settings of a worker with its own ``home`` and the run state in a prefix of the bucket."""
    return load_settings(home=tmp_path / name, **_on_store(options, ""), **changes)


def test_of_workers_racing_to_claim_one_group_in_the_bucket_exactly_one_wins(options, tmp_path):
    """Six workers (homes apart, the state in one prefix) claim one group at the same instant:
    one claim is made, the five others are refused naming the run that holds the group; their
    failure lines, added at once, are all kept. A state in a bucket that does not exist fails in
    a line that names it."""
    from wavepipe.contracts.plan import ActiveRunError
    from wavepipe.run_store import RunStore

    state = _prefix("state")
    stores = [RunStore(_state_on_store(options, tmp_path, f"w{i}", state_uri=state)) for i in range(6)]
    barrier, outcomes = threading.Barrier(len(stores)), {}

    def claim(i: int) -> None:
        barrier.wait()
        try:
            stores[i].claim_group("g", f"run-{i}")
            outcomes[i] = "claimed"
        except ActiveRunError as exc:
            outcomes[i] = str(exc)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(stores))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    [winner] = [i for i, said in outcomes.items() if said == "claimed"]
    assert stores[3].active_run("g") == f"run-{winner}"
    assert all(f"run-{winner} of group 'g'" in said for i, said in outcomes.items() if i != winner), outcomes
    for i in range(len(stores)):  # each failure is kept: no line lost to a concurrent append
        stores[i].record_failure("g", f"run-{i}", "plan", "lost the claim")
    assert sorted(f["run_id"] for f in stores[0].failures("g")) == [f"run-{i}" for i in range(len(stores))]
    typo = f"s3://no-such-bucket-{time.time_ns()}/state"
    nowhere = RunStore(_state_on_store(options, tmp_path, "typo", state_uri=typo))
    with pytest.raises(storage.StorageUnavailableError, match=rf"failed on {typo} \(.*the bucket exists"):
        nowhere.reports()  # (SeaweedFS makes a bucket on a first PUT, where AWS answers NoSuchBucket)


def test_the_run_state_in_the_bucket_keeps_the_newest_runs_and_any_that_still_holds_its_group(options, tmp_path):
    from tests.helpers import assert_prune_keeps_the_newest_runs_and_the_one_holding_its_group
    from wavepipe.run_store import RunStore

    store = RunStore(_state_on_store(options, tmp_path, "w", state_uri=_prefix("state")))
    assert_prune_keeps_the_newest_runs_and_the_one_holding_its_group(store)


def test_a_step_lease_in_the_bucket_is_renewed_while_held_and_taken_over_only_once_its_holder_is_gone(
    options, tmp_path
):
    """A step lock on an object store is a lease (3 s here): held past its term it is renewed, so
    another worker is refused, naming the holder; a lease whose holder on another host stopped
    renewing is taken over once it ran out; one whose holder on this host was killed, at once."""
    from tests.helpers import start_python
    from wavepipe.run_store import RunStore

    state = _prefix("state")
    one, other = (RunStore(_state_on_store(options, tmp_path, n, state_uri=state, state_lease_s=3)) for n in "ab")

    def contend(settings, wait_s: float = 0, hold_s: float = 0) -> subprocess.Popen:
        """Another process taking step 'run' of run r: it says ``held`` or why it could not."""
        code = (
            "import time; from wavepipe.run_store import RunStore; from wavepipe.contracts.config import "
            f"load_settings\ntry:\n  with RunStore(load_settings()).lock('runs/r/.run.lock', 'run r', {wait_s}):\n"
            f"    print('held', flush=True); time.sleep({hold_s})\nexcept Exception as exc: print(exc, flush=True)"
        )
        return start_python(settings, code, None, stdout=subprocess.PIPE, text=True)

    with one.step_lock("r", "run"):
        time.sleep(4.5)  # past its first term: renewed by then
        said = contend(other.settings).communicate(timeout=60)[0]
        assert re.search(r"pid \d+ on .* lease good for", said), said
    assert contend(other.settings).communicate(timeout=60)[0].strip() == "held", "let go: free at once"

    lease = {"owner": "x", "host": "another-host", "pid": 1, "expires_at": time.time() + 4}
    open_store(state, options).put_bytes("runs/r/.run.lock", json.dumps(lease).encode())
    assert "another-host" in contend(other.settings).communicate(timeout=60)[0]
    began = time.monotonic()
    with other.lock("runs/r/.run.lock", "run r", wait_s=15):
        assert 1 < time.monotonic() - began < 8, "taken over once its term ran out"

    holder = contend(one.settings, hold_s=600)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    began = time.monotonic()
    with other.step_lock("r", "run"):  # its holder was a process of this host, and is gone
        assert time.monotonic() - began < 2


def test_the_store_killed_and_started_again_keeps_its_objects_and_credentials(store, options):
    bucket = open_store(_prefix("restart"), options)
    bucket.put_bytes("kept", b"before the crash")
    pid = store.kill()
    assert pid and store.pid() is None and store.status() == "object store is not running"
    assert "started" in store.up()
    assert open_store(bucket.uri, S3Options(**store.client_options())).get_bytes("kept") == b"before the crash"
    # a new bucket needs new volumes: the restarted store grows them (SeaweedFS freezes growth when
    # it takes a restart for lost master state, and would then hang every write that needs one)
    another = open_store(f"s3://after-restart-{time.time_ns()}", options)
    another.put_bytes("new", b"after the crash")
    assert another.get_bytes("new") == b"after the crash"
    assert "already running" in store.up()  # idempotent


def test_wrong_credentials_are_refused(store, options):
    wrong = S3Options(options.endpoint, options.region, options.access_key, "not-the-secret")
    with pytest.raises(Exception, match=r"(?i)signature|forbidden|denied|403"):
        open_store(_prefix("auth"), wrong).put_bytes("x", b"x")


def _driver_env(home, options: S3Options, tables_uri: str) -> dict[str, str]:
    """The environment of a Spark driver of the test's own (classic pyspark, local mode) whose
    settings put the tables at ``tables_uri`` on the store."""
    settings = load_settings(home=home, spark_master="local[1]", **_on_store(options, tables_uri))
    return {**without_connect_mode(os.environ), **settings_env(settings)}


#: Run by a Spark driver of its own (classic pyspark, local mode) with the test's settings: Spark
#: appends to the table while the test's delta-rs appends to it too, then says what it read.
SPARK_WRITER = textwrap.dedent(
    """
    import json, sys
    from wavepipe.contracts.config import load_settings
    from wavepipe.spark_launch import local_session
    from wavepipe.storage import for_spark
    uri, count = for_spark(sys.argv[1]), int(sys.argv[2])
    spark = local_session(load_settings(), "object-store-test")
    for i in range(count):
        spark.createDataFrame([(1, i)], "writer long, i long").write.format("delta").mode("append").save(uri)
    print(json.dumps({"rows": spark.read.format("delta").load(uri).count()}))
    """
)


def test_spark_and_delta_rs_committing_to_one_table_on_s3_at_once_lose_no_commit(store, options, tmp_path):
    """Each append is a new log entry written with ``If-None-Match``: a writer that loses a version
    to the other reads the log again and commits the next one, so every append is in the table."""
    uri, count = _prefix("tables") + "/shared", 8
    so = delta_storage_options(options)
    write_deltalake(
        uri, pa.table({"writer": pa.array([0], pa.int64()), "i": pa.array([0], pa.int64())}), storage_options=so
    )
    env = _driver_env(tmp_path / "home", options, _prefix("tables"))
    spark = subprocess.Popen(
        [sys.executable, "-c", SPARK_WRITER, uri, str(count)], env=env, stdout=subprocess.PIPE, text=True
    )
    for i in range(count):
        write_deltalake(
            uri,
            pa.table({"writer": pa.array([2], pa.int64()), "i": pa.array([i], pa.int64())}),
            mode="append",
            storage_options=so,
        )
    out, _ = spark.communicate(timeout=600)
    assert spark.returncode == 0, out
    table = DeltaTable(uri, storage_options=so)
    writers = table.to_pyarrow_table().column("writer").to_pylist()
    assert (writers.count(1), writers.count(2), len(writers)) == (count, count, 1 + 2 * count)
    assert table.version() == 2 * count  # one version per append, none overwritten
    assert json.loads(out.strip().splitlines()[-1])["rows"] >= 1 + count  # Spark read its own appends at least


#: Run by a Spark driver of its own: S3A's streams to one object that another writer makes between
#: the stream's open and its close (the whole object is PUT at close), and a log entry written by
#: wavepipe's LogStore where one exists. Prints what each outcome was.
S3A_RACE = textwrap.dedent(
    """
    import json, sys
    from wavepipe.contracts.config import load_settings
    from wavepipe.spark_launch import local_session
    from wavepipe.storage import LOGSTORE_CLASS, for_spark, open_store, s3_options
    settings = load_settings()
    uri, other = sys.argv[1], open_store(sys.argv[1], s3_options(settings))
    spark = local_session(settings, "object-store-race")
    jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()
    said = {}
    def race(name, open_stream):
        path = jvm.org.apache.hadoop.fs.Path(for_spark(uri) + "/" + name)
        out = open_stream(path.getFileSystem(conf), path)
        out.write(bytearray(b"spark's"))
        other.put_bytes(name, b"the other writer's")
        try:
            out.close()
            said[name] = "closed"
        except Exception as exc:
            said[name] = "refused"
        said[name + " holds"] = other.get_bytes(name).decode()
    race("plain", lambda fs, p: fs.create(p, False))
    race("conditional", lambda fs, p: fs.createFile(p).overwrite(False).must("fs.option.create.conditional.overwrite", True).build())
    other.put_bytes("_delta_log/00000000000000000003.json", b"{}\\n")
    store = getattr(jvm.io.wavepipe.delta, LOGSTORE_CLASS.rsplit(".", 1)[1])(conf)
    entry = jvm.org.apache.hadoop.fs.Path(for_spark(uri) + "/_delta_log/00000000000000000003.json")
    actions = jvm.java.util.ArrayList()
    actions.add("spark's entry")
    try:
        store.write(entry, actions.iterator(), False, conf)
        said["log entry"] = "written"
    except Exception as exc:
        said["log entry"] = "refused: " + exc.java_exception.getClass().getName()
    said["log entry holds"] = other.get_bytes("_delta_log/00000000000000000003.json").decode()
    print(json.dumps(said))
    """
)


def test_a_plain_s3a_create_overwrites_a_racing_writer_and_the_logstores_conditional_one_does_not(options, tmp_path):
    """Why wavepipe's LogStore exists: S3A checks for an object when a stream opens and PUTs it
    when the stream closes, so a plain create overwrites what another writer made in between (as
    Delta's own S3 LogStore does with a log entry); a conditional create is refused instead."""
    uri = _prefix("s3a-race")
    env = _driver_env(tmp_path / "home", options, uri)
    cmd = [sys.executable, "-c", S3A_RACE, uri]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert (said["plain"], said["plain holds"]) == ("closed", "spark's")  # the other writer's object is gone
    assert (said["conditional"], said["conditional holds"]) == ("refused", "the other writer's")
    assert said["log entry"].startswith("refused") and "FileAlreadyExists" in said["log entry"], json.dumps(said)
    assert said["log entry holds"] == "{}\n"


@pytest.fixture(scope="module")
def s3_engine(store, tmp_path_factory):
    """A warm Spark engine of this module's own whose S3A reaches the store (its jars, settings
    and wavepipe's LogStore come with a location on S3); the runs below attach to it."""
    from tests.helpers import local_engine

    options = S3Options(**store.client_options())
    server = local_engine(tmp_path_factory.mktemp("s3-engine"), **_on_store(options, _prefix("engine")))
    server.up()
    yield server
    server.down(force=True)


@pytest.fixture(scope="module")
def s3_spark(s3_engine):
    """A session on the module's engine for reading the tables back; closing it leaves the
    engine's shared session (the runs' too) open."""
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(s3_engine.url()).create()
    session.release_session_on_close = False
    yield session
    session.stop()


def _on_store(options: S3Options, tables_uri: str, staging_uri: str = "") -> dict:
    """Settings that put the tables at ``tables_uri`` (and the runs' staging at ``staging_uri``,
    when given; both may be empty) on the store ``options`` reach."""
    return {
        "tables_uri": tables_uri,
        "staging_uri": staging_uri,
        "s3_endpoint": options.endpoint,
        "s3_region": options.region,
        "s3_access_key": options.access_key,
        "s3_secret_key": options.secret_key,
    }


def test_a_bounded_run_stages_and_publishes_in_the_bucket_that_delta_rs_reads_there(
    kafka, s3_engine, s3_spark, options, tmp_path
):
    """The readers put their staged files in the bucket; the engine reads them there (s3a, and
    its Python workers with pyarrow), writes the run's files into the table's folder and the
    run's process commits them (delta-rs, a conditional put). No Parquet file is ever on the
    local disk, and the run's staging is removed from the bucket once it committed."""
    from tests.helpers import assert_delta_rs_reads_as_spark, make_settings, output_rows
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.consumers.reader import read_range
    from wavepipe.pipeline import plan_step, run_once

    staging = _prefix("staging")
    settings = make_settings(tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), staging))
    ensure_topic(settings)
    sent = produce_demo(settings, count=6, target_bytes=16 * 1024)
    plan = plan_step(settings, "on-s3")
    for r in plan.ranges:
        read_range(settings, "on-s3", r.partition)
    staged = open_store(staging, options).list_keys("on-s3")
    expected = {f"on-s3/{kind}/{r.name}.parquet" for r in plan.ranges for kind in ("chunks", "dead_letter", "digests")}
    assert set(staged) == expected, staged
    report = run_once(settings, run_id="on-s3")
    assert report["waveforms"] == {"output_new": 6}, report["waveforms"]
    assert open_store(staging, options).list_keys() == [], "a committed run's staging is removed"
    assert not list((tmp_path / "home").rglob("*.parquet")), "nothing staged or published on local disk"
    assert assert_delta_rs_reads_as_spark(s3_spark, settings.output_table) == 6
    rows = output_rows(s3_spark, settings)
    assert {r[0]: r[1] for r in rows} == {w.waveform_id: w.checksum for w in sent}
    assert all(r[1] == r[2] for r in rows), "payloads must be bit-exact"
    ends = {int(p): v["end"] for p, v in report["partitions"].items()}
    assert committed_offsets(settings, settings.group, settings.topic, sorted(ends)) == ends
    bucket = open_store(settings.tables_location, options)
    assert any(k.startswith("waveforms/_delta_log/") for k in bucket.list_keys("waveforms"))


def test_a_rewind_and_a_window_run_on_the_bucket_keep_each_waveform_once(kafka, s3_engine, s3_spark, options, tmp_path):
    """Exactly once with the tables and the staging on S3: a rewind re-reads every offset and publishes nothing
    again (the group's transaction is in the bucket's log); a window run replaces the window's
    rows in one commit (Spark's, through wavepipe's LogStore), the same bytes, once each; a run's
    compaction of its small files (delta-rs's commit in the bucket) loses and doubles none."""
    from datetime import timedelta

    from tests.helpers import (
        assert_delta_rs_reads_as_spark,
        make_settings,
        produce_in_order,
        quarter_hour_ago,
        rows_by_id,
        run_cli,
        waveform_records,
    )
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.pipeline import run_once

    settings = make_settings(
        tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), _prefix("staging"))
    )
    ensure_topic(settings, partitions=1)
    t0 = quarter_hour_ago(2)
    for i in range(3):
        records, _ = waveform_records(f"w{i}", 4, seed=i)
        produce_in_order(settings, records, when=t0 + timedelta(minutes=1 + i))
    assert run_once(settings)["waveforms"] == {"output_new": 3}
    first = rows_by_id(s3_spark, settings)
    code, out = run_cli(settings, "rewind", "--to-earliest", "--execute", "--reason", "reprocess on S3")
    assert code == 0, out
    again = run_once(settings)
    assert again["waveforms"] == {"output_already_written": 3}, again["waveforms"]
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: 12}
    window = run_once(settings, window=(t0, t0 + timedelta(minutes=15)))
    assert window["status"] == "window_replaced" and window["waveforms"] == {"output_new": 3}
    after = rows_by_id(s3_spark, settings)
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in first.items()}  # same bytes, once
    assert assert_delta_rs_reads_as_spark(s3_spark, settings.output_table) == 3
    # one more run leaves two small files in the day's partition: its commit compacts them in the bucket
    records, _ = waveform_records("w3", 4, seed=3)
    produce_in_order(settings, records, when=t0 + timedelta(minutes=4))
    more = run_once(settings.replace(compact_after_files=2))
    assert more["waveforms"] == {"output_new": 1}
    assert [(d["table"], d["files_removed"], d["files_added"]) for d in more["compacted"]] == [("waveforms", 2, 1)]
    last = rows_by_id(s3_spark, settings)
    assert {k: v[:2] for k, v in last.items() if k != "w3"} == {k: v[:2] for k, v in first.items()}
    assert assert_delta_rs_reads_as_spark(s3_spark, settings.output_table) == 4


def test_the_store_down_at_the_publish_fails_the_run_visibly_and_the_retry_publishes_once(
    kafka, s3_engine, s3_spark, store, options, tmp_path
):
    """The object store dies after the engine wrote the run's files into the bucket and before
    the commit: the run fails (nothing is visible, no offset moves) and says the store cannot be
    reached; started again, the retry publishes each waveform once from the chunks it staged in
    the store before it died. The first attempt's files stay unreferenced until a vacuum."""
    from tests.helpers import make_settings, rows_by_id, run_cli, start_cli
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo

    settings = make_settings(
        tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), _prefix("staging"))
    )
    ensure_topic(settings)
    sent = produce_demo(settings, count=4, target_bytes=16 * 1024)
    run = start_cli(settings, "run", failpoints="publish.before_commit=sleep:20")
    bucket = open_store(settings.output_table, options)
    began = time.monotonic()
    while not any(k.startswith("wavepipe-append-") and "/_temporary/" not in k for k in bucket.list_keys()):
        assert run.poll() is None and time.monotonic() - began < 300, "the engine never wrote the run's files"
        time.sleep(0.5)
    store.kill()  # the engine's write is done; the commit (in under 20 s) meets no store
    killed = time.monotonic()
    out, _ = run.communicate(timeout=300)
    assert run.returncode != 0, out
    assert f"the object store at {options.endpoint} failed on s3://" in out and "then run again" in out, out[-2000:]
    assert time.monotonic() - killed < 90, "a store that does not answer fails the step in seconds, not minutes"
    store.up()
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}
    assert not any(k.startswith("_delta_log/") for k in bucket.list_keys())  # nothing committed

    code, out = run_cli(settings, "run")
    assert code == 0, out
    rows = rows_by_id(s3_spark, settings)
    assert {k: v[0] for k, v in rows.items()} == {w.waveform_id: w.checksum for w in sent}
    assert len({k.split("/")[0] for k in bucket.list_keys() if k.startswith("wavepipe-append-")}) == 2


@pytest.mark.parametrize(
    ("where", "readers"),
    [
        ("plan.after_claim", 2),
        ("consume.record@2", 2),
        ("consume.record@2", 1),  # one reader: the partitions read one after the other, as a mapped task reads its one
        ("reassemble.after_write", 2),
        ("publish.before_commit", 2),
        ("commit.before_offsets", 2),
    ],
)
def test_the_store_dying_in_any_step_fails_it_in_one_line_that_names_the_store_and_the_rerun_publishes_once(
    where, readers, kafka, s3_engine, s3_spark, store, options, tmp_path
):
    """The object store holding the tables, the staging and the run state dies at a point of
    each step (the run frozen there by a failpoint, the store killed, the run let go on): the run
    fails with exit 1 in one line that names the store's endpoint, what it said in a few words,
    and the command that checks it; no object store client's debug dump reaches the output, and
    the warnings beside it do not repeat the line. Once the store is back, `wavepipe run` resumes
    the run and publishes each waveform once, and the group's offsets end at the plan's end."""
    from tests.helpers import (
        assert_delta_rs_reads_as_spark,
        let_go,
        make_settings,
        rows_by_id,
        run_cli,
        start_cli,
        when_stopped,
    )
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.run_store import RunStore

    on_store = _on_store(options, _prefix("lake"), _prefix("staging"))
    settings = make_settings(
        tmp_path / "home", kafka, s3_engine, state_uri=_prefix("state"), consume_parallelism=readers, **on_store
    )
    ensure_topic(settings)
    sent = produce_demo(settings, count=8, target_bytes=16 * 1024)  # 8: both partitions read (all on one: 1 in 128)
    run = start_cli(settings, "run", "--run-id", "dies", failpoints=f"{where}=stop")
    frozen = when_stopped(run)
    store.kill()
    frozen.resume()
    try:
        out = let_go(run)
    finally:
        store.up()
    said = [line for line in out.splitlines() if line.startswith("wavepipe run failed: ")]
    assert run.returncode == 1 and len(said) == 1, out[-3000:]
    assert f"object store at {options.endpoint} failed on s3://{LocalObjectStore.bucket}/" in said[0], said[0]
    assert "Check it with `wavepipe check` and the s3_* settings, and that the bucket exists" in said[0], said[0]
    assert "Debug source" not in out and "retry_timeout" not in out, out[-3000:]
    assert sum(f"failed on s3://{LocalObjectStore.bucket}/" in line for line in out.splitlines()) == 1, out[-3000:]

    code, out = run_cli(settings, "run")
    assert code == 0, out[-3000:]
    rows = rows_by_id(s3_spark, settings)
    assert {k: v[0] for k, v in rows.items()} == {w.waveform_id: w.checksum for w in sent}
    storage.configure(settings)  # this process reads the bucket too, whatever ran before it
    assert assert_delta_rs_reads_as_spark(s3_spark, settings.output_table) == len(sent)  # an independent reader
    store_of_runs = RunStore(settings)  # the run (a new one, when the store died before its plan was saved)
    plan = store_of_runs.load_plan(store_of_runs.reports()[-1]["run_id"])
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {
        r.partition: r.end for r in plan.ranges
    }


def test_a_run_taken_over_after_its_lease_ran_out_ends_when_the_holder_commits_it_saying_so(
    kafka, s3_engine, s3_spark, options, tmp_path
):
    """The run state on the store with a 3 s lease: run A stalls (frozen by a failpoint) after
    its reassembly, past its lease; `wavepipe run` again (B) takes the run over, and stalls
    after its own reassembly; A goes on and commits the run. B then finds the staged files
    gone: it says that another worker committed the run and exits 0, changing nothing. Each
    waveform is published once, and the offsets end at the plan's end."""
    from tests.helpers import assert_delta_rs_reads_as_spark, make_settings, rows_by_id, start_cli, when_stopped
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.run_store import RunStore

    on_store = _on_store(options, _prefix("lake"), _prefix("staging"))
    settings = make_settings(tmp_path / "a", kafka, s3_engine, state_uri=_prefix("state"), state_lease_s=3, **on_store)
    ensure_topic(settings)
    sent = produce_demo(settings, count=4, target_bytes=16 * 1024)
    stall = "reassemble.after_write=stop"
    first = start_cli(settings, "run", "--run-id", "taken", failpoints=stall)
    first_frozen = when_stopped(first)
    time.sleep(settings.state_lease_s + 2)  # its lease runs out
    second = start_cli(settings.replace(home=tmp_path / "b"), "run", failpoints=stall)
    second_frozen = when_stopped(second)
    first_frozen.resume()
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:]
    second_frozen.resume()
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    assert "run taken was committed by another worker while this one ran" in out, out[-3000:]
    rows = rows_by_id(s3_spark, settings)
    assert {k: v[0] for k, v in rows.items()} == {w.waveform_id: w.checksum for w in sent}
    assert assert_delta_rs_reads_as_spark(s3_spark, settings.output_table) == len(sent)  # an independent reader
    plan = RunStore(settings).load_plan("taken")
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {
        r.partition: r.end for r in plan.ranges
    }


def test_a_reader_killed_mid_upload_leaves_no_staged_object_and_the_retry_stages_and_publishes_once(
    kafka, s3_engine, s3_spark, options, tmp_path
):
    """The reader dies while it puts its chunk file (after the upload's first part, before the
    upload completed): no object is there under the file's name (the range's digests, put
    before, are), nothing is committed. Run again, the run re-reads the range, puts the file
    whole, and publishes each waveform once; the killed reader's spool is gone with the run."""
    from tests.helpers import make_settings, rows_by_id, run_cli, start_cli
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.run_store import RunStore

    staging = _prefix("staging")
    settings = make_settings(tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), staging))
    ensure_topic(settings, partitions=1)
    sent = produce_demo(settings, count=5, target_bytes=64 * 1024)
    run = start_cli(settings, "run", "--run-id", "cut", failpoints="stage.upload@2=kill")  # 1: digests, 2: chunks
    out, _ = run.communicate(timeout=300)
    assert run.returncode == -9, out[-2000:]
    staged = open_store(staging, options).list_keys("cut")
    assert [k.split("/")[1] for k in staged] == ["digests"], staged
    assert list((settings.spool_dir / "cut").iterdir()), "the killed reader's file was still being put"
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: None}

    code, out = run_cli(settings, "run")
    assert code == 0, out
    rows = rows_by_id(s3_spark, settings)
    assert {k: v[0] for k, v in rows.items()} == {w.waveform_id: w.checksum for w in sent}
    end = RunStore(settings).load_plan("cut").range_for(0).end
    assert committed_offsets(settings, settings.group, settings.topic, [0]) == {0: end}
    assert open_store(staging, options).list_keys() == [] and not (settings.spool_dir / "cut").exists()


def test_the_engine_killed_mid_write_to_the_bucket_leaves_nothing_visible_and_the_retry_publishes_once(
    kafka, s3_engine, s3_spark, options, tmp_path, monkeypatch
):
    """The Spark engine is SIGKILLed while its Python workers write the run's waveforms into the
    bucket (a worker's failpoint, after its first batch, kills its whole engine; every worker stops
    at its first batch, so none can finish and close a file before the kill): the step fails
    in seconds; a file cut short is an unfinished multipart upload, never an object, so nothing of
    the write is in the table's folder, let alone in a version; no offset moves. The retry, on
    another engine (a run's state is in its home and its staging, not in an engine), publishes
    each waveform once."""
    from tests.helpers import make_settings, rows_by_id
    from wavepipe import pipeline
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.local.engine_server import LocalEngine

    settings = make_settings(
        tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), _prefix("staging"))
    )
    killed = settings.replace(spark_remote="", spark_connect_port=free_port(), output_batch_bytes=2 * 1024 * 1024)
    ensure_topic(settings)
    sent = produce_demo(settings, count=10, target_bytes=2 * 1024 * 1024)
    plan = pipeline.plan_step(settings, "cut-engine")
    for p in pipeline.partitions_to_read(plan):
        pipeline.consume_step(settings, "cut-engine", p)
    pipeline.reassemble_step(settings, "cut-engine")
    try:
        LocalEngine(killed).up()  # warm first: the time below is the step's
        monkeypatch.setenv("WAVEPIPE_FAILPOINTS", "assemble.batch@1=sleep:4+kill-app")
        began = time.monotonic()
        with pytest.raises(Exception) as failed:
            pipeline.validate_step(killed, "cut-engine")
        monkeypatch.delenv("WAVEPIPE_FAILPOINTS")
        assert time.monotonic() - began < 120, "the step fails soon after its engine died"
        assert LocalEngine(killed).pid() is None, failed.value
    finally:
        LocalEngine(killed).down(force=True)
    table = open_store(settings.output_table, options)
    assert table.list_keys() == [], "no file of the killed write is visible, and nothing was committed"
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: None, 1: None}

    pipeline.validate_step(settings, "cut-engine")
    report = pipeline.commit_step(settings, "cut-engine")
    assert report["waveforms"] == {"output_new": 10}, report["waveforms"]
    assert {k: v[0] for k, v in rows_by_id(s3_spark, settings).items()} == {w.waveform_id: w.checksum for w in sent}
    ends = {int(p): v["end"] for p, v in report["partitions"].items()}
    assert committed_offsets(settings, settings.group, settings.topic, sorted(ends)) == ends


def _two_at_once(*workers) -> list[tuple[int, str]]:
    """``wavepipe run`` started on each of ``workers`` at once: (return code, output) of each."""
    from tests.helpers import start_cli

    runs = [start_cli(s, "run") for s in workers]
    outs = [run.communicate(timeout=600)[0] for run in runs]
    return [(run.returncode, out) for run, out in zip(runs, outs, strict=True)]


def test_two_runs_of_one_group_on_two_workers_at_once_publish_each_waveform_once_and_shared_state_runs_one(
    kafka, s3_engine, s3_spark, options, tmp_path
):
    """Two workers start a run of one group at once, on the tables and staging in the bucket.

    First each with a home of its own (no shared claim, no shared lock). What keeps it exactly
    once is where the run's commits are: the table's log (the group's transaction: a publish that
    meets the other's commit decides again and writes nothing twice) and Kafka (the offsets'
    check before the commit, which takes a group already at the run's own end as done). Each waveform is
    published once and the offsets end at the topic's end; a run that fails says why (both
    reports count the waveforms as new: neither knows of the other).

    Then with the run state in the bucket too: one claims the group and runs, the other is
    refused at once naming that run, and the one report counts each new waveform once."""
    from tests.helpers import make_settings, rows_by_id
    from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.run_store import RunStore

    first = make_settings(tmp_path / "a", kafka, s3_engine, **_on_store(options, _prefix("lake"), _prefix("staging")))
    second = first.replace(home=tmp_path / "b")
    ensure_topic(first)
    sent = produce_demo(first, count=8, target_bytes=64 * 1024)
    outcomes = _two_at_once(first, second)
    assert 0 in dict(outcomes) and set(dict(outcomes)) <= {0, 1}, [(c, o[-1500:]) for c, o in outcomes]
    rows = rows_by_id(s3_spark, first)
    assert {k: v[0] for k, v in rows.items()} == {w.waveform_id: w.checksum for w in sent}
    published = s3_spark.read.format("delta").load(storage.for_spark(first.output_table)).count()
    assert published == len(sent), "no waveform twice"
    ends = committed_offsets(first, first.group, first.topic, [0, 1])
    assert all(ends.values()), ends
    for code, out in outcomes:
        if code:  # the one that lost: refused at its commit, in a line that says why
            assert "offsets" in out and "moved" in out, out[-2000:]

    state = _prefix("state")
    first, second = first.replace(state_uri=state), second.replace(state_uri=state)
    more = produce_demo(first, count=8, target_bytes=64 * 1024)
    outcomes = _two_at_once(first, second)
    assert sorted(code for code, _ in outcomes) == [0, 1], [(c, o[-1500:]) for c, o in outcomes]
    [report] = RunStore(first).reports()
    assert report["waveforms"] == {"output_new": len(more)}, report["waveforms"]
    [refused] = [out for code, out in outcomes if code]
    assert f"run {report['run_id']} of group" in refused, refused[-2000:]
    rows = rows_by_id(s3_spark, first)
    assert {k: v[0] for k, v in rows.items()} == {w.waveform_id: w.checksum for w in [*sent, *more]}


def test_the_built_server_is_the_release_the_compose_stack_runs(store):
    """docker/compose.yaml runs the SeaweedFS image of the release built here (``WEED_RELEASE``)."""
    from wavepipe.local.objectstore import WEED_RELEASE, weed_binary

    said = subprocess.run([str(weed_binary(store.tools_dir)), "version"], capture_output=True, text=True, check=True)
    assert f" {WEED_RELEASE} " in said.stdout, said.stdout


def test_the_bench_measures_wavepipe_on_the_store_beside_local_disk(kafka, s3_engine, options, tmp_path):
    """``wavepipe bench``'s S3 row: the same ranges run with the tables and the staging in the
    bucket and on local disk, each output checked (once each, checksums, a sample re-hashed read
    back from the bucket), the page says what the store costs; the row's prefix is deleted."""
    from tests.helpers import make_settings
    from wavepipe.bench.runner import BenchOptions, run_bench, save

    settings = make_settings(tmp_path / "home", kafka, s3_engine, **_on_store(options, ""))
    bench = BenchOptions.quick_options(
        large_bytes=4 * 2**20,
        small_bytes=1 * 2**20,
        scale=1,
        out_dir=tmp_path / "out",
        systems=("wavepipe", "wavepipe_s3"),
    )
    bench.warm_runs = 0
    results = run_bench(settings, bench)
    rows = {(m["system"], m["workload"], m["scale"]): m for m in results["measurements"]}
    assert {k for k in rows if k[2] == 1} == {
        (s, w, 1) for s in ("wavepipe", "wavepipe_s3") for w in ("large", "small")
    }
    for system, workload, _ in rows:
        m = rows[(system, workload, 1)]
        assert m["error"] is None and m["check"].startswith(f"{m['waveforms']} waveforms once each"), m
    assert "s3_prefix" in rows[("wavepipe_s3", "large", 1)]["info"]
    assert not [k for k in open_store(f"s3://{LocalObjectStore.bucket}", options).list_keys() if k.startswith("bench/")]
    page = save(results, bench.out_dir)[1].read_text()
    local, s3 = rows[("wavepipe", "large", 1)], rows[("wavepipe_s3", "large", 1)]
    assert "## What object storage costs" in page
    assert f"| large x1 | {local['wall_s']:.1f} | {s3['wall_s']:.1f} | {s3['wall_s'] / local['wall_s']:.2f}x |" in page


def test_chunks_out_of_order_spread_over_partitions_and_junk_take_every_route_on_the_bucket(
    kafka, s3_engine, s3_spark, options, tmp_path
):
    """With the staging and the tables in the bucket, each of the reassembly's routes reads the
    staged chunks there: a waveform in order (verified by its reader), one reversed in one
    partition (assembled from its staged file by a Python worker), one spread over two partitions
    (grouped by a shuffle, which Spark reads through S3A), and a junk record dead-lettered."""
    from tests.helpers import make_settings, produce_in_order, rows_by_id, waveform_records
    from wavepipe.consumers.kafka_admin import ensure_topic
    from wavepipe.pipeline import run_once

    settings = make_settings(
        tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), _prefix("staging"))
    )
    ensure_topic(settings)
    ordered, ordered_sum = waveform_records("ordered", 3, seed=1)
    reversed_, reversed_sum = waveform_records("reversed", 4, seed=2)
    spread, spread_sum = waveform_records("spread", 4, seed=3)
    produce_in_order(settings, [*ordered, *reversed_[::-1], spread[0], spread[1], (b"k", None, b"junk")])
    produce_in_order(settings, [spread[2], spread[3]], partition=1)
    report = run_once(settings)
    assert report["waveforms"] == {"output_new": 3}, report["waveforms"]
    assert report["verified"] == {"while_read": 1, "from_one_staged_file": 1, "by_a_shuffle": 1}, report["verified"]
    rows = rows_by_id(s3_spark, settings)
    assert {k: v[0] for k, v in rows.items()} == {
        "ordered": ordered_sum,
        "reversed": reversed_sum,
        "spread": spread_sum,
    }
    assert all(v[0] == v[1] for v in rows.values()), "payloads must be bit-exact"
    dead = storage.delta_table(settings.dead_letter_table).to_pyarrow_table(columns=["reason", "value"]).to_pylist()
    assert dead == [{"reason": "missing_header", "value": b"junk"}], dead


def test_a_homes_engine_started_before_its_tables_moved_to_the_bucket_is_restarted_with_s3a(
    kafka, s3_engine, options, tmp_path
):
    """A home's own engine started without S3 access (the tables were local then) meets a run
    whose tables and staging are in a bucket: the run restarts it with S3A (no step uses it) and
    publishes, instead of failing on the engine's first read of the store. The engine records
    which store it reaches (one started for another store's endpoint or keys is restarted too)."""
    from tests.helpers import local_engine, make_settings
    from wavepipe.consumers.kafka_admin import ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.local.engine_server import LocalEngine
    from wavepipe.pipeline import run_once

    before = local_engine(tmp_path / "home")
    before.up()
    try:
        was = before.pid()
        settings = make_settings(
            tmp_path / "home", kafka, s3_engine, **_on_store(options, _prefix("lake"), _prefix("staging"))
        ).replace(spark_remote="", spark_ui="", spark_connect_port=before.settings.spark_connect_port)
        ensure_topic(settings)
        sent = produce_demo(settings, count=3, target_bytes=16 * 1024)
        report = run_once(settings)
        assert report["waveforms"] == {"output_new": len(sent)}, report["waveforms"]
        engine = LocalEngine(settings)
        assert engine.pid() not in (None, was) and engine.state()["reaches_s3"] == storage.s3_reach(settings) != ""
    finally:
        LocalEngine(before.settings).down(force=True)
