"""A run's pages in the run state, where Airflow's API server reads them
(``wavepipe.plugins.report_app``): the API server needs no disk shared with the workers.

The state holds them at the paths the worker's home has them, so a state that is the home holds
nothing twice:

* ``reports/<run_id>.html``: the run's page (its JSON report, ``reports/<run_id>.json``, is
  there already: ``RunStore.save_report``);
* ``gx/uncommitted/data_docs/local_site/<path>``: the Great Expectations Data Docs pages the
  run's validation built (its results, and the site's index as that run left it), each at its
  path in the site;
* ``reports/<run_id>.data-docs``: the site paths of the run's own Data Docs pages (JSON), which
  go with its page.

What those pages load (Bootstrap, jQuery, GX's images) is not copied: the API server serves it
from the installed packages (``wavepipe.offline_docs.asset``).

The state keeps the pages and JSON reports of the last ``PAGES_KEPT`` runs: a run that keeps its
page removes those of older runs (a group's last committed run, which ``wavepipe status`` reads, is
kept in the group's own state), and their plots (``reports/<run_id>/``); a worker's home apart from
the state keeps its own copies of the last ``PAGES_KEPT`` likewise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from wavepipe.contracts.runfiles import html_path
from wavepipe.run_store import RunStore
from wavepipe.state import LocalState

#: Runs whose pages the run state keeps (the Data Docs index lists the last 200 results).
PAGES_KEPT = 200
#: The Data Docs site inside GX's project folder (``Settings.gx_dir``, ``<home>/gx``).
SITE_IN_GX = "uncommitted/data_docs/local_site"
#: The site's place in the run state: its place under the home.
SITE_KEY = f"gx/{SITE_IN_GX}"
#: The suffix of the key listing a run's own Data Docs pages.
OWN_PAGES = ".data-docs"

#: A run's page or report file name: a safe run id, ``.html`` or ``.json``.
_REPORT_NAME = re.compile(r"[A-Za-z0-9_.+-]+\.(html|json)")
#: A run's plot folder under ``reports/``: a safe run id.
_PLOTS_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
#: One folder or file name of a path in the Data Docs site.
_SITE_NAME = re.compile(r"[\w.+=@,~-]+")
#: A Data Docs URL as a worker's GX writes it: ``file://<its gx_dir>/<SITE_IN_GX>/``, then the path.
_SITE_URL = re.compile(r"file://[^\"'<>]*?/" + re.escape(SITE_IN_GX) + "/")


def data_docs_root(settings) -> Path:
    """The home's Data Docs site."""
    return settings.gx_dir / SITE_IN_GX


def report_key(name: str) -> str:
    """The key of a run's page or report file ``name`` (``<run_id>.html`` or ``.json``); ValueError
    for any other name."""
    if not _REPORT_NAME.fullmatch(name):
        raise ValueError(f"not a run page's or report's name: {name!r}")
    return f"reports/{name}"


def data_docs_key(path: str) -> str:
    """The key of the Data Docs page at ``path`` in the site; ValueError for a path that is not
    plain names joined by ``/`` (no empty, ``.`` or ``..`` part, nothing absolute)."""
    if not _is_site_path(path):
        raise ValueError(f"not a Data Docs page's path: {path!r}")
    return f"{SITE_KEY}/{path}"


def _is_site_path(path: str) -> bool:
    return all(_SITE_NAME.fullmatch(part) and part not in (".", "..") for part in path.split("/"))


def site_path(url: str) -> str | None:
    """The path in the site of a Data Docs ``file://`` URL made on any worker; None for another URL."""
    found = _SITE_URL.match(url)
    return url[found.end() :] if found else None


def served_page(html: str, prefix: str) -> str:
    """A run's page as the API server serves it: its Data Docs links (``file://`` URLs of the
    worker that wrote it) point at ``<prefix>/data-docs/`` instead."""
    return _SITE_URL.sub(f"{prefix}/data-docs/", html)


def keep_data_docs(store: RunStore, run_id: str, site: Path, pages: list[Path]) -> None:
    """Keep ``pages`` (files in the Data Docs ``site`` that a validation of ``run_id`` built: its
    results, the index) in the run state, and list the run's own (all but the index) with the
    earlier attempts', to go with its page."""
    own = []
    for page in pages:
        path = page.relative_to(site).as_posix()
        _copy(store, page, data_docs_key(path))
        if path != "index.html":
            own.append(path)
    store.state.write(_own_key(run_id), json.dumps(sorted({*_own_pages(store.state, run_id), *own})).encode())


def keep_page(store: RunStore, run_id: str) -> None:
    """Keep the run's page (if one was made) in the run state, then remove the pages of the runs
    before the last ``PAGES_KEPT`` there, and in the worker's home when that is apart."""
    page = html_path(store.settings, run_id)
    if page.is_file():
        _copy(store, page, report_key(page.name))
    prune(store.state)
    if not store.in_home("reports"):
        prune(LocalState(store.settings.home))


def prune(state, kept: int = PAGES_KEPT) -> list[str]:
    """Remove from ``state`` (a run state, or a home as ``LocalState``) the pages, JSON reports
    and plots of every run but the ``kept`` whose were kept last (a group's last committed run
    stays in its own state, ``RunStore.last_committed``); returns the run ids that went."""
    files, folders = state.entries("reports")
    runs = {name: t for name, t in folders.items() if _PLOTS_NAME.fullmatch(name)}
    for key, modified in files:
        name = key.rpartition("/")[2]
        for suffix in (".html", OWN_PAGES, ".json"):
            if name.endswith(suffix):
                run_id = name.removesuffix(suffix)
                runs[run_id] = max(runs.get(run_id, modified), modified)
    gone = sorted(runs, key=lambda run_id: (runs[run_id], run_id), reverse=True)[kept:]
    for run_id in gone:
        for path in _own_pages(state, run_id):
            state.delete(data_docs_key(path))
        state.delete(report_key(f"{run_id}.html"))
        state.delete(_own_key(run_id))
        state.delete(report_key(f"{run_id}.json"))
        state.delete_folder(f"reports/{run_id}")
    return gone


def _copy(store: RunStore, source: Path, key: str) -> None:
    """``source`` at ``key`` in the run state, unless that is ``source`` itself (the state is the home)."""
    if not store.in_home(key):
        store.state.write(key, source.read_bytes())


def _own_key(run_id: str) -> str:
    return f"reports/{run_id}{OWN_PAGES}"


def _own_pages(state, run_id: str) -> list[str]:
    """The site paths of the run's own Data Docs pages kept so far in ``state`` (what is not one
    is left out: the list is only ever written whole, but may have been edited)."""
    try:
        found = json.loads(state.read(_own_key(run_id)) or b"[]")
    except ValueError:
        return []
    return [p for p in found if isinstance(p, str) and _is_site_path(p)] if isinstance(found, list) else []
