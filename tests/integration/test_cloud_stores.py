"""GCS and Azure Blob Storage as homes of wavepipe's run state and tables: real emulators on
loopback (fake-gcs-server built with Go, with wavepipe's XML-API writes; Azurite from npm), each
store's own conditional writes (GCS: ``ifGenerationMatch``; Azure: ``If-None-Match``/``If-Match``)
under the run state's claims, leases and appends, delta-rs tables and their commit race, obstore's
multipart uploads, ``wavepipe check``, bounded runs with their state there, and (GCS only: Azure's
ABFS cannot reach Azurite) a bounded run with the tables and staging on the store through Spark."""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pytest

from wavepipe import cloud_access, storage
from wavepipe.contracts.config import load_settings
from wavepipe.local.cloud_emulators import BUCKET, AzureEmulator, GCSEmulator
from wavepipe.local.kafka import free_port

SCHEMES = {"gcs": "gs", "azure": "az"}


@pytest.fixture(scope="module", params=["gcs", "azure"])
def emulator(request, tmp_path_factory):
    """This module's own emulator of each store on a free port, stopped at the end."""
    made = {"gcs": GCSEmulator, "azure": AzureEmulator}[request.param]
    server = made(tmp_path_factory.mktemp(request.param), free_port(), load_settings().tools_dir)
    server.up()
    yield request.param, server
    server.down()


@pytest.fixture
def kind(emulator) -> str:
    return emulator[0]


@pytest.fixture
def on_store(emulator) -> dict:
    """The settings that reach the emulator (as a team's would reach the cloud's store)."""
    kind, server = emulator
    if kind == "gcs":
        return {"gcs_endpoint": server.endpoint}
    return {
        "azure_account": cloud_access.AZURITE_ACCOUNT,
        "azure_key": cloud_access.AZURITE_KEY,
        "azure_endpoint": server.endpoint,
    }


@pytest.fixture
def options(kind, on_store, tmp_path):
    return storage.options_for(load_settings(home=tmp_path, **on_store), kind)


@pytest.fixture
def prefix(kind):
    """A new prefix in the emulator's bucket, per call."""
    return lambda name: f"{SCHEMES[kind]}://{BUCKET}/{name}-{time.time_ns()}"


def _at_once(count: int, work) -> dict[int, object]:
    """``work(i)`` in ``count`` threads released at the same instant: what each returned."""
    results: dict[int, object] = {}
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results


def test_of_writers_racing_to_create_or_replace_one_object_exactly_one_wins(options, prefix):
    bucket = storage.open_store(prefix("race"), options)
    for key in ("a", "b", "c"):
        created = _at_once(6, lambda i, key=key: bucket.put_if(key, f"writer {i}".encode()))
        [winner] = [i for i, tag in created.items() if tag is not None]
        assert bucket.get_bytes(key) == f"writer {winner}".encode(), "a loser overwrote nothing"
        read = bucket.get_tagged(key)[1]
        replaced = _at_once(6, lambda i, key=key, read=read: bucket.put_if(key, f"replacer {i}".encode(), read))
        [winner] = [i for i, tag in replaced.items() if tag is not None]
        assert bucket.get_tagged(key) == (f"replacer {winner}".encode(), replaced[winner])


def test_a_replace_of_a_stale_version_is_refused_even_when_its_bytes_are_the_same(kind, options, prefix):
    """GCS's ETag is the bytes' MD5: only the generation tells two writes of the same bytes apart,
    so the tag must carry it."""
    bucket = storage.open_store(prefix("cas"), options)
    first = bucket.put_if("claim", b"same")
    assert first is not None and first == bucket.get_tagged("claim")[1]
    second = bucket.put_if("claim", b"same", first)
    assert second is not None and second != first
    assert bucket.put_if("claim", b"same", first) is None, "the version first names was replaced since"
    assert bucket.put_if("claim", b"other", second) is not None
    assert bucket.put_if("absent", b"x", first) is None and bucket.head("absent") is None
    assert (kind == "gcs") == first.startswith("["), "GCS's tag carries its generation"


def test_of_workers_racing_to_claim_one_group_exactly_one_wins_and_no_appended_line_is_lost(on_store, prefix, tmp_path):
    from wavepipe.contracts.plan import ActiveRunError
    from wavepipe.run_store import RunStore

    state = prefix("state")
    stores = [RunStore(load_settings(home=tmp_path / f"w{i}", state_uri=state, **on_store)) for i in range(6)]

    def claim(i: int) -> str:
        try:
            stores[i].claim_group("g", f"run-{i}")
            return "claimed"
        except ActiveRunError as exc:
            return str(exc)

    outcomes = _at_once(len(stores), claim)
    [winner] = [i for i, said in outcomes.items() if said == "claimed"]
    assert stores[3].active_run("g") == f"run-{winner}"
    assert all(f"run-{winner} of group 'g'" in said for i, said in outcomes.items() if i != winner), outcomes
    _at_once(len(stores), lambda i: stores[i].record_failure("g", f"run-{i}", "plan", "lost the claim"))
    assert sorted(f["run_id"] for f in stores[0].failures("g")) == [f"run-{i}" for i in range(len(stores))]
    typo = prefix("state").replace(f"://{BUCKET}/", "://no-such-bucket-here/")
    with pytest.raises(storage.StorageUnavailableError, match=r"failed on .*the bucket exists"):
        RunStore(load_settings(home=tmp_path / "typo", state_uri=typo, **on_store)).reports()


def test_a_lease_is_taken_once_renewed_while_held_and_lost_when_another_takes_it_over(
    on_store, prefix, tmp_path, caplog
):
    """Two holders of one lease (3 s): the second is refused naming the first; the first renews
    past its term (the second is still refused after it); a lease past its term is taken over;
    a holder whose lease was taken over meanwhile loses it on its next renewal, and says so."""
    from wavepipe.state import Lease, ObjectState

    state = ObjectState(prefix("lease"), lease_s=3)
    one, other = Lease(state._store, "run.lock", 3), Lease(state._store, "run.lock", 3)
    assert one.take() is None
    assert "lease good for" in other.take()
    time.sleep(4.5)  # past the first term: renewed by then
    assert "lease good for" in other.take()
    one.release()
    assert other.take() is None, "let go: free at once"
    expired = {"owner": "x", "host": "another-host", "pid": 1, "expires_at": time.time() - 1}
    state._store.put_bytes("run.lock", json.dumps(expired).encode())  # its holder stalled past its term
    third = Lease(state._store, "run.lock", 3)
    assert third.take() is None, "taken over once its term ran out"
    with caplog.at_level("ERROR", logger="wavepipe.state"):
        deadline = time.monotonic() + 5
        while other._renewer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert not other._renewer.is_alive() and "lost the lease run.lock" in caplog.text
    third.release()
    assert state._store.head("run.lock") is None, "a release deletes only its own lease"


def test_delta_rs_writes_and_reads_a_table_and_of_two_commits_of_one_version_one_wins(options, prefix):
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    uri, reach = prefix("table"), storage.delta_storage_options(options)
    write_deltalake(uri, pa.table({"x": [0]}), storage_options=reach)
    write_deltalake(uri, pa.table({"x": [1]}), mode="append", storage_options=reach)
    ones, others = DeltaTable(uri, storage_options=reach), DeltaTable(uri, storage_options=reach)
    no_retry = CommitProperties(max_commit_retries=0)
    write_deltalake(ones, pa.table({"x": [2]}), mode="append", commit_properties=no_retry)
    with pytest.raises(CommitFailedError):  # version 2 is taken: its conditional put is refused
        write_deltalake(others, pa.table({"x": [3]}), mode="append", commit_properties=no_retry)
    table = DeltaTable(uri, storage_options=reach)
    assert table.version() == 2 and sorted(table.to_pyarrow_table()["x"].to_pylist()) == [0, 1, 2]
    racing = _at_once(
        4, lambda i: write_deltalake(uri, pa.table({"x": [10 + i]}), mode="append", storage_options=reach)
    )
    assert len(racing) == 4
    table = DeltaTable(uri, storage_options=reach)
    assert table.version() == 6 and len(table.to_pyarrow_table()) == 7, "each racing commit landed once"


def test_a_multipart_upload_is_listed_whole_and_read_by_ranges_and_parquet_footers(options, prefix, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setattr(storage, "PART_BYTES", 5 * 1024 * 1024)  # the least a part may be
    folder = prefix("parts")
    blob = bytes(range(256)) * (64 * 1024)  # 16 MiB: 4 parts
    storage.upload((blob[i : i + storage.PART_BYTES] for i in range(0, len(blob), storage.PART_BYTES)), f"{folder}/big")
    bucket = storage.open_store(folder, options)
    [meta] = bucket.list_meta()
    assert (meta["path"], meta["size"]) == ("big", len(blob))
    assert (
        bucket.get_range("big", 5 * 1024 * 1024 - 3, 5 * 1024 * 1024 + 3)
        == blob[5 * 1024 * 1024 - 3 : 5 * 1024 * 1024 + 3]
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": list(range(1000))}), sink)
    bucket.put_bytes("t/part-0.parquet", sink.getvalue().to_pybytes())
    [written] = storage.written_files(folder, "t")
    assert storage.parquet_metadata(folder, written).num_rows == 1000
    assert storage.read_parquet(f"{folder}/t/part-0.parquet").num_rows == 1000, "pyarrow's own filesystem"


@pytest.fixture(autouse=True)
def _configured(kind, on_store, tmp_path):
    """This process reaches the store as the settings say (what a run's entry point does)."""
    storage.configure(
        load_settings(home=tmp_path / "configured", state_uri=f"{SCHEMES[kind]}://{BUCKET}/x", **on_store)
    )


def test_wavepipe_check_proves_the_stores_conditional_writes_in_one_line(kind, on_store, prefix, tmp_path):
    from wavepipe.checks import check_location

    settings = load_settings(home=tmp_path, **on_store)
    state = prefix("state")
    found = check_location(settings, "state", state)
    assert found.ok and "conditional writes proved" in found.line, found
    assert storage.open_store(state).list_keys() == [], "the probe is deleted"
    missing = check_location(settings, "state", state.replace(f"://{BUCKET}/", "://no-such-bucket-here/"))
    assert missing.ok is False and f"{kind}_* settings" in missing.line and "\n" not in missing.line, missing
    dead = {key: value.replace(f":{_port(value)}", f":{free_port()}") for key, value in on_store.items()}
    said = storage.unreachable(load_settings(home=tmp_path, state_uri=state, **dead))
    assert said.startswith(f"the object store at {dead[f'{kind}_endpoint']} failed on "), said
    assert f"Check it with `wavepipe check` and the {kind}_* settings, and that the bucket exists" in said, said


def _port(value: str) -> str:
    """The port of an endpoint URL (other settings: none)."""
    from urllib.parse import urlparse

    return str(urlparse(value).port) if value.startswith("http") else "no port"


def test_bounded_runs_of_two_workers_keep_their_state_on_the_store_and_publish_each_waveform_once(
    kafka, engine, on_store, prefix, tmp_path
):
    """Tables and staging local (the engine's), the run state (plan, claim, locks, report) on the
    store: the run publishes each waveform once, and a worker of another home reads its report
    from the store and runs the next one on it, publishing only what is new."""
    from tests.helpers import make_settings, run_cli
    from wavepipe.consumers.kafka_admin import ensure_topic
    from wavepipe.consumers.producer import produce_demo
    from wavepipe.run_store import RunStore

    state = prefix("state")
    settings = make_settings(tmp_path / "a", kafka, engine, state_uri=state, **on_store)
    ensure_topic(settings)
    sent = produce_demo(settings, count=5, target_bytes=16 * 1024)
    code, out = run_cli(settings, "run")
    assert code == 0, out[-3000:]
    [report] = RunStore(settings.replace(home=tmp_path / "b")).reports()
    assert report["waveforms"] == {"output_new": len(sent)}, report["waveforms"]
    keys = storage.open_store(state).list_keys()
    assert any(k.startswith("runs/") for k in keys) and any(k.startswith("groups/") for k in keys), keys
    assert not (tmp_path / "a" / "runs").exists(), "no run state on the local disk"
    more = produce_demo(settings, count=3, target_bytes=16 * 1024)
    other = settings.replace(home=tmp_path / "b", tables_uri=settings.tables_location)  # the same tables and state
    code, out = run_cli(other, "run")
    assert code == 0, out[-3000:]
    reports = RunStore(settings).reports()
    assert [r["waveforms"] for r in reports] == [{"output_new": len(sent)}, {"output_new": len(more)}], reports


@pytest.fixture(scope="module")
def gcs_engine(emulator, tmp_path_factory):
    """A warm Spark engine of this module's own with Google's connector pointed at the GCS
    emulator (its jar and settings come with the tables on ``gs://``)."""
    from tests.helpers import local_engine

    _, server = emulator
    lake = f"gs://{BUCKET}/engine-{time.time_ns()}"
    engine = local_engine(tmp_path_factory.mktemp("gcs-engine"), tables_uri=lake, gcs_endpoint=server.endpoint)
    engine.up()
    yield engine
    engine.down(force=True)


#: GCS only: Spark's Azure connector (ABFS) speaks the Data Lake (dfs) API, which Azurite does
#: not serve (docs/deployment.md says what was shown for Azure instead).
@pytest.mark.parametrize("emulator", ["gcs"], indirect=True)
def test_a_bounded_run_stages_and_publishes_on_gcs_through_spark_and_delta_rs_reads_it(
    kind, kafka, gcs_engine, on_store, prefix, tmp_path
):
    """Tables and staging on ``gs://``: the readers stage there, the engine (Google's connector)
    reads the chunks and writes the run's files into the table, the run's process commits them
    with delta-rs (``ifGenerationMatch=0``), and delta-rs reads each waveform back bit-exact."""
    from tests.helpers import make_settings, run_cli
    from wavepipe.consumers.kafka_admin import ensure_topic
    from wavepipe.consumers.producer import produce_demo

    lake, staging = prefix("lake"), prefix("staging")
    settings = make_settings(tmp_path / "home", kafka, gcs_engine, tables_uri=lake, staging_uri=staging, **on_store)
    ensure_topic(settings)
    sent = produce_demo(settings, count=6, target_bytes=16 * 1024)
    code, out = run_cli(settings, "run")
    assert code == 0, out[-3000:]
    table = storage.delta_table(settings.output_table).to_pyarrow_table(columns=["waveform_id", "checksum"])
    assert dict(zip(*table.to_pydict().values(), strict=True)) == {w.waveform_id: w.checksum for w in sent}
    assert storage.open_store(staging).list_keys() == [], "a committed run's staging is removed"
    assert not list((tmp_path / "home").rglob("*.parquet")), "nothing staged or published on local disk"
