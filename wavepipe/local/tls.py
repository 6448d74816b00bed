"""A local certificate authority for TLS listeners of the local broker, made with the openssl CLI.

``make_certificates`` writes PEM files only: a CA, a server certificate for loopback (SAN
``127.0.0.1`` and ``localhost``, so clients verify the host name as they do by default) and a
client certificate for mutual TLS, all signed by the CA. Kafka reads them as they are
(``ssl.keystore.type=PEM``): no keytool, no Java keystores.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from wavepipe.jars import SetupError, require_tool

DAYS = 30


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a local CA and the certificates it signed (keys unencrypted, PKCS#8)."""

    ca: Path
    #: The server's private key, then its certificate (a Kafka PEM keystore).
    server_keystore: Path
    client_certificate: Path
    client_key: Path


def _openssl(*args: str) -> None:
    openssl = require_tool("openssl", "Install openssl (apt-get install openssl).")
    result = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise SetupError(f"openssl {args[0]} failed: {said[-1] if said else 'no output'}")


def _signed(folder: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    """A new key and a certificate for it signed by ``folder``'s CA: (certificate, key)."""
    key, csr, cert, ext = (folder / f"{name}{suffix}" for suffix in (".key", ".csr", ".pem", ".ext"))
    ext.write_text(extensions)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(folder / "ca.pem"), "-CAkey", str(folder / "ca.key"),
        "-CAcreateserial", "-days", str(DAYS), "-sha256", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def make_certificates(folder: Path, ca_name: str = "wavepipe local CA") -> TlsFiles:
    """A new CA in ``folder`` and a server and a client certificate it signed (see the module)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", str(DAYS),
        "-subj", f"/CN={ca_name}", "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.pem"),
    )  # fmt: skip
    server, server_key = _signed(
        folder, "server", "/CN=localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    client, client_key = _signed(folder, "client", "/CN=wavepipe-client", "extendedKeyUsage=clientAuth\n")
    keystore = folder / "server-keystore.pem"
    keystore.write_text(server_key.read_text() + server.read_text())
    return TlsFiles(folder / "ca.pem", keystore, client, client_key)


def broker_ssl_properties(files: TlsFiles) -> dict[str, str]:
    """server.properties of a node whose TLS listeners present ``files``' server certificate and
    trust client certificates of its CA (asked for where a listener sets ``ssl.client.auth``)."""
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.server_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca),
    }


def client_ssl_config(files: TlsFiles, *, mutual: bool = False) -> dict[str, str]:
    """librdkafka TLS properties of a client that trusts ``files``' CA (``mutual``: and presents
    the client certificate)."""
    config = {"ssl.ca.location": str(files.ca)}
    if mutual:
        config |= {
            "ssl.certificate.location": str(files.client_certificate),
            "ssl.key.location": str(files.client_key),
        }
    return config
