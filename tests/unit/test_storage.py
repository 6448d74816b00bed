"""Storage locations and each client's options for them (pure: no store is asked)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wavepipe.contracts.config import load_settings
from wavepipe.storage import (
    DELTA_RS_PATIENCE,
    LOGSTORE_CLASS,
    GCSOptions,
    S3Options,
    abfss_account,
    arrow_path,
    credentials_env,
    delta_storage_options,
    for_clients,
    for_spark,
    is_remote,
    put_mode,
    spark_confs,
    store_kind,
    uses_object_store,
    version_tag,
)

LOCAL = S3Options("http://127.0.0.1:8333", "us-east-1", "key-id", "the-secret")


def test_uris_are_named_as_each_client_opens_them():
    assert for_spark("s3://b/tables/waveforms") == "s3a://b/tables/waveforms"
    assert for_clients("s3a://b/tables") == "s3://b/tables"
    assert for_spark("/var/lib/wavepipe/tables") == "/var/lib/wavepipe/tables"
    assert is_remote("s3://b") and is_remote("s3a://b/x") and not is_remote("/tmp/x") and not is_remote("")
    assert for_spark("gs://b/t") == for_clients("gs://b/t") == "gs://b/t"
    assert for_clients("abfss://box@acct.dfs.core.windows.net/lake/t") == "az://box/lake/t"
    assert for_clients("az://box/lake") == "az://box/lake" and is_remote("az://box") and is_remote("gs://b")
    assert [store_kind(u) for u in ("s3a://b", "gs://b", "az://c", "abfs://c@a.dfs.core.windows.net", "/x")] == [
        "s3",
        "gcs",
        "azure",
        "azure",
        None,
    ]
    assert abfss_account("abfss://box@acct.dfs.core.windows.net/x") == "acct" and abfss_account("az://box") is None
    assert (
        arrow_path("gs://b/t/x.parquet") == "b/t/x.parquet"
        and arrow_path("abfss://c@a.dfs.core.windows.net/p") == "c/p"
    )
    assert arrow_path("s3a://b/k") == "b/k" and arrow_path("/tmp/x") == "/tmp/x"


def test_a_version_tag_carries_the_generation_where_the_store_has_one():
    assert version_tag({"e_tag": '"abc"', "version": None}) == '"abc"', "S3 and Azure: the ETag as it was"
    assert put_mode(version_tag({"e_tag": '"abc"', "version": None})) == {"e_tag": '"abc"'}
    gcs = version_tag({"e_tag": '"md5=="', "version": "1795816571108860"})
    assert put_mode(gcs) == {"e_tag": '"md5=="', "version": "1795816571108860"}, "GCS: the generation travels"
    assert gcs != version_tag({"e_tag": '"md5=="', "version": "1795816571108861"}), "same bytes, another generation"


def test_gcs_and_azure_options_feed_obstore_delta_rs_and_pyarrow(tmp_path):
    import json

    from wavepipe import storage

    local = load_settings(home=tmp_path, state_uri="gs://lake/s", gcs_endpoint="local", gcs_emulator_port=14443)
    gcs = storage.options_for(local, "gcs")
    assert gcs == GCSOptions("http://127.0.0.1:14443")
    key = json.loads(delta_storage_options(gcs)["service_account_key"])
    assert key["gcs_base_url"] == "http://127.0.0.1:14443" and key["disable_oauth"] is True
    google = delta_storage_options(GCSOptions(service_account="/etc/wavepipe/sa.json"))
    assert google == {"service_account": "/etc/wavepipe/sa.json", **DELTA_RS_PATIENCE}
    assert delta_storage_options(GCSOptions()) == DELTA_RS_PATIENCE, "Google's API, the environment's credentials"
    azurite = storage.options_for(
        load_settings(home=tmp_path, azure_endpoint="local", azure_emulator_port=11000), "azure"
    )
    assert azurite.account == "devstoreaccount1" and azurite.endpoint == "http://127.0.0.1:11000/devstoreaccount1"
    assert delta_storage_options(azurite)["allow_http"] == delta_storage_options(gcs)["allow_http"] == "true"
    azure = load_settings(home=tmp_path, tables_uri="az://box/t", azure_account="acct", azure_key="k")
    options = delta_storage_options(storage.options_for(azure, "azure"))
    assert options == {"account_name": "acct", "account_key": "k", **DELTA_RS_PATIENCE}, "no endpoint: Azure's own"
    assert type(storage.arrow_filesystem(gcs)).__name__ == "GcsFileSystem"
    assert type(storage.arrow_filesystem(azurite)).__name__ == "AzureFileSystem"


def test_the_cloud_stores_secrets_are_redacted_and_spark_reaches_only_s3(tmp_path):
    from wavepipe.contracts.config import is_secret
    from wavepipe.storage import reaches_s3

    assert is_secret("azure_key") and is_secret("s3_secret_key")
    assert not is_secret("gcs_service_account") and not is_secret("azure_account")
    on_gcs = load_settings(home=tmp_path, tables_uri="gs://lake/t", staging_uri="az://box/s", azure_endpoint="local")
    assert uses_object_store(on_gcs) and not reaches_s3(on_gcs), "S3A's jars and confs only for S3"


def test_delta_rs_commits_with_conditional_puts_and_reaches_a_plain_http_store():
    options = delta_storage_options(LOCAL)
    assert options["conditional_put"] == "etag"
    assert options["AWS_ALLOW_HTTP"] == "true" and options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert (options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"]) == ("key-id", "the-secret")
    aws = delta_storage_options(S3Options(region="eu-west-1"))  # AWS, the environment's credentials
    assert aws == {"AWS_REGION": "eu-west-1", "conditional_put": "etag", **DELTA_RS_PATIENCE}
    assert int(aws["max_retries"]) <= 3 and aws["retry_timeout"] == "20s"  # a dead store fails a step in seconds


def test_spark_commits_through_the_conditional_logstore_and_s3a_may_make_conditional_creates():
    confs = spark_confs(LOCAL)
    assert confs["spark.delta.logStore.s3a.impl"] == confs["spark.delta.logStore.s3.impl"] == LOGSTORE_CLASS
    assert confs["spark.hadoop.fs.s3a.create.conditional.enabled"] == "true"
    assert confs["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert confs["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert not any("secret" in key or "access.key" in key for key in confs)  # keys: in the environment only
    assert credentials_env(LOCAL) == {"AWS_ACCESS_KEY_ID": "key-id", "AWS_SECRET_ACCESS_KEY": "the-secret"}
    aws = spark_confs(S3Options(region="eu-west-1"))
    assert "spark.hadoop.fs.s3a.endpoint" not in aws and "spark.hadoop.fs.s3a.access.key" not in aws


WHERE = "must be empty, an absolute path, s3://bucket[/prefix], gs://bucket[/prefix] or az://container[/prefix]"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tables_uri": "s3://Bad_Bucket/x"}, f"tables_uri {WHERE}"),
        ({"tables_uri": "relative/tables"}, f"tables_uri {WHERE}"),
        ({"tables_uri": "ftp://bucket/x"}, f"tables_uri {WHERE}"),
        ({"tables_uri": "gs://Bad/x"}, f"tables_uri {WHERE}"),
        ({"tables_uri": "az://two--hyphens/x", "azure_account": "acct"}, f"tables_uri {WHERE}"),
        ({"state_uri": "abfss://box@acct.blob.core.windows.net/x"}, f"state_uri {WHERE}"),
        ({"staging_uri": "s3:/bucket/x"}, f"staging_uri {WHERE}"),
        ({"state_uri": "state/folder"}, f"state_uri {WHERE}"),
        ({"s3_endpoint": "127.0.0.1:8333"}, "s3_endpoint must be empty (AWS), local"),
        ({"s3_access_key": "only-the-key"}, "s3_access_key and s3_secret_key go together"),
        ({"gcs_endpoint": "localhost:4443"}, "gcs_endpoint must be empty (Google), local"),
        ({"gcs_service_account": "key.json"}, "gcs_service_account must be empty or a key file's absolute path"),
        ({"gcs_endpoint": "local", "gcs_service_account": "/k.json"}, "an emulator at gcs_endpoint takes no"),
        ({"azure_account": "Bad_Account"}, "azure_account must be 3-24 lowercase letters or digits"),
        ({"azure_endpoint": "127.0.0.1:10000"}, "azure_endpoint must be empty (Azure), local"),
        ({"state_uri": "az://box/state"}, "a location on Azure (az://box/state) needs azure_account"),
        (
            {"tables_uri": "abfss://box@other.dfs.core.windows.net/t", "azure_account": "acct"},
            "names the storage account other, but azure_account is 'acct'",
        ),
    ],
)
def test_a_typo_in_a_storage_setting_is_refused_with_what_it_must_be(tmp_path, values, message):
    with pytest.raises(Exception, match=re.escape(message)):
        load_settings(home=tmp_path, **values)


def test_tables_or_staging_on_s3_make_the_settings_use_s3(tmp_path):
    assert not uses_object_store(load_settings(home=tmp_path))
    assert uses_object_store(load_settings(home=tmp_path, tables_uri="s3://lake/wavepipe", s3_endpoint="local"))
    on_s3 = load_settings(home=tmp_path, staging_uri="s3://lake/staging/", s3_endpoint="local")
    assert uses_object_store(on_s3) and on_s3.staging_location == "s3://lake/staging"


def test_the_engine_reaches_the_store_of_the_tables_and_staging_and_knows_which(tmp_path):
    from wavepipe.storage import reaches_s3, s3_reach

    state_only = load_settings(home=tmp_path, state_uri="s3://lake/state", s3_region="eu-west-1")
    assert uses_object_store(state_only) and not reaches_s3(state_only), "the run state is never the engine's"
    assert s3_reach(state_only) == ""
    tables = state_only.replace(tables_uri="s3://lake/tables")
    reach = s3_reach(tables)
    assert reach and s3_reach(tables) == reach, "the same store, the same fingerprint"
    for other in (
        {"s3_endpoint": "http://minio:9000"},
        {"s3_region": "us-east-1"},
        {"s3_access_key": "k", "s3_secret_key": "s"},
    ):
        assert s3_reach(tables.replace(**other)) != reach, other


def test_local_s3_options_are_the_home_object_stores_and_storage_does_not_import_its_server(tmp_path):
    import ast
    import stat

    from wavepipe import objectstore_access, storage
    from wavepipe.local.objectstore import LocalObjectStore

    settings = load_settings(home=tmp_path, tables_uri="s3://lake/tables", s3_endpoint="local", object_store_port=18333)
    options = storage.s3_options(settings)
    assert options == S3Options(**LocalObjectStore.from_settings(settings).client_options())
    assert options.endpoint == "http://127.0.0.1:18333" and options.access_key.startswith("wavepipe-")
    keys = tmp_path / "objectstore" / "credentials.json"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and storage.s3_options(settings) == options, "made once"

    def imported(module) -> set[str]:
        tree = ast.parse(Path(module.__file__).read_text())
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }

    assert "wavepipe.local.objectstore" not in imported(storage), "the store's server imports storage, not back"
    assert not any(name.startswith("wavepipe") for name in imported(objectstore_access)), "a leaf of wavepipe"


def test_a_runs_staged_files_are_named_under_its_staging_wherever_it_is(tmp_path):
    from wavepipe.contracts.plan import OffsetRange
    from wavepipe.run_store import RunStore

    rng = OffsetRange("t", 0, 5, 9)
    local = RunStore(load_settings(home=tmp_path))
    assert local.staged("r1", "chunks", rng) == str(tmp_path / "staging" / "r1" / "chunks" / f"{rng.name}.parquet")
    remote = RunStore(load_settings(home=tmp_path, staging_uri="s3://lake/stage", s3_endpoint="http://h:1"))
    assert remote.staged("r1", "digests", rng) == f"s3://lake/stage/r1/digests/{rng.name}.parquet"
    assert remote.candidate_dir("r1") == "s3://lake/stage/r1/candidate"


def test_local_files_are_listed_sized_and_removed_by_location(tmp_path):
    from wavepipe.storage import delete_tree, exists, files, total_bytes

    (tmp_path / "d").mkdir()
    for name, size in (("b.parquet", 3), ("a.parquet", 5), (".a.parquet.1.tmp", 7), ("c.json", 1)):
        (tmp_path / "d" / name).write_bytes(b"x" * size)
    found = files(str(tmp_path / "d"), ".parquet")
    assert found == [str(tmp_path / "d" / "a.parquet"), str(tmp_path / "d" / "b.parquet")]
    assert total_bytes(found) == 8 and exists(found[0]) and not exists(str(tmp_path / "d" / "z.parquet"))
    delete_tree(str(tmp_path / "d"))
    assert not (tmp_path / "d").exists() and files(str(tmp_path / "d")) == []


def test_spark_reaches_gcs_through_googles_connector_authenticated_as_the_settings_say(tmp_path):
    from wavepipe.storage import engine_reach, gcs_spark_confs, reaches_gcs, s3_reach

    emulator = gcs_spark_confs(GCSOptions("http://127.0.0.1:4443"))
    assert emulator["spark.hadoop.fs.gs.storage.root.url"] == "http://127.0.0.1:4443"
    assert emulator["spark.hadoop.fs.gs.auth.type"] == "UNAUTHENTICATED"
    assert emulator["spark.hadoop.fs.gs.block.size"].isdigit(), "the connector reads it as a number"
    keyed = gcs_spark_confs(GCSOptions(service_account="/etc/wavepipe/sa.json"))
    assert keyed["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] == "/etc/wavepipe/sa.json"
    assert "spark.hadoop.fs.gs.auth.type" not in gcs_spark_confs(GCSOptions()), "the connector's default credentials"
    state_only = load_settings(home=tmp_path, state_uri="gs://lake/state", gcs_endpoint="local")
    assert not reaches_gcs(state_only) and engine_reach(state_only) == s3_reach(state_only) == ""
    tables = state_only.replace(tables_uri="gs://lake/tables")
    assert reaches_gcs(tables) and engine_reach(tables) not in ("", engine_reach(tables.replace(gcs_emulator_port=1)))


OBSTORE_SAID = (
    "Generic S3 error: Error performing GET http://127.0.0.1:39209/wavepipe/state/groups/g/active.json in "
    "515.5ms, after 3 retries, max_retries: 3, retry_timeout: 20s  - HTTP error: error sending request"
)


def test_what_an_object_store_client_said_is_a_few_words_and_anything_else_its_first_line():
    from wavepipe.storage import said_by_store

    assert said_by_store(OSError(OBSTORE_SAID + "\nDebug source: ...")) == (
        "GET /wavepipe/state/groups/g/active.json: HTTP error: error sending request (3 retries)"
    )
    assert said_by_store(OSError("Connection refused\nat line 2")) == "Connection refused"
    assert said_by_store(TimeoutError()) == "TimeoutError"
    azure = (
        "Generic MicrosoftAzure error: Error performing list request: Error performing GET http://h:1/a/b?x=1 in 5ms"
    )
    assert said_by_store(OSError(azure)) == "GET /a/b: no answer"
    long_key = OBSTORE_SAID.replace("active.json", "k" * 400 + ".json")  # what the store said comes last
    assert said_by_store(OSError(long_key)).endswith(".json: HTTP error: error sending request (3 retries)")


def test_a_local_location_is_never_named_as_an_object_store(tmp_path):
    from wavepipe.storage import store_down

    said = store_down(str(tmp_path / "state"), OSError(13, "Permission denied"), load_settings(home=tmp_path))
    assert (
        said
        == f"{tmp_path / 'state'} failed: [Errno 13] Permission denied. Check that it is writable and has room, then run again"
    )


@pytest.mark.parametrize(
    ("changes", "where", "check"),
    [
        ({"s3_endpoint": "local"}, "http://127.0.0.1:", "`wavepipe objectstore status`"),
        ({"s3_endpoint": "https://minio.example:9000"}, "https://minio.example:9000", "`wavepipe check` and the s3_*"),
        ({"s3_endpoint": ""}, "AWS S3", "`wavepipe check` and the s3_* settings"),
    ],
)
def test_a_store_that_does_not_answer_is_one_line_naming_where_it_is_and_the_command_that_checks_it(
    tmp_path, changes, where, check
):
    from wavepipe.storage import store_down

    settings = load_settings(home=tmp_path, tables_uri="s3://lake/t", **changes)
    said = store_down("s3://lake/t", OSError(OBSTORE_SAID), settings)
    assert "\n" not in said and f"the object store at {where}" in said and f"Check it with {check}" in said, said
    assert " failed on s3://lake/t (" in said and "and that the bucket exists, then run again" in said, said
    assert "(GET /wavepipe/state/groups/g/active.json: HTTP error: error sending request (3 retries))" in said


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_this_homes_own_emulator_is_checked_by_its_status_command(tmp_path, kind):
    from wavepipe.storage import store_down

    uri = {"gcs": "gs://lake/t", "azure": "az://lake/t"}[kind]
    settings = load_settings(home=tmp_path, tables_uri=uri, **{f"{kind}_endpoint": "local"})
    said = store_down(uri, OSError("refused"), settings, what="the run state's object store")
    assert said.startswith("the run state's object store at ") and f"`wavepipe emulator status {kind}`" in said, said


def test_a_full_disk_is_named_by_the_fullest_local_location_with_its_setting(tmp_path):
    """``no_space`` reads ENOSPC from Python's, pyarrow's and the JVM's wording, through an error's
    causes; ``disk_full`` names the run's local location with the least free space (a remote one
    is never asked) and what the step writes there."""
    from wavepipe.storage import disk_full, no_space

    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as inner:
            raise RuntimeError("the engine's step failed") from inner
    except RuntimeError as outer:
        assert no_space(outer)
    assert no_space(OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"))
    assert no_space(RuntimeError("java.io.IOException: No space left on device"))
    assert not no_space(OSError(13, "Permission denied")) and not no_space(ValueError("28 chunks"))

    settings = load_settings(home=tmp_path / "home", tables_uri="s3://lake/t")
    line = str(disk_full(settings, 3 * 2**20))
    assert line.startswith(
        f"no space left on the disk of {settings.staging_dir} ("
    )  # not created yet: its folder asked
    assert "MiB free of" in line and "this step writes about 3.0 MiB there" in line, line
    # one disk holds staging, state and home here: each setting that moves some of it is named
    assert "give staging_uri, state_uri or the home (--home) a location with room" in line, line
    assert "s3://" not in line, line
