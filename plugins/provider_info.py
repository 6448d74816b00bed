"""wavepipe as an Airflow provider (entry point ``apache_airflow_provider``): what Airflow reads
while it discovers providers, so this module imports nothing."""

from __future__ import annotations

from typing import Any

_HOOKS = "wavepipe.plugins.connections"


def get_provider_info() -> dict[str, Any]:
    """wavepipe's Connection types (``wavepipe.plugins.connections``): the Connections form offers
    them, and their Test buttons run wavepipe's own checks."""
    return {
        "package-name": "wavepipe",
        "name": "wavepipe",
        "description": "Bounded, exactly-once runs of chunked waveforms from Kafka into validated Delta tables",
        "connection-types": [
            {"connection-type": "wavepipe_kafka", "hook-class-name": f"{_HOOKS}.WavepipeKafkaHook"},
            {"connection-type": "wavepipe_spark_connect", "hook-class-name": f"{_HOOKS}.WavepipeSparkConnectHook"},
        ],
    }
