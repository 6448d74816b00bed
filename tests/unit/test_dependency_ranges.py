"""The tested ranges: every requirement has a floor the oldest set pins, and a pyspark that cannot
run wavepipe's Spark work (a mixed pyspark/pyspark-client, a Spark with no Delta build) is refused
with what to install, before any jar is resolved."""

from __future__ import annotations

import tomllib
from importlib import metadata

import pytest

from tests.compat import lowest_pins
from wavepipe.jars import DELTA_FOR_SPARK, SetupError, delta_build, installed_pyspark, pyspark_problem


def test_the_oldest_set_pins_each_lower_bound_and_skips_extras():
    requires = [
        "apache-airflow<4,>=3.2.0",
        "numpy>=2.1.0,<3",
        "grpcio-status>=1.67.0",
        'pytest>=9; extra == "test"',
        "pyspark-client<=4.2.0,>=4.1.0",
    ]
    assert lowest_pins(requires) == [
        "apache-airflow==3.2.0",
        "numpy==2.1.0",
        "grpcio-status==1.67.0",
        "pyspark-client==4.1.0",
    ]


@pytest.mark.parametrize("requirement", ["numpy", "numpy<3", "numpy==2.1.0"])
def test_a_requirement_without_a_floor_is_refused(requirement):
    with pytest.raises(ValueError, match="without a lower bound"):
        lowest_pins([requirement])


@pytest.mark.repository
def test_every_requirement_of_the_package_has_a_floor_and_a_ceiling_or_a_reason():
    from wavepipe.contracts.config import PROJECT_ROOT

    deps = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert len(lowest_pins(deps)) == len(deps)
    # the Spark Connect client's helpers follow grpc and zstd, whose releases keep their APIs
    open_ended = {d.split(">")[0] for d in deps if "<" not in d}
    assert open_ended == {"grpcio-status", "zstandard"}, open_ended


def test_pyspark_and_pyspark_client_must_be_one_release():
    assert pyspark_problem("4.2.0", "4.2.0") is None
    assert pyspark_problem("4.1.3", None) is None
    problem = pyspark_problem("4.2.1", "4.2.0")
    assert "pyspark 4.2.1 and pyspark-client 4.2.0" in problem and "pyspark==4.2.0" in problem


def test_a_spark_without_a_delta_build_is_refused_naming_the_supported_ones():
    assert delta_build("4.1.0") == {"spark.binary": "4.1", "delta.version": DELTA_FOR_SPARK["4.1"]}
    assert delta_build("4.2.0")["spark.binary"] == "4.2"
    for unsupported in ("4.3.0", "4.0.5", "3.5.4"):
        with pytest.raises(SetupError, match=f"pyspark {unsupported} is not supported.*Spark 4.1, 4.2"):
            delta_build(unsupported)
    assert "not supported" in pyspark_problem("4.3.0", "4.3.0")


def test_the_installed_pyspark_passes_its_own_check():
    assert installed_pyspark() == metadata.version("pyspark")


@pytest.mark.repository
def test_the_support_table_states_the_ranges_of_pyproject():
    """docs/install-into-airflow.md's table: each package's range and oldest tested release are the
    ones pyproject.toml declares (the compatibility tier installs exactly those floors)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from wavepipe.contracts.config import PROJECT_ROOT

    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    declared = {Requirement(d).name.lower(): Requirement(d).specifier for d in project["dependencies"]}
    declared["python"] = SpecifierSet(project["requires-python"])
    text = (PROJECT_ROOT / "docs" / "install-into-airflow.md").read_text()
    rows = [line.split("|")[1:4] for line in text.split("### Supported versions")[1].splitlines() if line[:2] == "| "]
    checked = 0
    for names, ranges, oldest in rows[1:]:
        for name, spec, floor in zip(names.split(","), ranges.split(";"), oldest.split(";"), strict=False):
            name = name.strip().lower()
            if name in declared:
                assert SpecifierSet(spec.strip()) == declared[name], (name, spec, declared[name])
                assert floor.strip() in lowest_pins([f"{name}{declared[name]}"])[0], (name, floor)
                checked += 1
    assert checked >= 10, f"only {checked} rows of the support table name a requirement"
