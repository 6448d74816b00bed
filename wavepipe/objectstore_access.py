"""How clients reach this home's local object store: its endpoint, region and keys.

The server (``wavepipe.local.objectstore``) is started with these keys and the S3 clients
(``wavepipe.storage.s3_options``, for ``s3_endpoint = "local"``) sign with them. This module
imports nothing of wavepipe, so both can use it without importing each other.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

#: The local store's region (SeaweedFS accepts any; clients must name one to sign).
REGION = "us-east-1"
#: The local store listens on loopback only.
HOST = "127.0.0.1"


def store_folder(home: Path) -> Path:
    """Where the local object store of ``home`` keeps its data, config, keys and pid file."""
    return Path(home) / "objectstore"


def endpoint(port: int, host: str = HOST) -> str:
    return f"http://{host}:{port}"


def credentials(folder: Path) -> dict[str, str]:
    """The store's access key and secret, made the first time (kept in ``folder``, 0600)."""
    path = Path(folder) / "credentials.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        made = {"access_key": f"wavepipe-{secrets.token_hex(4)}", "secret_key": secrets.token_urlsafe(24)}
        path.touch(mode=0o600)
        path.write_text(json.dumps(made))
    return json.loads(path.read_text())


def client_options(folder: Path, port: int, host: str = HOST) -> dict[str, str]:
    """What an S3 client needs for the store of ``folder`` on ``port`` (the keys of
    ``wavepipe.storage.S3Options``)."""
    return {"endpoint": endpoint(port, host), "region": REGION, **credentials(folder)}
