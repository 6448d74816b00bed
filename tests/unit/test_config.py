import os
import re
from pathlib import Path

import pytest

from wavepipe.contracts.config import SettingsError, load_settings


def test_precedence_defaults_file_env_overrides(tmp_path, monkeypatch):
    cfg = tmp_path / "wavepipe.toml"
    cfg.write_text(
        '[wavepipe]\ntopic = "from-file"\ngroup = "g-file"\nchunk_size = 1024\n'
        '[wavepipe.kafka_client_config]\n"security.protocol" = "SSL"\n'
    )
    monkeypatch.setenv("WAVEPIPE_CONFIG", str(cfg))
    monkeypatch.setenv("WAVEPIPE_GROUP", "g-env")
    monkeypatch.delenv("WAVEPIPE_TOPIC", raising=False)
    s = load_settings(chunk_size=2048)
    assert s.topic == "from-file"
    assert s.group == "g-env"
    assert s.chunk_size == 2048
    assert s.kafka_config()["security.protocol"] == "SSL"
    assert s.partitions == 4  # default


def test_home_moves_all_state(tmp_path, monkeypatch):
    monkeypatch.delenv("WAVEPIPE_CONFIG", raising=False)
    monkeypatch.setenv("WAVEPIPE_HOME", str(tmp_path / "h"))
    s = load_settings()
    for path in (s.kafka_dir, s.runs_dir, s.staging_dir, s.output_table, s.reports_dir, s.airflow_home):
        assert Path(path).is_relative_to(tmp_path / "h")


def test_unknown_setting_and_bad_values_are_clear_errors(monkeypatch):
    monkeypatch.delenv("WAVEPIPE_CONFIG", raising=False)
    with pytest.raises(ValueError, match="'no_such_thing' is not a wavepipe setting"):
        load_settings(no_such_thing=1)
    monkeypatch.setenv("WAVEPIPE_KAFKA_CLIENT_CONFIG", "[1, 2]")
    with pytest.raises(ValueError, match=r"^WAVEPIPE_KAFKA_CLIENT_CONFIG: kafka_client_config must be a JSON object"):
        load_settings()


@pytest.mark.parametrize(
    "name, value, rule",
    [
        ("max_records_per_partition", "-5", "0 \\(no cap\\) or a positive"),
        ("max_bytes_per_partition", "-1", "0 \\(no cap\\) or a positive"),
        ("partitions", "0", "at least 1"),
        ("partitions", "two", "an integer"),
        ("partitions", "1.5", "an integer"),
        ("consume_parallelism", "0", "at least 1"),
        ("consume_in_process_max_records", "-1", "0 or more records"),
        ("reader_stall_timeout_s", "nan", "positive number of seconds"),
        ("validate_max_quarantined_share", "1.5", "fraction"),
        ("max_waveform_bytes", str(2**31), "1 to 1073741824"),
        ("output_batch_bytes", "0", "at least 1 byte"),
        ("quality_metrics", "maybe", "true or false"),
        ("topic", "wave forms", "Kafka topic name"),
        ("new_group_start", "yesterday", "earliest, latest, an ISO-8601 instant"),
        ("spark_driver_memory", "2 gb", "JVM size"),
        ("bootstrap_servers", "localhost", "host:port"),
        ("spark_ui", "127.0.0.1:4040", "http\\(s\\)://host:port"),
    ],
)
def test_every_source_of_a_setting_is_checked_and_named(monkeypatch, tmp_path, name, value, rule):
    """The same bad value is refused from the TOML file (naming the file and key), from the
    environment (naming the variable) and as an override (a flag or DAG param)."""
    monkeypatch.delenv("WAVEPIPE_CONFIG", raising=False)
    for var in [v for v in os.environ if v.startswith("WAVEPIPE_")]:
        monkeypatch.delenv(var)
    toml = tmp_path / "wavepipe.toml"
    toml.write_text(f"[wavepipe]\n{name} = {value!r}\n".replace("'", '"'))
    monkeypatch.setenv("WAVEPIPE_CONFIG", str(toml))
    with pytest.raises(SettingsError, match=f"^{toml}, key {name}: {name} must.*{rule}"):
        load_settings()
    monkeypatch.delenv("WAVEPIPE_CONFIG")
    monkeypatch.setenv(f"WAVEPIPE_{name.upper()}", value)
    with pytest.raises(SettingsError, match=f"^WAVEPIPE_{name.upper()}: {name} must.*{rule}"):
        load_settings()
    monkeypatch.delenv(f"WAVEPIPE_{name.upper()}")
    with pytest.raises(SettingsError, match=f"^{name} must.*{rule}"):
        load_settings(**{name: value})
    with pytest.raises(SettingsError, match=rule):
        load_settings().replace(**{name: value})


def test_a_typo_in_the_file_suggests_the_setting_and_secrets_are_masked(monkeypatch, tmp_path):
    monkeypatch.delenv("WAVEPIPE_CONFIG", raising=False)
    toml = tmp_path / "wavepipe.toml"
    toml.write_text("[wavepipe]\nmax_record_per_partition = 5\n")
    monkeypatch.setenv("WAVEPIPE_CONFIG", str(toml))
    with pytest.raises(SettingsError, match="did you mean 'max_records_per_partition'"):
        load_settings()
    toml.write_text("[wavepipe]\nvalidate_mostly = 0.5\n")  # a retired setting says why it went
    with pytest.raises(SettingsError, match=r"validate_mostly' is no longer a wavepipe setting: .* is quarantined"):
        load_settings()
    monkeypatch.delenv("WAVEPIPE_CONFIG")
    s = load_settings(
        kafka_client_config={"sasl.password": "hunter2", "ssl.key.pem": "PEM", "sasl.username": "u"},
        spark_conf={"spark.hadoop.fs.s3a.secret.key": "abc", "spark.ui.enabled": "false"},
    )
    shown = s.as_dict(redact=True)
    assert shown["kafka_client_config"] == {"sasl.password": "*****", "ssl.key.pem": "*****", "sasl.username": "u"}
    assert shown["spark_conf"] == {"spark.hadoop.fs.s3a.secret.key": "*****", "spark.ui.enabled": "false"}
    assert s.as_dict()["kafka_client_config"]["sasl.password"] == "hunter2", "the clients still get it"


def test_a_small_run_gets_the_short_lived_jvm_options_and_a_large_one_the_defaults(tmp_path):
    from wavepipe.spark_launch import SMALL_RUN_JAVA_OPTIONS, is_small_run, spark_submit_command

    s = load_settings(
        home=tmp_path, spark_small_run_bytes=1000, spark_conf={"spark.driver.extraJavaOptions": "-Dmine=1"}
    )
    assert is_small_run(s, 0) and is_small_run(s, 1000) and not is_small_run(s, 1001)
    assert not is_small_run(s.replace(spark_small_run_bytes=0), 10), "0 turns it off"

    def driver_options(small_run: bool) -> str:
        cmd = spark_submit_command(s, tmp_path / "app.py", small_run=small_run)
        [value] = [c.split("=", 1)[1] for c in cmd if c.startswith("spark.driver.extraJavaOptions=")]
        return value

    assert driver_options(True) == f"-Dmine=1 {SMALL_RUN_JAVA_OPTIONS}", "added to the user's options"
    assert driver_options(False) == "-Dmine=1"


def test_staged_bytes_counts_the_runs_chunk_and_dead_letter_files(tmp_path):
    from wavepipe.run_store import RunStore

    store = RunStore(load_settings(home=tmp_path))
    assert store.staged_bytes("r1") == 0  # nothing staged yet
    for kind, size in (("chunks", 300), ("chunks", 200), ("dead_letter", 50)):
        folder = Path(store.staging_dir("r1")) / kind
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"t-0-{size}.parquet").write_bytes(b"x" * size)
    Path(store.candidate_dir("r1")).mkdir(parents=True)
    (Path(store.candidate_dir("r1")) / "other.parquet").write_bytes(b"x" * 999)  # not staged input
    assert store.staged_bytes("r1") == 550


@pytest.mark.repository
def test_a_checkout_keeps_its_state_in_its_own_folder(monkeypatch):
    from wavepipe.contracts import config

    for name in ("WAVEPIPE_CONFIG", "WAVEPIPE_HOME", "WAVEPIPE_JARS"):
        monkeypatch.delenv(name, raising=False)
    assert config.source_checkout() == config.PROJECT_ROOT  # the tests run from the checkout
    assert load_settings().home == config.PROJECT_ROOT / ".wavepipe"


def test_an_installed_wavepipe_keeps_its_state_in_the_users_folders(tmp_path, monkeypatch):
    """Without a source checkout (a wheel in site-packages) the home, the jars and the config file
    are never looked for beside the code: XDG folders, and the working folder's wavepipe.toml."""
    from wavepipe.contracts import config

    for name in ("WAVEPIPE_CONFIG", "WAVEPIPE_HOME", "WAVEPIPE_JARS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "source_checkout", lambda: None)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.home == tmp_path / "data" / "wavepipe"
    assert settings.jars_dir == tmp_path / "cache" / "wavepipe" / "jars"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert load_settings().home == tmp_path / "user" / ".local" / "share" / "wavepipe"
    (tmp_path / "wavepipe.toml").write_text('[wavepipe]\nhome = "here"\n')
    assert load_settings().home == tmp_path / "here"
    monkeypatch.setenv("WAVEPIPE_JARS", str(tmp_path / "jars"))
    assert load_settings().jars_dir == tmp_path / "jars"


def test_check_settings_names_where_and_which_setting():
    from wavepipe.contracts.config import check_settings

    assert check_settings({"home": "/srv/w", "partitions": "3", "topic": None}, "x") == {
        "home": Path("/srv/w"),
        "partitions": 3,
    }
    with pytest.raises(SettingsError, match=r"^the DAG's settings\['hme'\]: 'hme' is not a wavepipe setting.*home"):
        check_settings({"hme": "/srv/w"}, "the DAG's settings")
    with pytest.raises(SettingsError, match=r"^s\['partitions'\]: partitions must be an integer"):
        check_settings({"partitions": "three"}, "s")
    with pytest.raises(SettingsError, match=r"topic must be a Kafka topic name"):
        check_settings({"topic": "no spaces"}, "s")
    with pytest.raises(SettingsError, match="must be a mapping of wavepipe settings"):
        check_settings(["home"], "s")


def test_every_bad_value_is_listed_at_once_with_its_source(monkeypatch, tmp_path):
    """One refusal names every bad value (not just the first), each with the file and key or the
    variable it was read from; a rule between two settings names the source of the first."""
    for var in [v for v in os.environ if v.startswith("WAVEPIPE_")]:
        monkeypatch.delenv(var)
    toml = tmp_path / "wavepipe.toml"
    toml.write_text("[wavepipe]\npartitions = true\nvalidate_sample_rate_min = 50.0\ntopic = 7\n")
    monkeypatch.setenv("WAVEPIPE_CONFIG", str(toml))
    monkeypatch.setenv("WAVEPIPE_CHUNK_SIZE", "0")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert str(refused.value).splitlines() == [
        f"{toml}, key topic: topic must be a string, got 7",
        f"{toml}, key partitions: partitions must be an integer, got True",
        "WAVEPIPE_CHUNK_SIZE: chunk_size must be at least 1 byte, got '0'",
    ]
    toml.write_text("[wavepipe]\nvalidate_sample_rate_min = 50.0\n")
    monkeypatch.delenv("WAVEPIPE_CHUNK_SIZE")
    monkeypatch.setenv("WAVEPIPE_VALIDATE_SAMPLE_RATE_MAX", "10")
    with pytest.raises(SettingsError, match=rf"^{toml}, key validate_sample_rate_min: .* \(50\) is above .* \(10\)$"):
        load_settings()


def test_settings_made_directly_are_checked_too():
    from pydantic import ValidationError

    from wavepipe.contracts.config import Settings, check_settings

    assert Settings(partitions="3").partitions == 3
    for bad in ({"partitions": 0}, {"spark_engine": "conect"}, {"max_record_per_partition": 5}, {"topic": "a b"}):
        with pytest.raises(ValidationError):
            Settings(**bad)
    with pytest.raises(ValidationError):
        Settings().model_copy().__setattr__("partitions", 5)  # frozen
    with pytest.raises(SettingsError, match=r"^d\['dead_letter_topic'\]: dead_letter_topic must not be the topic"):
        check_settings({"topic": "t", "dead_letter_topic": "t"}, "d")


def test_a_dags_settings_are_held_only_to_the_rules_between_settings_they_give(monkeypatch, tmp_path):
    """A DAG's settings are a part: its dead-letter topic is compared with a topic it gives, not
    with the default one (the whole set is checked again when a task loads it)."""
    from wavepipe.contracts.config import check_settings

    assert check_settings({"dead_letter_topic": "waveforms"}, "d") == {"dead_letter_topic": "waveforms"}
    assert check_settings({"validate_sample_rate_max": 0.0005}, "d") == {"validate_sample_rate_max": 0.0005}
    with pytest.raises(SettingsError, match=r"validate_sample_rate_min .* is above"):
        check_settings({"validate_sample_rate_min": 10, "validate_sample_rate_max": 1}, "d")
    with pytest.raises(SettingsError, match="dead_letter_topic must not be the topic"):
        load_settings(dead_letter_topic="waveforms", topic="waveforms")


def test_an_instant_written_as_a_toml_date_time_is_read_as_one(monkeypatch, tmp_path):
    for var in [v for v in os.environ if v.startswith("WAVEPIPE_")]:
        monkeypatch.delenv(var)
    toml = tmp_path / "wavepipe.toml"
    toml.write_text("[wavepipe]\nnew_group_start = 2026-01-01T00:00:00Z\nvalidate_start_time_min = 1990-01-01\n")
    monkeypatch.setenv("WAVEPIPE_CONFIG", str(toml))
    settings = load_settings()
    assert settings.new_group_start == "2026-01-01T00:00:00+00:00"
    assert settings.validate_start_time_min == "1990-01-01"


def test_a_child_process_loads_the_same_settings_from_their_environment(monkeypatch, tmp_path):
    """``settings_env`` carries every setting, tables and lists of tables included, as a child
    (a spark-submit app, an Airflow task) reads them back."""
    from wavepipe.spark_launch import settings_env

    rules = [{"name": "late", "metric": "latency_s", "above": 60.0, "sources": "IU.*"}]
    settings = load_settings(home=str(tmp_path), quality_rules=rules, quality_metrics=False, spark_conf={"a.b": "1"})
    for var in [v for v in os.environ if v.startswith("WAVEPIPE_")]:
        monkeypatch.delenv(var)
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    assert load_settings() == settings


def test_every_variable_wavepipe_sets_itself_is_known_so_no_log_warns_about_it():
    """wavepipe's own variables (set for the processes it starts, such as the supervised Airflow
    services) are never reported as unknown settings: every ``"WAVEPIPE_..."`` literal in the
    code is a setting or one of the documented other variables."""
    import importlib
    from pathlib import Path

    from wavepipe.contracts.config import OTHER_VARIABLES, Settings

    known = {f"WAVEPIPE_{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    packages = (
        "wavepipe",
        "wavepipe.plugins",
        "wavepipe.consumers",
        "wavepipe.spark_apps",
        "wavepipe.dags",
        "wavepipe.bench",
    )
    folders = {Path(p) for name in packages for p in importlib.import_module(name).__path__}  # a checkout or a wheel
    used = {
        name
        for folder in folders
        for path in folder.rglob("*.py")
        for name in re.findall(r"[\"'](WAVEPIPE_[A-Z_]+)[\"']", path.read_text())
    }
    assert used, "no WAVEPIPE_ variable found: the scan looks in the wrong place"
    assert sorted(used - known) == []
