"""The run pages and Great Expectations Data Docs, served by Airflow's API server (a plugin's
FastAPI app at ``/wavepipe``) to users logged in to Airflow: a task's extra links open them
(``wavepipe.plugins.links``). Files are served from the API server's wavepipe home (its
``reports`` and Data Docs folders): a home every worker and the API server share, as
``wavepipe airflow up`` and the compose stack have. Airflow does not authenticate a plugin's
app: every route here asks for the caller's Airflow login itself.
"""

# no ``from __future__ import annotations``: FastAPI reads the routes' annotations, made in
# ``build_app``, as objects

import re
from pathlib import Path

#: Where the app is mounted under the API server's base URL.
PREFIX = "/wavepipe"
#: A report file's name: a safe run id, ``.html`` or ``.json``.
_REPORT_NAME = re.compile(r"^[A-Za-z0-9_.+-]+\.(html|json)$")


def data_docs_root(settings) -> Path:
    return settings.gx_dir / "uncommitted" / "data_docs" / "local_site"


def inside(root: Path, relative: str) -> Path:
    """``root/relative`` if it is a file inside ``root`` (no ``..``, no link out), else 404."""
    from fastapi import HTTPException

    path = (root / relative).resolve()
    if not path.is_file() or not path.is_relative_to(root.resolve()):
        raise HTTPException(status_code=404, detail=f"no such file under {root.name}: {relative}")
    return path


def served_page(html: str, docs_root: Path, prefix: str) -> str:
    """A run page as the API server serves it: its Data Docs links (``file://`` on the worker)
    point at the app's Data Docs route."""
    return html.replace(f"file://{docs_root.resolve()}/", f"{prefix}/data-docs/").replace(
        f"file://{docs_root}/", f"{prefix}/data-docs/"
    )


def build_app():
    """The app (FastAPI is imported here: the plugin that holds it is loaded by every Airflow
    process, and only the API server serves it)."""
    from fastapi import Depends, FastAPI, HTTPException, Request
    from fastapi.responses import FileResponse, HTMLResponse

    from wavepipe.contracts.config import load_settings

    async def logged_in(request: Request) -> None:
        """The login the API server's own routes ask for (its JWT, as a bearer token or the UI's
        cookie); 401 or 403 without one."""
        from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

        await get_user(request, None, await bearer_scheme(request))

    app = FastAPI(title="wavepipe run pages", dependencies=[Depends(logged_in)])

    @app.get("/reports/{name}")
    def report(name: str):
        if not _REPORT_NAME.match(name):
            raise HTTPException(status_code=404, detail="not a run report's name")
        settings = load_settings()
        path = inside(settings.reports_dir, name)
        if path.suffix == ".json":
            return FileResponse(path, media_type="application/json")
        return HTMLResponse(served_page(path.read_text(), data_docs_root(settings), _base() + PREFIX))

    @app.get("/data-docs/{relative:path}")
    def data_docs(relative: str):
        return FileResponse(inside(data_docs_root(load_settings()), relative))

    return app


class LazyApps:
    """The plugin's ``fastapi_apps``, made when the API server first asks for them (a class
    attribute read in every process otherwise)."""

    def __init__(self) -> None:
        self._apps: list | None = None

    def __get__(self, obj, owner=None) -> list:
        if self._apps is None:
            self._apps = [{"app": build_app(), "url_prefix": PREFIX, "name": "wavepipe run pages"}]
        return self._apps


def _base() -> str:
    """The API server's base URL path (``[api] base_url``), without a trailing slash."""
    from urllib.parse import urlsplit

    from airflow.configuration import conf

    return urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
