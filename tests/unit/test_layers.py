"""DESIGN.md's layers, checked on the real import graph (function-local imports included, with the
install mapping of pyproject.toml: consumers/ is wavepipe.consumers, ...): contracts; the
libraries for Kafka, the Spark engine, Delta and storage; the run and its steps; the drivers (the
CLI, ``follow``, the Airflow plugins and DAGs, the benchmark), with the local development servers
beside them. No module imports one of a higher layer, nothing below the drivers imports the local
servers, and a wavepipe module imported inside a function is one whose top-level imports bring a
heavy or optional package its importer does not load already."""

from __future__ import annotations

import ast
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.repository  # the repository's own files, not the installed package

ROOT = Path(__file__).resolve().parents[2]

#: Lowest first; a module's layer is that of the longest prefix naming it. The local development
#: servers rank with the drivers: only a driver may start one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("contracts", ("wavepipe.contracts",)),
    (
        "libraries",
        (
            "wavepipe",  # the package's own __init__ (its version)
            "wavepipe.resources",
            "wavepipe.storage",
            "wavepipe.state",
            "wavepipe.run_store",
            "wavepipe.processes",
            "wavepipe.cloud_access",
            "wavepipe.objectstore_access",
            "wavepipe.jars",
            "wavepipe.delta_files",
            "wavepipe.delta_protocol",
            "wavepipe.delta_txn",
            "wavepipe.engine_client",
            "wavepipe.spark_launch",
            "wavepipe.http_client",
            "wavepipe.waiting",
            "wavepipe.faults",
            "wavepipe.expectations",
            "wavepipe.offline_docs",
            "wavepipe.pages",
            "wavepipe.report_html",
            "wavepipe.recordings",
            "wavepipe.consumers.kafka_admin",
        ),
    ),
    (
        "run",
        ("wavepipe.consumers", "wavepipe.spark_apps", "wavepipe.pipeline", "wavepipe.plots", "wavepipe.maintenance"),
    ),
    (
        "drivers",
        (
            "wavepipe.cli",
            "wavepipe.follow",
            "wavepipe.status",
            "wavepipe.demo",
            "wavepipe.checks",
            "wavepipe.plugins",
            "wavepipe.dags",
            "wavepipe.bench",
            "wavepipe.local",
        ),
    ),
)

#: Third-party packages that cost a process real time or memory to import, or are optional
#: extras: the only reason for a function-local import of a wavepipe module.
HEAVY = {
    "pyspark", "deltalake", "pyarrow", "pandas", "numpy", "great_expectations", "matplotlib", "obstore",
    "confluent_kafka", "airflow", "fastapi", "uvicorn", "jinja2", "pydantic", "obspy", "soundfile", "wfdb",
    "xarray", "psutil", "httpx", "tenacity", "playwright",
}  # fmt: skip
#: wavepipe's readers of domain formats: each loads its optional extra when a function needs it
#: (``wavepipe.recordings.require``), so importing one is importing an optional package.
OPTIONAL = {"wavepipe.recordings.seismic", "wavepipe.recordings.audio", "wavepipe.recordings.ecg"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    local: bool  # inside a function

    def __str__(self) -> str:
        return f"{self.source}:{self.line} -> {self.target}"


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the installed package, by import name, from the folders pyproject maps."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in mapping.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _resolve(name: str) -> str | None:
    while name and name not in _modules():
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.AST) -> list[tuple[ast.AST, bool]]:
    """(import statement, inside a function) for every import in ``tree``."""
    found = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, local))
            visit(child, local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return found


def _targets(module: str, path: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in _modules() else base for alias in node.names]


@functools.cache
def _graph() -> tuple[list[Edge], dict[str, set[str]]]:
    """wavepipe's own import edges, and each module's top-level third-party packages."""
    edges, external = [], {}
    for module, path in _modules().items():
        external[module] = set()
        for node, local in _imports(ast.parse(path.read_text())):
            for target in _targets(module, path, node):
                own = _resolve(target) if target.startswith("wavepipe") else None
                if own and own != module:
                    edges.append(Edge(module, own, node.lineno, local))
                elif not target.startswith("wavepipe") and not local and target != "__future__":
                    external[module].add(target.split(".")[0])
    return edges, external


def _edges() -> list[Edge]:
    return _graph()[0]


def layer(module: str) -> int:
    ranked = [(len(prefix), rank) for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
              if module == prefix or module.startswith(prefix + ".")]  # fmt: skip
    assert ranked, f"{module} is in no layer of LAYERS: add it where it belongs"
    return max(ranked)[1]


def _loads(module: str) -> set[str]:
    """The third-party packages importing ``module`` loads, through its top-level imports."""
    seen, todo, packages = set(), [module], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        packages |= _graph()[1][current]
        todo += [e.target for e in _edges() if e.source == current and not e.local]
        todo += [p for p in _parents(current) if p in _modules()]
    return packages


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def test_every_module_has_a_layer():
    assert [m for m in _modules() if not any(m == p or m.startswith(p + ".") for _, ps in LAYERS for p in ps)] == []


def test_no_module_imports_a_higher_layer():
    upward = [f"{e} ({LAYERS[layer(e.source)][0]} imports {LAYERS[layer(e.target)][0]})" for e in _edges()
              if layer(e.target) > layer(e.source)]  # fmt: skip
    assert upward == []


def test_nothing_below_the_drivers_imports_the_local_servers():
    drivers = [name for name, _ in LAYERS].index("drivers")
    wrong = [str(e) for e in _edges() if e.target.startswith("wavepipe.local") and layer(e.source) < drivers]
    assert wrong == []


def test_a_function_local_import_defers_a_heavy_package():
    """Importing a wavepipe module inside a function only pays where it is a reader of an
    optional extra (``OPTIONAL``) or its top-level imports load a heavy package (``HEAVY``) that
    its importer does not load already; anywhere else it is an import that belongs at the top (or
    a cycle that a layer should break)."""
    needless = []
    for edge in _edges():
        if edge.local and edge.target not in OPTIONAL and not (_loads(edge.target) - _loads(edge.source)) & HEAVY:
            needless.append(str(edge))
    assert needless == []


def test_the_check_reads_function_local_imports():
    """The graph holds imports made inside functions, so the checks above see them."""
    assert any(e.local for e in _edges()) and any(not e.local for e in _edges())
