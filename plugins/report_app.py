"""The run pages and Great Expectations Data Docs, served by Airflow's API server (a plugin's
FastAPI app at ``/wavepipe``) to users logged in to Airflow: a task's extra links open them
(``wavepipe.plugins.links``). Pages are read from the run state (``state_uri``: a bucket or a
folder; the API server's home only when that is the state), where each run keeps them
(``wavepipe.pages``), so the API server shares no disk with the workers; what the Data Docs load
(styles, scripts, images) comes from the installed packages. Airflow does not authenticate a
plugin's app: every route here asks for the caller's Airflow login itself, and reads only keys
made of names it checked.
"""

# no ``from __future__ import annotations``: FastAPI reads the routes' annotations, made in
# ``build_app``, as objects

from collections.abc import Callable
from pathlib import Path

from wavepipe.offline_docs import asset
from wavepipe.storage import StorageUnavailableError

#: Where the app is mounted under the API server's base URL.
PREFIX = "/wavepipe"
#: A run page shows what producers sent (waveform ids, sources, details: escaped as it is made,
#: ``wavepipe.report_html``); served, it may run no script and load nothing but its own inline
#: styles and images, so a producer's text that escaped the escaping still could not act.
RUN_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
}


def inside(root: Path, relative: str) -> Path:
    """``root/relative`` if it is a file inside ``root`` (no ``..``, no link out), else 404."""
    from fastapi import HTTPException

    path = (root / relative).resolve()
    if not path.is_file() or not path.is_relative_to(root.resolve()):
        raise HTTPException(status_code=404, detail=f"no such file under {root.name}: {relative}")
    return path


def kept(key_of: Callable[[str], str], name: str) -> bytes:
    """What the run state of this server's settings holds at ``key_of(name)``: 404 for a name
    ``key_of`` refuses (ValueError) or nothing there, 503 when the state's store does not answer."""
    from fastapi import HTTPException

    from wavepipe.contracts.config import load_settings
    from wavepipe.run_store import RunStore

    try:
        key = key_of(name)
    except ValueError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    try:
        found = RunStore(load_settings()).state.read(key)
    except StorageUnavailableError as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from None
    if found is None:
        raise HTTPException(status_code=404, detail=f"not in the run state (or no longer kept): {name}")
    return found


def build_app():
    """The app (FastAPI is imported here: the plugin that holds it is loaded by every Airflow
    process, and only the API server serves it)."""
    import mimetypes

    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import FileResponse, HTMLResponse, Response

    from wavepipe import pages

    async def logged_in(request: Request) -> None:
        """The login the API server's own routes ask for (its JWT, as a bearer token or the UI's
        cookie); 401 or 403 without one."""
        from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

        await get_user(request, None, await bearer_scheme(request))

    app = FastAPI(title="wavepipe run pages", dependencies=[Depends(logged_in)])

    @app.get("/reports/{name}")
    def report(name: str):
        found = kept(pages.report_key, name)
        if name.endswith(".json"):
            return Response(found, media_type="application/json")
        return HTMLResponse(pages.served_page(found.decode(), _base() + PREFIX), headers=RUN_PAGE_HEADERS)

    @app.get("/data-docs/{relative:path}")
    def data_docs(relative: str):
        shipped = asset(relative)
        if shipped is not None:
            return FileResponse(inside(*shipped))
        media_type = mimetypes.guess_type(relative)[0] or "application/octet-stream"
        return Response(kept(pages.data_docs_key, relative), media_type=media_type)

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
