"""wavepipe over Kafka's secured listeners, as managed clusters run them: one real KRaft node
(``wavepipe.local.kafka.LocalKafka``) with a CA made by openssl (``wavepipe.local.tls``) and four
client listeners: TLS (server verified), mutual TLS, SASL_SSL SCRAM-SHA-512, and SASL_SSL
OAUTHBEARER whose tokens come from a callback named by dotted path (``tests.kafka_tokens.mint``,
unsecured JWS tokens, which the broker's default validator accepts).

Over each: a bounded run end to end (plan, readers in processes of their own, publish, the
dead-letter producer's transaction, commit), its offsets as Kafka's own consumer-groups tool
reports them over the same listener, the lag watcher's measurement, and a rewind. Also: a wrong
CA fails in one line naming the listener and the certificate; a typo'd callback is refused before
anything runs; the Connection's Test button (``WavepipeKafkaHook.test_connection``, real Airflow
code) passes over OAUTHBEARER-by-callback and mutual TLS. The broker is this module's own; the
session's plain broker is not started. Alone: ``.venv/bin/pytest tests/integration/test_kafka_security.py``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from confluent_kafka import Producer

from tests.helpers import assert_accounted, make_settings, read_topic, run_cli
from wavepipe.consumers.kafka_admin import committed_offsets, ensure_topic
from wavepipe.consumers.lag import group_lag
from wavepipe.consumers.producer import produce_demo
from wavepipe.consumers.rewind import RewindTarget, execute_rewind, plan_rewind
from wavepipe.contracts.config import SettingsError, load_settings
from wavepipe.local.kafka import CONSUMER_GROUPS_TOOL, Listener, LocalKafka, free_port, sasl_listener
from wavepipe.local.tls import broker_ssl_properties, client_ssl_config, make_certificates
from wavepipe.pipeline import run_once
from wavepipe.run_store import RunStore

pytestmark = pytest.mark.integration

SCRAM_USER, SCRAM_PASSWORD = "wavepipe-scram", "scram-secret"
TOKENS = "tests.kafka_tokens.mint"
LISTENERS = ("SSL", "MTLS", "SCRAM", "OAUTH")


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """The node, its TLS files, a second CA that signed none of them, and per listener its port."""
    folder = tmp_path_factory.mktemp("kafka-security")
    tls, other_ca = make_certificates(folder / "tls"), make_certificates(folder / "other-ca", "some other CA")
    ports = {name: free_port() for name in LISTENERS}
    node = LocalKafka(
        folder / "node",
        "127.0.0.1",
        free_port(),  # PLAINTEXT: the readiness check, and the test's own look at the dead letters
        load_settings().jars_dir,
        heap="384m",
        listeners=(
            Listener("SSL", ports["SSL"], "SSL"),
            Listener("MTLS", ports["MTLS"], "SSL", {"ssl.client.auth": "required"}),
            sasl_listener("SCRAM", ports["SCRAM"], "SCRAM-SHA-512"),
            sasl_listener("OAUTH", ports["OAUTH"], "OAUTHBEARER"),
        ),
        scram_users={SCRAM_USER: SCRAM_PASSWORD},
        server_config=broker_ssl_properties(tls),
        jvm_options=("-XX:TieredStopAtLevel=1",),
    )
    try:
        node.up()
        yield SimpleNamespace(node=node, tls=tls, other_ca=other_ca, ports=ports, folder=folder)
    finally:
        node.down(timeout=15)


def client_security(secure, listener: str) -> dict[str, str]:
    """The librdkafka properties (wavepipe's ``kafka_client_config``) of a client of ``listener``."""
    tls = client_ssl_config(secure.tls, mutual=listener == "MTLS")
    return {
        "SSL": {"security.protocol": "SSL", **tls},
        "MTLS": {"security.protocol": "SSL", **tls},
        "SCRAM": {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": SCRAM_USER,
            "sasl.password": SCRAM_PASSWORD,
            **tls,
        },
        "OAUTH": {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER", "oauth_cb": TOKENS, **tls},
    }[listener]


def tool_properties(secure, listener: str) -> Path:
    """A properties file for Kafka's own command-line tools as a client of ``listener``."""
    tls = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(secure.tls.ca)}
    if listener == "MTLS":
        keystore = secure.folder / "tool-client-keystore.pem"
        keystore.write_text(secure.tls.client_key.read_text() + secure.tls.client_certificate.read_text())
        tls |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)}
    sasl = {
        "SCRAM": {
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{SCRAM_USER}" password="{SCRAM_PASSWORD}";',
        },
        "OAUTH": {
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="kafka-tool";',
        },
    }.get(listener, {})
    props = {"security.protocol": "SASL_SSL" if sasl else "SSL", **tls, **sasl}
    path = secure.folder / f"tool-{listener}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def listener_settings(secure, engine, home: Path, listener: str, **changes):
    """A test's settings (``make_settings``) with every client on ``listener``; readers always in
    processes of their own (spawned: they import the callbacks themselves)."""
    bootstrap = f"127.0.0.1:{secure.ports[listener]}"
    settings = make_settings(
        home, SimpleNamespace(bootstrap=bootstrap), engine, consume_parallelism=2, consume_in_process_max_records=0
    )
    return settings.replace(kafka_client_config=client_security(secure, listener), **changes)


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_run_rewind_and_watch_over_each_secured_listener(secure, engine, spark, tmp_path, monkeypatch, listener):
    settings = listener_settings(secure, engine, tmp_path / "home", listener)
    settings = settings.replace(dead_letter_topic=f"dlq-{settings.topic}")
    minted = tmp_path / "minted"
    monkeypatch.setenv("WAVEPIPE_TEST_TOKEN_LOG", str(minted))  # inherited by the spawned readers
    began = time.monotonic()
    ensure_topic(settings, settings.topic, 2)
    ensure_topic(settings, settings.dead_letter_topic, 1)
    sent = produce_demo(settings, count=6, target_bytes=96 * 1024, batch=f"{listener}-{settings.topic}")
    plain = settings.replace(bootstrap_servers=secure.node.bootstrap, kafka_client_config={})
    junk = Producer(plain.kafka_config(**{"enable.idempotence": True}))
    junk.produce(settings.topic, value=b"not a chunk", key=b"junk", partition=0)  # a dead letter
    assert junk.flush(30) == 0

    report = run_once(settings, run_id=f"secure-{listener.lower()}")
    assert report["status"] == "committed", report
    assert report["waveforms"] == {"output_new": len(sent)}, report["waveforms"]
    assert report["totals"]["dead_letter"] == 1, report["totals"]
    assert_accounted(spark, settings, report)
    ends = {int(p): part["end"] for p, part in report["partitions"].items()}
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == ends
    [dead] = read_topic(plain, settings.dead_letter_topic)  # published in the commit's transaction
    assert dead[0] == b"not a chunk" and dead[1]["wp-dlq-reason"]

    # Kafka's own tool, over the same listener, sees what wavepipe committed
    described = secure.node.tool(
        CONSUMER_GROUPS_TOOL,
        *("--bootstrap-server", settings.bootstrap_servers, "--command-config", str(tool_properties(secure, listener))),
        *("--describe", "--group", settings.group),
    )
    assert described.returncode == 0, described.stderr[-2000:]
    rows = [line.split() for line in described.stdout.splitlines() if settings.topic in line]
    assert {int(r[2]): int(r[3]) for r in rows} == ends, described.stdout

    # the lag watcher's measurement, a rewind to the earliest offsets, and the watcher again
    assert group_lag(settings, settings.topic, settings.group, oldest=True).records == 0
    plan = plan_rewind(settings, topic=settings.topic, group=settings.group, target=RewindTarget.parse("earliest"))
    execute_rewind(settings, plan, who="tester", reason=f"over {listener}")
    assert committed_offsets(settings, settings.group, settings.topic, [0, 1]) == {0: 0, 1: 0}
    lag = group_lag(settings, settings.topic, settings.group, oldest=True)
    assert lag.records == sum(ends.values()) and set(lag.oldest) == {p for p, end in ends.items() if end}, lag

    if listener == "OAUTH":  # the run's reader processes minted their own tokens
        pids = set(minted.read_text().split())
        assert len(pids - {str(os.getpid())}) >= 2, f"tokens minted only by {pids} (this process: {os.getpid()})"
    print(f"{listener}: {len(sent)} waveforms, run + tool + rewind + watcher in {time.monotonic() - began:.1f}s")


def test_a_wrong_ca_fails_at_once_in_one_line_naming_the_listener_and_the_certificate(secure, engine, tmp_path):
    settings = listener_settings(secure, engine, tmp_path / "home", "SCRAM")
    wrong = settings.replace(
        kafka_client_config={**settings.kafka_client_config, "ssl.ca.location": str(secure.other_ca.ca)}
    )
    began = time.monotonic()
    code, out = run_cli(wrong, "run", timeout=120)
    seconds = time.monotonic() - began
    assert code == 1, out[-3000:]
    [line] = [line for line in out.splitlines() if "ssl.ca.location" in line]
    assert f"Kafka at {settings.bootstrap_servers} (SASL_SSL)" in line, out[-3000:]
    assert f"does not verify against ssl.ca.location ({secure.other_ca.ca})" in line, out[-3000:]
    assert "Give the CA that signed the brokers' certificates" in line, out[-3000:]
    assert "KafkaTlsError" not in out and "Traceback" not in out, out[-3000:]
    assert seconds < 25, f"took {seconds:.0f}s: the failure must not wait out a timeout"
    assert RunStore(wrong).active_run(wrong.group) is None, "a refused plan leaves the group free"


def test_a_mutual_tls_listener_without_a_client_certificate_says_so(secure, engine, tmp_path):
    from wavepipe.checks import check_kafka

    settings = listener_settings(secure, engine, tmp_path / "home", "MTLS")
    check = check_kafka(settings.replace(kafka_client_config=client_security(secure, "SSL")))
    assert (
        not check.ok and "the brokers refused the client's certificate (ssl.certificate.location: unset)" in check.line
    )


def test_a_typo_in_a_callback_path_is_refused_before_anything_runs(secure, engine, tmp_path):
    settings = listener_settings(secure, engine, tmp_path / "home", "OAUTH")
    typo = {**settings.kafka_client_config, "oauth_cb": "tests.kafka_tokens.mnit"}
    with pytest.raises(SettingsError, match=r"oauth_cb='tests.kafka_tokens.mnit': module 'tests.kafka_tokens' has no"):
        settings.replace(kafka_client_config=typo)
    code, out = _cli_run_with(settings, WAVEPIPE_KAFKA_CLIENT_CONFIG=json.dumps(typo))
    assert code == 2, out[-3000:]
    assert "WAVEPIPE_KAFKA_CLIENT_CONFIG: kafka_client_config: oauth_cb='tests.kafka_tokens.mnit'" in out, out[-3000:]
    assert not settings.runs_dir.exists(), "nothing planned"


def _cli_run_with(settings, **variables: str) -> tuple[int, str]:
    """``wavepipe run`` with ``settings``' environment and ``variables`` on top (a value the
    settings object itself refuses): (exit code, output)."""
    import subprocess
    import sys

    from wavepipe.contracts.config import PROJECT_ROOT
    from wavepipe.spark_launch import settings_env

    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from wavepipe.cli import main; sys.exit(main(['run']))"],
        env={**os.environ, **settings_env(settings), **variables},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("listener", ["OAUTH", "MTLS"])
def test_the_connections_test_button_over_a_secured_listener(secure, tmp_path, monkeypatch, listener):
    """real Airflow code: the Connection from AIRFLOW_CONN_<ID>, the provider's callback allowlist"""
    from wavepipe.plugins.connections import WavepipeKafkaHook

    monkeypatch.setenv("WAVEPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", TOKENS)
    extra = {"bootstrap.servers": f"127.0.0.1:{secure.ports[listener]}", **client_security(secure, listener)}
    monkeypatch.setenv("AIRFLOW_CONN_WP_SECURE", json.dumps({"conn_type": "wavepipe_kafka", "extra": extra}))
    ok, line = WavepipeKafkaHook("wp_secure").test_connection()
    assert ok and f"1 broker(s) at {extra['bootstrap.servers']} answered" in line, line

    wrong = {**extra, "ssl.ca.location": str(secure.other_ca.ca)}
    monkeypatch.setenv("AIRFLOW_CONN_WP_SECURE", json.dumps({"conn_type": "wavepipe_kafka", "extra": wrong}))
    ok, line = WavepipeKafkaHook("wp_secure").test_connection()
    assert not ok and f"does not verify against ssl.ca.location ({secure.other_ca.ca})" in line, line
    if listener == "OAUTH":
        monkeypatch.delenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST")
        monkeypatch.setenv("AIRFLOW_CONN_WP_SECURE", json.dumps({"conn_type": "wavepipe_kafka", "extra": extra}))
        ok, line = WavepipeKafkaHook("wp_secure").test_connection()
        assert not ok and "is not in [apache_kafka] callback_allowlist" in line, line
