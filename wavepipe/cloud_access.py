"""How clients reach this home's local GCS and Azure emulators: their folders, endpoints and keys.

The servers (``wavepipe.local.cloud_emulators``) listen where these say, and the clients
(``wavepipe.storage``, for ``gcs_endpoint = "local"`` and ``azure_endpoint = "local"``) reach
them with what these give. Like ``objectstore_access``, it imports nothing of wavepipe.
"""

from __future__ import annotations

import json
from pathlib import Path

#: The emulators listen on loopback only.
HOST = "127.0.0.1"
#: Azurite's one account and its well-known key (published by Microsoft for the emulator: no secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def gcs_folder(home: Path) -> Path:
    """Where the GCS emulator of ``home`` keeps its data, log and pid file."""
    return Path(home) / "gcs-emulator"


def azure_folder(home: Path) -> Path:
    """Where the Azure emulator of ``home`` keeps its data, log and pid file."""
    return Path(home) / "azure-emulator"


def gcs_endpoint(port: int, host: str = HOST) -> str:
    return f"http://{host}:{port}"


def azure_endpoint(port: int, host: str = HOST) -> str:
    """Azurite's blob endpoint: the account is the first part of the path."""
    return f"http://{host}:{port}/{AZURITE_ACCOUNT}"


def emulator_service_account(endpoint: str) -> str:
    """A service-account key (JSON) that sends Rust's object_store (obstore, delta-rs) to the
    unauthenticated GCS API at ``endpoint``: ``gcs_base_url`` there, no OAuth."""
    key = {"gcs_base_url": endpoint.rstrip("/"), "disable_oauth": True}
    return json.dumps({**key, "client_email": "", "private_key": "", "private_key_id": ""})
