"""Kafka callbacks named by dotted path: imported by the process making a client, composed with
wavepipe's own, and a path that does not import is refused before a run, naming key and path."""

import base64
import json

import pytest

from tests import kafka_tokens
from wavepipe.consumers.kafka_admin import client_config, tls_message
from wavepipe.contracts.config import SettingsError, load_settings
from wavepipe.contracts.kafka_callbacks import CALLBACK_KEYS, CallbackError, import_callback, resolved


def test_the_callback_keys_are_the_apache_kafka_providers():
    from airflow.providers.apache.kafka.hooks.base import CALLBACK_CONFIG_KEYS

    assert set(CALLBACK_KEYS) == set(CALLBACK_CONFIG_KEYS)


def test_a_dotted_path_imports_to_its_function():
    assert import_callback("oauth_cb", "tests.kafka_tokens.mint") is kafka_tokens.mint
    config = client_config({"bootstrap.servers": "b:9092", "oauth_cb": "tests.kafka_tokens.mint"})
    assert config["oauth_cb"] is kafka_tokens.mint and config["logger"] is not None
    token, expiry = kafka_tokens.mint("")
    header, payload, signature = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"}
    assert json.loads(base64.urlsafe_b64decode(payload + "=="))["sub"] == kafka_tokens.PRINCIPAL
    assert signature == "" and expiry > 0


@pytest.mark.parametrize(
    "path, says",
    [
        ("tests.kafka_tokenz.mint", "module 'tests.kafka_tokenz' cannot be imported"),
        ("tests.kafka_tokens.mnit", "module 'tests.kafka_tokens' has no 'mnit'"),
        ("tests.kafka_tokens.NOT_CALLABLE", "names a str, not a function"),
        ("mint", "is not a dotted path"),
    ],
)
def test_a_typo_is_one_line_naming_the_key_and_the_path(path, says):
    with pytest.raises(CallbackError) as caught:
        import_callback("oauth_cb", path)
    line = str(caught.value)
    assert says in line and f"oauth_cb={path!r}" in line and "\n" not in line, line


def test_a_users_error_cb_and_wavepipes_are_both_called():
    own: list = []
    kafka_tokens.ERRORS.clear()
    config = resolved({"error_cb": "tests.kafka_tokens.note_error"}, {"error_cb": own.append})
    config["error_cb"]("broker down")
    assert kafka_tokens.ERRORS == ["broker down"] and own == ["broker down"]
    assert resolved({}, {"error_cb": own.append})["error_cb"] == own.append
    assert resolved({"error_cb": "tests.kafka_tokens.note_error"})["error_cb"] is kafka_tokens.note_error


def test_a_users_error_cb_that_raises_does_not_keep_wavepipes_from_hearing():
    own: list = []

    def broken(err):
        raise RuntimeError(f"the team's callback failed on {err}")

    with pytest.raises(RuntimeError, match="the team's callback failed"):
        resolved({"error_cb": broken}, {"error_cb": own.append})["error_cb"]("auth failed")
    assert own == ["auth failed"]


def test_settings_refuse_a_callback_that_does_not_import_naming_where_it_was_read(monkeypatch, tmp_path):
    monkeypatch.setenv("WAVEPIPE_HOME", str(tmp_path))
    monkeypatch.setenv("WAVEPIPE_KAFKA_CLIENT_CONFIG", json.dumps({"oauth_cb": "tests.kafka_tokenz.mint"}))
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value).startswith(
        "WAVEPIPE_KAFKA_CLIENT_CONFIG: kafka_client_config: oauth_cb='tests.kafka_tokenz.mint': module "
    ), str(caught.value)
    monkeypatch.delenv("WAVEPIPE_KAFKA_CLIENT_CONFIG")
    with pytest.raises(SettingsError, match=r"error_cb is a Python object.*dotted path"):
        load_settings(kafka_client_config={"error_cb": print})
    settings = load_settings(kafka_client_config={"oauth_cb": "tests.kafka_tokens.mint"})
    assert settings.kafka_config()["oauth_cb"] == "tests.kafka_tokens.mint", "the path travels as text"


def test_a_failed_tls_handshake_is_one_line_naming_the_listener_the_certificate_and_the_fix():
    config = {"bootstrap.servers": "b1:9093", "security.protocol": "SASL_SSL", "ssl.ca.location": "/etc/ca.pem"}
    said = (
        "ssl://b1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: "
        "broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root "
        "CA certificates are installed (install ca-certificates package) (after 5ms in state SSL_HANDSHAKE)"
    )
    line = tls_message(config, said)
    assert line.startswith("Kafka at b1:9093 (SASL_SSL): the brokers' certificate does not verify against "), line
    assert "ssl.ca.location (/etc/ca.pem)" in line and "Give the CA that signed" in line, line
    assert "install ca-certificates" not in line and "\n" not in line, line
    refused = tls_message({**config, "security.protocol": "SSL"}, "Receive failed: ssl/tls alert bad certificate")
    assert "(SSL): the brokers refused the client's certificate (ssl.certificate.location: unset)" in refused
    other = tls_message(config, "SSL handshake failed: error:0A00010B:SSL routines::wrong version number")
    assert "the TLS handshake failed: SSL handshake failed" in other and "speaks SASL_SSL" in other, other


def test_local_airflow_allows_the_callbacks_its_settings_name(monkeypatch, tmp_path):
    """`wavepipe airflow up` writes the Connection from the settings: their callback paths join
    the provider's allowlist, or the Connection it wrote would be refused"""
    from wavepipe.local.airflow import airflow_env

    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "team.auth.token")
    settings = load_settings(home=tmp_path, kafka_client_config={"oauth_cb": "tests.kafka_tokens.mint"})
    assert (
        airflow_env(settings)["AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST"] == "team.auth.token,tests.kafka_tokens.mint"
    )
    monkeypatch.delenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST")
    assert "AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST" not in airflow_env(settings.replace(kafka_client_config={}))
