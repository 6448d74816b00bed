from pathlib import Path

import pytest

from wavepipe.config import load_settings


def test_precedence_defaults_file_env_overrides(tmp_path, monkeypatch):
    cfg = tmp_path / "wavepipe.toml"
    cfg.write_text('[wavepipe]\ntopic = "from-file"\ngroup = "g-file"\nchunk_size = 1024\n'
                   '[wavepipe.kafka_client_config]\n"security.protocol" = "SSL"\n')
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
    with pytest.raises(ValueError, match="unknown wavepipe setting"):
        load_settings(no_such_thing=1)
    monkeypatch.setenv("WAVEPIPE_KAFKA_CLIENT_CONFIG", "[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_settings()
