"""OpenLineage for a run, through Airflow's OpenLineage provider: the commit task (``run``,
``follow``) says, once its run is committed, what it read (the topic, named as OpenLineage names a
Kafka topic, with the group's offset ranges per partition) and what it wrote (the three Delta
tables, with the rows the run put in each, the version it made, and on the waveforms table the
validation's every expectation as data-quality assertions). The validate task says the same
assertions when validation fails (nothing was written then).

The provider calls the operators' ``get_openlineage_facets_on_complete`` and ``_on_failure``
(``WavepipeOperator``) when ``[openlineage]`` names a transport; without one it is off, and
nothing here runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import attr
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    InputDatasetFacet,
    RunFacet,
    data_quality_assertions_dataset,
    dataset_version_dataset,
    output_statistics_output_dataset,
)

from wavepipe.contracts.config import Settings
from wavepipe.maintenance import table_paths
from wavepipe.plugins.assets import table_rows

#: Where wavepipe's own facets are described (their ``_schemaURL``).
FACETS_SCHEMA = "https://github.com/wavepipe/wavepipe/blob/main/docs/install-into-airflow.md#lineage"


@attr.define
class KafkaOffsetRangesInputDatasetFacet(InputDatasetFacet):
    """``wavepipe_offsetRanges``: the consumer group and, per partition, the range ``[start,
    end)`` the run read and the records in it."""

    group: str
    partitions: dict[str, dict[str, int]]

    @staticmethod
    def _get_schema() -> str:
        return f"{FACETS_SCHEMA}-wavepipe_offsetranges"


@attr.define
class WavepipeRunFacet(RunFacet):
    """``wavepipe_run``: the wavepipe run ids this task ran, and their outcome counts."""

    run_ids: list[str]
    outcome: dict[str, int]
    validation_success: bool | None

    @staticmethod
    def _get_schema() -> str:
        return f"{FACETS_SCHEMA}-wavepipe_run"


def table_dataset_name(location: str) -> tuple[str, str]:
    """(namespace, name) of a table at ``location`` as OpenLineage names datasets: ``s3://bucket``
    and the key, or ``file`` and the absolute path."""
    if "://" in location:
        parts = urlsplit(location)
        return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")
    return "file", location


def topic_dataset(servers: str, topic: str, group: str, ranges: Mapping[str, dict[str, int]]) -> InputDataset:
    """The topic as OpenLineage names a Kafka topic (``kafka://host:port``, the topic), with the
    ranges read."""
    server = servers.split(",")[0].strip()
    return InputDataset(
        namespace=f"kafka://{server}",
        name=topic,
        inputFacets={"wavepipe_offsetRanges": KafkaOffsetRangesInputDatasetFacet(group=group, partitions=dict(ranges))},
    )


def assertions(suites: Iterable[Mapping[str, Any]]):
    """Every expectation of the validation's suites as an OpenLineage data-quality assertion."""
    return data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
        assertions=[
            data_quality_assertions_dataset.Assertion(
                assertion=check["expectation"], success=bool(check["success"]), column=check.get("column")
            )
            for suite in suites
            for check in suite.get("checks") or ()
        ]
    )


def run_lineage(settings: Settings, reports: list[dict]):
    """The lineage of the runs a task committed (``reports``: theirs, oldest first; a follow task
    commits several): the topic read over all their ranges, the tables with the rows they wrote
    and the version the last one made, the last validation's assertions on the waveforms."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    read = [r for r in reports if r.get("partitions")]
    if not read:
        return OperatorLineage()
    last = read[-1]
    ranges: dict[str, dict[str, int]] = {}
    for report in read:
        for p, part in report["partitions"].items():
            seen = ranges.setdefault(p, {"start": part["start"], "end": part["end"], "records": 0})
            seen["start"], seen["end"] = min(seen["start"], part["start"]), max(seen["end"], part["end"])
            seen["records"] += int(part.get("records_read") or 0)
    rows = {t: sum(table_rows(r)[t] for r in read) for t in table_paths(settings)}
    validation = last.get("validation") or {}
    outputs = []
    for table, location in table_paths(settings).items():
        namespace, name = table_dataset_name(location)
        facets: dict[str, Any] = {}
        version = (last.get("table_versions") or {}).get(table)
        if version is not None:
            facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(version))
        if table == "waveforms" and validation.get("suites"):
            facets["dataQualityAssertions"] = assertions(validation["suites"])
        stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=rows[table])
        outputs.append(OutputDataset(namespace, name, facets=facets, outputFacets={"outputStatistics": stats}))
    outcome: dict[str, int] = {}
    for report in read:
        for key, value in (report.get("outcome") or {}).items():
            outcome[key] = outcome.get(key, 0) + int(value or 0)
    run = WavepipeRunFacet(
        run_ids=[r["run_id"] for r in read], outcome=outcome, validation_success=validation.get("success")
    )
    return OperatorLineage(
        inputs=[topic_dataset(settings.bootstrap_servers, last["topic"], last["group"], ranges)],
        outputs=outputs,
        run_facets={"wavepipe_run": run},
    )


def failed_validation_lineage(settings: Settings, plan, suites: list[dict]):
    """A failed validation's lineage: the topic's planned ranges read, nothing written, and the
    assertions (the failed ones false) on the candidate waveforms the run did not publish."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    ranges = {str(r.partition): {"start": r.start, "end": r.end, "records": r.size} for r in plan.ranges}
    topic = topic_dataset(settings.bootstrap_servers, plan.topic, plan.group, ranges)
    topic.inputFacets["dataQualityAssertions"] = assertions(suites)
    return OperatorLineage(inputs=[topic])
